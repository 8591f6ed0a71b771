"""The ``lifecycle`` command line (being written)."""

from __future__ import annotations


def main() -> None:
    """Entry point of the ``lifecycle`` command."""
    raise SystemExit("the lifecycle command line is not available yet")
