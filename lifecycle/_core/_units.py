"""Units of memory, spelled once."""

from __future__ import annotations

__all__ = ["MiB"]

#: Bytes in a mebibyte: every "MiB" the library prints is this.
MiB = 2**20
