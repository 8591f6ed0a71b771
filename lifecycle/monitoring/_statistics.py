"""Process-wide statistics: frozen snapshots of what the library manages."""

from __future__ import annotations

import attrs

from .. import _tf
from .._core import KERNEL_CACHE, LIVE_MODELS, PROCESS, all_cleaners

__all__ = ["DeviceMemory", "Statistics", "statistics"]


@attrs.frozen
class DeviceMemory:
    """What TensorFlow reports for one accelerator.

    Attributes:
        device: The logical device name, e.g. ``/device:GPU:0``.
        current_bytes: Bytes allocated on it now.
        peak_bytes: The most bytes allocated on it so far.
    """

    device: str
    current_bytes: int
    peak_bytes: int


@attrs.frozen
class Statistics:
    """A snapshot of the whole process (see :func:`statistics`).

    Counters (``models_*``, ``bytes_released``, ``collections``,
    ``collection_seconds``, ``blocking_seconds``, ``trims``, ``trim_seconds``,
    ``kernel_cache_clears``) and ``max_collection_seconds`` only grow; the
    others are levels.

    Attributes:
        live_models: Managed models neither disposed nor cleaned up.
        models_managed: Models put under management so far.
        models_disposed: Models released by ``dispose()`` or a closing session.
        models_cleaned: Models dropped without ``dispose()`` and cleaned up.
        bytes_owned: Buffer bytes held by live managed models.
        bytes_released: Buffer bytes released so far.
        gradient_registry_entries: ``CustomGradient`` entries in TensorFlow's
            gradient registry (each pins a traced graph and what it captured).
        live_traced_graphs: Traced graphs (``FuncGraph``) alive; ``None`` when
            not counted (it walks the heap).
        collections: Garbage collections run by cleaners.
        collection_seconds: Time spent in them.
        max_collection_seconds: The longest of them: the longest pause a
            cleaner's collection imposed on every other thread.
        blocking_seconds: Time the library's own work held the interpreter
            lock off the caller's thread, so that no other thread could run
            Python: cleaners' collections whole, and the CPU time of their
            deferred tasks (an upper bound).
        trims: Times cleaners handed the C heap's free memory back to the
            system (``malloc_trim(0)``).
        trim_seconds: Time spent in those trims.
        kernel_cache_clears: Times TensorFlow's eager kernel cache was cleared
            (process-wide; once managed models released 32 buffers since the
            last clear).
        cleaner_queue: Cleanup tasks waiting, in every cleaner.
        rss_bytes: Resident set size of the process (``None`` where unknown).
        device_memory: Per-GPU allocation, where TensorFlow reports it.
        cpu_allocator: TensorFlow's CPU allocator: ``"onednn-pool"`` (oneDNN
            on, its allocator keeping freed blocks of 4 KiB or more for reuse,
            never for the system), ``"onednn-system"`` (oneDNN on, blocks from
            malloc: ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``, as with
            ``LIFECYCLE_ALLOCATOR=system``) or ``"tensorflow"`` (oneDNN off).
        cpu_pooled_bytes: Bytes freed into oneDNN's pool and held there, not
            returned to the system: at least the CPU allocator's peak use less
            its use now (the pool may hold up to about twice that: its regions
            grow by doubling). 0 without the pool; ``None`` where TensorFlow does not
            report the CPU allocator's use.
    """

    live_models: int
    models_managed: int
    models_disposed: int
    models_cleaned: int
    bytes_owned: int
    bytes_released: int
    gradient_registry_entries: int
    live_traced_graphs: int | None
    collections: int
    collection_seconds: float
    max_collection_seconds: float
    blocking_seconds: float
    trims: int
    trim_seconds: float
    kernel_cache_clears: int
    cleaner_queue: int
    rss_bytes: int | None
    device_memory: tuple[DeviceMemory, ...]
    cpu_allocator: str = "tensorflow"
    cpu_pooled_bytes: int | None = 0


def statistics(*, count_graphs: bool = True) -> Statistics:
    """A frozen snapshot of the process: models, bytes, graphs, collections, memory.

    Args:
        count_graphs: Count live traced graphs. It walks every object the
            garbage collector tracks (tens of milliseconds in a large process);
            turn it off for frequent sampling.

    Returns:
        A :class:`Statistics`.

    Raises:
        CompatibilityError: A TensorFlow/Keras internal the library relies on
            has moved (the self-check runs once per process).

    Example:
        >>> import lifecycle as lc
        >>> lc.statistics().live_models >= 0
        True
    """
    _tf.check_compatibility()
    totals = PROCESS.snapshot()
    return Statistics(
        live_models=LIVE_MODELS.value,
        models_managed=int(totals.get("models_managed", 0)),
        models_disposed=int(totals.get("models_disposed", 0)),
        models_cleaned=int(totals.get("models_cleaned", 0)),
        bytes_owned=int(totals.get("bytes_owned", 0)),
        bytes_released=int(totals.get("bytes_released", 0)),
        gradient_registry_entries=_tf.custom_gradient_entries(),
        live_traced_graphs=_tf.live_func_graphs() if count_graphs else None,
        collections=int(totals.get("collections", 0)),
        collection_seconds=float(totals.get("collection_seconds", 0.0)),
        max_collection_seconds=float(totals.get("max_collection_seconds", 0.0)),
        blocking_seconds=float(totals.get("blocking_seconds", 0.0)),
        trims=int(totals.get("trims", 0)),
        trim_seconds=float(totals.get("trim_seconds", 0.0)),
        kernel_cache_clears=KERNEL_CACHE.statistics().clears,
        cleaner_queue=sum(cleaner.statistics().queued for cleaner in all_cleaners()),
        rss_bytes=_tf.memory.rss_bytes(),
        device_memory=tuple(DeviceMemory(*entry) for entry in _tf.memory.device_memory()),
        cpu_allocator=_tf.memory.cpu_allocator(),
        cpu_pooled_bytes=_tf.memory.cpu_pooled_bytes(),
    )
