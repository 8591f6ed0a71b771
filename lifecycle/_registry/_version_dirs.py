"""Version directories under a base path (TensorFlow Serving's layout), and which to serve.

The layout is TensorFlow Serving's: ``<base>/<version>/`` holds the checkpoints
of one version, ``<version>`` a non-negative integer. A version counts once its
directory has a complete checkpoint (a ``checkpoint`` state file naming one),
so a save still in progress is never loaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import attrs
import tensorflow as tf

from .._core import check_int, is_int
from ..errors import CheckpointError

__all__ = ["VersionPolicy", "available_versions"]


@attrs.frozen
class VersionPolicy:
    """Which versions under a base path to serve (TensorFlow Serving's version policy).

    Build one with :meth:`latest`, :meth:`all` or :meth:`specific`.

    Attributes:
        kind: ``"latest"``, ``"all"`` or ``"specific"``.
        count: How many of the newest versions ``latest`` serves.
        versions: The versions ``specific`` serves.
    """

    kind: str
    count: int = 1
    versions: frozenset[int] = frozenset()

    @classmethod
    def latest(cls, n: int = 1) -> VersionPolicy:
        """Serve the ``n`` highest version numbers present."""
        return cls(kind="latest", count=check_int(n, "n", minimum=1))

    @classmethod
    def all(cls) -> VersionPolicy:
        """Serve every version present."""
        return cls(kind="all")

    @classmethod
    def specific(cls, versions: Iterable[int]) -> VersionPolicy:
        """Serve exactly these versions, as they appear."""
        chosen = frozenset(versions)
        if not chosen or any(not is_int(v) or v < 0 for v in chosen):
            raise ValueError(
                "`versions` must be a non-empty collection of ints >= 0. "
                f"Received: {sorted(chosen, key=repr)!r}"
            )
        return cls(kind="specific", versions=chosen)

    def select(self, available: Iterable[int]) -> frozenset[int]:
        """The versions of ``available`` this policy serves."""
        present = sorted(set(available))
        if self.kind == "latest":
            return frozenset(present[-self.count :])
        if self.kind == "all":
            return frozenset(present)
        return frozenset(v for v in present if v in self.versions)


def available_versions(base: str) -> list[int]:
    """Version numbers under ``base`` with a complete checkpoint, ascending.

    Raises:
        CheckpointError: ``base`` is not a directory.
    """
    if not os.path.isdir(base):
        raise CheckpointError(
            f"Base path {base!r} does not exist or is not a directory; expected "
            "<base>/<version>/ directories of checkpoints.",
            path=base,
        )
    found = []
    for entry in os.scandir(base):
        if (
            entry.is_dir()
            and entry.name.isdigit()
            and tf.train.latest_checkpoint(entry.path) is not None
        ):
            found.append(int(entry.name))
    return sorted(found)
