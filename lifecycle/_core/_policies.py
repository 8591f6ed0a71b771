"""The registry's policies: how a swap treats memory, which versions of a base path serve.

Pure Python, like the rest of the core: the server's configuration checks and
holds them before TensorFlow is imported (``lifecycle serve`` refuses a bad flag
at once). :mod:`lifecycle._registry` applies them and re-exports them as the
public ``lifecycle.SwapPolicy`` and ``lifecycle.VersionPolicy``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from ._checks import check_int, is_int

__all__ = ["SwapPolicy", "VersionPolicy"]


class SwapPolicy(enum.Enum):
    """What a load does when the new version does not fit next to the old ones."""

    #: Load the new version first, then retire old ones: no gap in serving,
    #: but old and new are resident together. Never evicts a default version.
    AVAILABILITY_PRESERVING = "availability_preserving"
    #: Retire old versions first (the model's default included), then load:
    #: memory never holds both, and requests in the gap wait for the new one.
    RESOURCE_PRESERVING = "resource_preserving"


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
