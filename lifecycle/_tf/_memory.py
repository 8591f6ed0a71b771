"""Memory probes: the process's resident set and what TensorFlow reports per device."""

from __future__ import annotations

import functools
import os

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.util import _pywrap_util_port

from . import _release

__all__ = [
    "CPU_ALLOCATORS",
    "clear_kernel_cache",
    "cpu_allocator",
    "cpu_pooled_bytes",
    "device_memory",
    "rss_bytes",
    "tensorflow_allocated",
]


def tensorflow_allocated() -> bool:
    """Whether TensorFlow may have allocated CPU memory: its eager context is initialized.

    Until then it has not read ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR`` (read at its
    first allocation). Checking does not initialize the context.
    """
    return context.context()._context_handle is not None


# What TensorFlow's CPU allocator is, as ``cpu_allocator()`` names it.
CPU_ALLOCATORS = ("onednn-pool", "onednn-system", "tensorflow")


@functools.cache
def cpu_allocator() -> str:
    """Which CPU allocator TensorFlow runs with in this process.

    ``onednn-pool``: oneDNN on, its allocator pooling freed blocks of 4 KiB or
    more (never given back); ``onednn-system``: oneDNN on, with
    ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR`` true (every block from malloc);
    ``tensorflow``: oneDNN off, TensorFlow's own allocator over malloc. Both
    settings are read once by TensorFlow, as here.
    """
    if not _pywrap_util_port.IsMklEnabled():
        return "tensorflow"
    # Parsed as TensorFlow's ReadBoolFromEnvVar does: "1" or "true", any case.
    setting = os.environ.get("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "").strip().lower()
    return "onednn-system" if setting in ("1", "true") else "onednn-pool"


def cpu_pooled_bytes() -> int | None:
    """Bytes freed into oneDNN's CPU pool and kept by it (at least), or ``None``.

    The pool's regions grow to the largest working set and never shrink, so it
    holds at least the peak bytes allocated less the bytes in use now: up to
    about twice that, its regions growing by doubling (less if the peak was
    reset with ``tf.config.experimental.reset_memory_stats``). 0 when there is
    no pool;
    ``None`` when TensorFlow does not report the CPU allocator's use.
    """
    if cpu_allocator() != "onednn-pool":
        return 0
    try:
        info = tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, tf.errors.OpError):
        return None
    return max(0, int(info["peak"]) - int(info["current"]))


def clear_kernel_cache() -> None:
    """Drop TensorFlow's cache of eager kernels (safe while other threads run ops).

    The cache keeps a kernel per op and per traced function it ran, including
    those of disposed models, freed only by this (or ``clear_session``; the
    sizes are in ``docs/sessions.md#byte-pressure``). A kernel in use stays
    alive until its op returns; the next run of each op or function
    re-creates its kernel.
    """
    context.context().clear_kernel_cache()
    _release.forget_release_kernels()


def rss_bytes() -> int | None:
    """Resident set size of this process in bytes, or ``None`` where unknown."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.Process().memory_info().rss)
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def device_memory() -> list[tuple[str, int, int]]:
    """``(device, current bytes, peak bytes)`` for each GPU TensorFlow can report on."""
    found = []
    for device in tf.config.list_logical_devices("GPU"):
        try:
            info = tf.config.experimental.get_memory_info(device.name)
        except (ValueError, tf.errors.OpError):
            continue
        found.append((device.name, int(info["current"]), int(info["peak"])))
    return found
