"""Let freed buffers go back to the operating system (glibc ``mallopt``/``malloc_trim``).

A released model buffer is freed inside the process, but glibc keeps it: its
mmap threshold rises (up to 32 MiB) as large blocks are freed, so the next
large buffers come from the heap, whose free blocks are kept for reuse. A
process that loads and drops models then keeps its highest watermark. A fixed
threshold puts every large buffer in its own mapping, unmapped when freed, and
``malloc_trim(0)`` hands free heap pages back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading

import attrs

from ._checks import check_optional_int

__all__ = ["AllocatorSettings", "trim", "trimming", "tune_allocator"]

_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_settings: AllocatorSettings | None = None
# Set by the ``system`` allocator choice (``_allocator.py``): freed blocks stay
# in the heap until trimmed, so every collection ends with a trim.
_trim_always = False


@attrs.frozen
class AllocatorSettings:
    """What :func:`tune_allocator` changed.

    Attributes:
        supported: Whether the process's allocator is glibc's (Linux); if not,
            nothing was changed.
        mmap_threshold: The fixed mmap threshold in bytes, or ``None`` if left
            as it was.
        trim_after_collect: Whether cleaners return free heap memory to the
            system after each collection.
    """

    supported: bool
    mmap_threshold: int | None
    trim_after_collect: bool


@functools.cache
def libc() -> ctypes.CDLL | None:
    """glibc, or ``None`` where the process's allocator is not glibc's."""
    # Cached: find_library runs ``ldconfig -p`` in a subprocess.
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        glibc = ctypes.CDLL(name)
        glibc.mallopt  # noqa: B018 - glibc only
        glibc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return glibc


def tune_allocator(
    *, mmap_threshold: int | None = 64 * 1024, trim_after_collect: bool = True
) -> AllocatorSettings:
    """Make the process give freed model memory back to the operating system.

    Process-wide; call it once, early (before the first models load). Under
    glibc (Linux) it fixes the mmap threshold, so buffers above it are mapped
    on their own and unmapped when released, and makes every cleaner's
    collection end with ``malloc_trim(0)``, also in sessions created with
    ``trim_threshold=None``. Elsewhere it changes nothing. (Without it,
    cleaners already trim after every ``trim_threshold`` bytes released: a
    trim changes no setting; the mmap threshold does, for the whole process.)

    With oneDNN off, it brings a process's RSS after many model swaps back
    close to its one-model RSS (``benchmarks/hot_swap.py``,
    ``docs/benchmarks.md#hot-swap-benchmarkshot_swappy``). Set
    ``TF_ENABLE_ONEDNN_OPTS=0`` before TensorFlow is imported: oneDNN's CPU
    allocator keeps freed blocks for reuse whatever glibc does, so with it on
    the same benchmark gains next to nothing. Do not combine it with
    ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``: every block then gets a mapping of
    its own, made and zeroed on every step, which slows training steps
    (``docs/benchmarks.md#allocator-settings-benchmarksallocatorpy``);
    ``LIFECYCLE_ALLOCATOR=system`` is the setting for that
    (``docs/allocator.md``).

    Args:
        mmap_threshold: Bytes from which an allocation gets its own mapping;
            ``None`` leaves glibc's adaptive threshold alone.
        trim_after_collect: Run ``malloc_trim(0)`` after each collection a
            cleaner runs.

    Returns:
        The :class:`AllocatorSettings` now in effect.

    Raises:
        ValueError: ``mmap_threshold`` is not a positive int or ``None``.

    Example:
        >>> import lifecycle as lc
        >>> lc.tuning.tune_allocator().mmap_threshold  # doctest: +SKIP
        65536
    """
    global _settings
    check_optional_int(mmap_threshold, "mmap_threshold", minimum=1)
    glibc = libc()
    with _lock:
        if glibc is None:
            _settings = AllocatorSettings(False, None, False)
            return _settings
        if mmap_threshold is not None and glibc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold) != 1:
            raise ValueError(f"glibc refused mmap_threshold={mmap_threshold}")
        _settings = AllocatorSettings(True, mmap_threshold, bool(trim_after_collect))
        return _settings


def trim_after_collections() -> None:
    """Make every cleaner's collection end with a trim, whatever its settings."""
    global _trim_always
    _trim_always = True


def trimming() -> bool:
    """Whether cleaners should trim after collecting."""
    settings = _settings
    return _trim_always or (settings is not None and settings.trim_after_collect)


def trim() -> bool:
    """Return free heap memory to the system now (glibc); whether any was returned."""
    glibc = libc()
    return bool(glibc is not None and glibc.malloc_trim(0))
