"""Version directories under a base path, and which of them to serve.

The layout is TensorFlow Serving's: ``<base>/<version>/`` holds the checkpoints
of one version, ``<version>`` a non-negative integer. A version counts once its
directory has a complete checkpoint (a ``checkpoint`` state file naming one),
so a save still in progress is never loaded.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import keras
import tensorflow as tf

from .errors import CheckpointError

__all__ = ["ScanReport", "VersionPolicy", "available_versions"]


def _check_count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"`n` must be an int >= 1. Received: n={count!r}")
    return count


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
        return cls(kind="latest", count=_check_count(n))

    @classmethod
    def all(cls) -> VersionPolicy:
        """Serve every version present."""
        return cls(kind="all")

    @classmethod
    def specific(cls, versions: Iterable[int]) -> VersionPolicy:
        """Serve exactly these versions, as they appear."""
        chosen = frozenset(versions)
        if not chosen or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in chosen
        ):
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


@attrs.frozen
class ScanReport:
    """What one scan of a watched base path did.

    Attributes:
        name: The model's name.
        available: Versions with a complete checkpoint, ascending.
        wanted: Versions the policy serves, ascending.
        loaded: Versions loaded by this scan.
        retired: Versions retired by this scan (they drain, then go).
        failed: ``(version, error message)`` for versions that did not load;
            the next scan tries them again.
        default: The model's default version after the scan.
    """

    name: str
    available: tuple[int, ...]
    wanted: tuple[int, ...]
    loaded: tuple[int, ...]
    retired: tuple[int, ...]
    failed: tuple[tuple[int, str], ...]
    default: int | None


@attrs.define(eq=False)
class Source:
    """A watched base path of one model name."""

    base: str
    factory: Callable[[], keras.Model]
    policy: VersionPolicy
    warmup: Any
    strict: bool
    poll_interval: float | None = None
    # Versions this source loaded and still serves.
    served: set[int] = attrs.field(factory=set)
    last: ScanReport | None = None
    last_error: str | None = None
    stop: threading.Event = attrs.field(factory=threading.Event)
    thread: threading.Thread | None = None

    def halt(self) -> None:
        """Stop the polling thread, if any, and wait for its scan in progress."""
        self.stop.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


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
