"""The registry's values: version states, status and statistics snapshots."""

from __future__ import annotations

import enum

import attrs

from .._core._batcher import BatchingStatistics
from .._session import SessionStatistics

__all__ = ["RegistryStatistics", "VersionState", "VersionStatus"]


class VersionState(enum.Enum):
    """Where a loaded version is in its life."""

    #: Being built and warmed up; not routable.
    LOADING = "loading"
    #: Routable.
    READY = "ready"
    #: Unloaded: refuses new leases, disposed when its last lease returns.
    RETIRING = "retiring"
    #: Disposed.
    UNLOADED = "unloaded"


@attrs.frozen
class VersionStatus:
    """A snapshot of one loaded version.

    Attributes:
        name: The model's name.
        version: The version number.
        state: ``LOADING``, ``READY``, ``RETIRING`` or ``UNLOADED``.
        default: Whether unrouted requests go to it.
        labels: Labels pointing to it, sorted.
        weight: Its share of the model's routed traffic (0 to 1), or ``None``
            when the model has no route.
        leases: Leases held right now.
        bytes: Bytes of its buffers.
        load_seconds: Time its load took (build and warm-up).
        requests: Leases taken (requests served) so far.
        batching: What batching did for this version (batch sizes, queue
            wait), or ``None`` when it serves one call per request.
    """

    name: str
    version: int
    state: VersionState
    default: bool
    labels: tuple[str, ...]
    weight: float | None
    leases: int
    bytes: int
    load_seconds: float
    requests: int
    batching: BatchingStatistics | None = None


@attrs.frozen
class RegistryStatistics:
    """A snapshot of a whole registry (``registry.statistics()``).

    Attributes:
        name: The registry's name.
        models: Model names with a loaded or loading version.
        versions: Versions loaded (ready or retiring).
        loading: Versions being loaded.
        bytes: Bytes the loaded versions hold.
        memory_budget: The budget, or ``None``.
        leases: Leases held right now.
        requests: Requests served by the loaded versions so far.
        watched: Base paths watched.
        load_pauses: Times background loads paused for requests in flight
            (``loader_gil_share``); 0 when loads run on the calling thread.
        session: The registry's own session (its children are the versions).
        foreground_loads: Loads that ran in the foreground although the
            registry loads in the background, their versions being small
            (``loader_foreground_bytes``).
    """

    name: str
    models: int
    versions: int
    loading: int
    bytes: int
    memory_budget: int | None
    leases: int
    requests: int
    watched: int
    load_pauses: int
    session: SessionStatistics
    foreground_loads: int = 0
