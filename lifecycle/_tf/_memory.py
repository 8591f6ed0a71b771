"""Memory probes: the process's resident set and what TensorFlow reports per device."""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow.python.eager import context

from . import _release

__all__ = ["clear_kernel_cache", "device_memory", "rss_bytes"]


def clear_kernel_cache() -> None:
    """Drop TensorFlow's cache of eager kernels (safe while other threads run ops).

    The cache keeps a kernel per op and per traced function it ran, including
    those of disposed models: about 0.1-0.7 MiB each, freed only by this (or
    ``clear_session``). A kernel in use stays alive until its op returns; the
    next run of each op or function re-creates its kernel (milliseconds).
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
