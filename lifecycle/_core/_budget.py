"""Which versions to evict so that a load fits: the registry's budget policy. Pure Python.

A registry may cap the bytes its versions hold (``memory_budget``) and how many
are loaded at once (``max_loaded``). When a load would break either limit, the
policy evicts ready versions, least recently used first, until it fits, and
never one that is pinned: a label or a route points to it, or it is its model's
default (unless the swap policy retires the loading model's own default first).
If evicting every candidate is not enough, nothing is evicted and the load is
refused.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import attrs

__all__ = ["EvictionPlan", "Resident", "plan_eviction"]


@attrs.frozen
class Resident:
    """What the policy needs to know of one loaded version.

    Attributes:
        key: Identifies the version to the caller, e.g. ``(name, version)``.
        model: The model's name.
        nbytes: Bytes it holds.
        last_used: When a lease last took it (a monotonic clock).
        ready: Routable; versions still loading or already retiring count
            against the limits but cannot be evicted.
        pinned: A label or a route points to it.
        default: It is its model's default version.
    """

    key: Hashable
    model: str
    nbytes: int
    last_used: float
    ready: bool = True
    pinned: bool = False
    default: bool = False


@attrs.frozen
class EvictionPlan:
    """The policy's answer for one load.

    Attributes:
        fits: Whether the load fits after evicting ``victims``.
        victims: Keys of the versions to evict, least recently used first;
            empty when the load fits as things are, or cannot fit at all.
        resident_bytes: Bytes held with the load, before any eviction.
        versions: Versions loaded with the load, before any eviction.
        freeable_bytes: Bytes that evicting every candidate would free.
    """

    fits: bool
    victims: tuple[Hashable, ...]
    resident_bytes: int
    versions: int
    freeable_bytes: int


def plan_eviction(
    residents: Iterable[Resident],
    *,
    model: str,
    incoming_bytes: int,
    incoming_versions: int,
    memory_budget: int | None,
    max_loaded: int | None,
    evict_own_default: bool,
) -> EvictionPlan:
    """Plan the evictions that make room for a load of ``model``.

    Args:
        residents: The versions loaded now.
        model: The name of the model being loaded.
        incoming_bytes: Bytes the load adds.
        incoming_versions: Versions the load adds (0 when the new version is
            already among ``residents``).
        memory_budget: The byte limit, or ``None``.
        max_loaded: The version-count limit, or ``None``.
        evict_own_default: Whether ``model``'s own default may go (the
            resource-preserving swap policy); other models' defaults never do.

    Returns:
        An :class:`EvictionPlan`.
    """
    residents = list(residents)
    held = sum(r.nbytes for r in residents) + incoming_bytes
    count = len(residents) + incoming_versions

    def fits(freed_bytes: int, freed_versions: int) -> bool:
        return (memory_budget is None or held - freed_bytes <= memory_budget) and (
            max_loaded is None or count - freed_versions <= max_loaded
        )

    candidates = sorted(
        (
            r
            for r in residents
            if r.ready
            and not r.pinned
            and (not r.default or (evict_own_default and r.model == model))
        ),
        key=lambda r: r.last_used,
    )
    freeable = sum(r.nbytes for r in candidates)
    if fits(0, 0):
        return EvictionPlan(True, (), held, count, freeable)
    victims: list[Hashable] = []
    freed = 0
    for candidate in candidates:
        victims.append(candidate.key)
        freed += candidate.nbytes
        if fits(freed, len(victims)):
            return EvictionPlan(True, tuple(victims), held, count, freeable)
    return EvictionPlan(False, (), held, count, freeable)
