"""Which CPU allocator TensorFlow uses: oneDNN's pool, or memory that goes back.

With oneDNN on (TensorFlow's default on x86 CPUs with AVX-512 VNNI, BF16 or
AMX), TensorFlow's CPU allocator keeps every freed block of 4 KiB or more in a
pool that grows to the largest working set and never shrinks: a disposed
model's bytes stay with the process. TensorFlow reads the settings that avoid
the pool once: ``TF_ENABLE_ONEDNN_OPTS`` when it is imported,
``TF_ONEDNN_USE_SYSTEM_ALLOCATOR`` at its first CPU allocation. So the choice
is made from the environment, read by ``import lifecycle`` before anything of
the library can import TensorFlow::

    LIFECYCLE_ALLOCATOR=system python train.py

The choices (``docs/allocator.md`` has the measurements):

- ``tensorflow``: change nothing (oneDNN's pool where oneDNN is on).
- ``system``: oneDNN's kernels, every block from glibc's malloc
  (``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``), with glibc kept from mapping and
  unmapping large blocks on every step (one arena, no per-block mappings, a
  1 GiB trim threshold); cleaners hand the freed heap back (``malloc_trim``)
  after releases and collections.
- ``no-onednn``: neither oneDNN's kernels nor its allocator
  (``TF_ENABLE_ONEDNN_OPTS=0``).

A variable the user set is never overridden: a user's
``TF_ONEDNN_USE_SYSTEM_ALLOCATOR`` or ``TF_ENABLE_ONEDNN_OPTS`` keeps
TensorFlow's part as the user set it, and a user's ``MALLOC_*`` or
``GLIBC_TUNABLES`` keeps glibc's.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

import attrs

__all__ = [
    "ALLOCATORS",
    "ENVIRONMENT_VARIABLE",
    "AllocatorChoice",
    "apply_from_environment",
    "current_choice",
    "use_allocator",
]

ENVIRONMENT_VARIABLE = "LIFECYCLE_ALLOCATOR"
# What each choice asks TensorFlow for, read once when it starts.
_TENSORFLOW_SETTINGS: dict[str, dict[str, str]] = {
    "tensorflow": {},
    "system": {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"},
    "no-onednn": {"TF_ENABLE_ONEDNN_OPTS": "0"},
}
ALLOCATORS = tuple(_TENSORFLOW_SETTINGS)
_TENSORFLOW_VARIABLES = ("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "TF_ENABLE_ONEDNN_OPTS")
# glibc's mallopt parameters (malloc.h) and the values of the system choice:
# one arena, so a thread's freed blocks are not lost to a heap unmapped when it
# empties; no per-block mappings, so large blocks are reused rather than mapped
# and zeroed afresh on every step; top-of-heap trims only past 1 GiB. Freed
# memory goes back through malloc_trim, run by cleaners.
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
GLIBC_SETTINGS = (("arena_max", _M_ARENA_MAX, 1), ("mmap_max", _M_MMAP_MAX, 0))
GLIBC_SETTINGS += (("trim_threshold", _M_TRIM_THRESHOLD, 1 << 30),)
_GLIBC_VARIABLES = (
    "GLIBC_TUNABLES",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_MAX_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
)

_lock = threading.Lock()
_choice: AllocatorChoice | None = None


@attrs.frozen
class AllocatorChoice:
    """The CPU allocator settings a process asked for, and what took effect.

    Attributes:
        name: The choice: ``"tensorflow"``, ``"system"`` or ``"no-onednn"``.
        applied: Whether the choice was made before TensorFlow was imported,
            so that TensorFlow reads it.
        tensorflow_settings: The environment variables set for TensorFlow.
        glibc_settings: The glibc ``mallopt`` parameters set, by name.
        kept: Variables the user had set, left as they were, by name.
        reason: Why nothing (or only part) was applied; empty when all was.
    """

    name: str
    applied: bool
    tensorflow_settings: tuple[tuple[str, str], ...] = ()
    glibc_settings: tuple[tuple[str, int], ...] = ()
    kept: tuple[str, ...] = ()
    reason: str = ""


def check_allocator(name: object) -> str:
    """``name`` if it is a known choice; ValueError naming the choices otherwise."""
    if not isinstance(name, str) or name not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}; got {name!r}")
    return name


def use_allocator(
    name: str,
    *,
    environ: dict[str, str] | None = None,
    tensorflow_allocated: Callable[[], bool] | None = None,
) -> AllocatorChoice:
    """Choose the CPU allocator TensorFlow will use in this process.

    Takes effect before TensorFlow is imported; ``system`` also after the
    import, as long as TensorFlow has not allocated (``import keras`` before
    ``import lifecycle`` leaves it time). Otherwise nothing is changed and the
    returned choice says so (``applied`` false, with the reason). Never
    overrides a variable the user set. Called by ``import lifecycle`` with
    ``LIFECYCLE_ALLOCATOR``, and by the ``lifecycle`` commands with
    ``--allocator``.

    Args:
        name: ``"tensorflow"``, ``"system"`` or ``"no-onednn"``.
        environ: The environment to update; ``os.environ`` by default.
        tensorflow_allocated: Whether TensorFlow, already imported, may have
            allocated CPU memory (``None``: assume it has).

    Returns:
        The :class:`AllocatorChoice` now in effect.

    Raises:
        ValueError: ``name`` is not one of the choices.
    """
    global _choice
    check_allocator(name)
    environ = os.environ if environ is None else environ
    with _lock:
        reason = _too_late(name, tensorflow_allocated)
        if reason:
            _choice = AllocatorChoice(name, applied=False, reason=reason)
            return _choice
        if _choice is not None:  # what an earlier choice set is not the user's
            for variable, _ in _choice.tensorflow_settings:
                environ.pop(variable, None)
        wanted = _TENSORFLOW_SETTINGS[name]
        kept = tuple(variable for variable in _TENSORFLOW_VARIABLES if variable in environ)
        tensorflow_settings = () if kept else tuple(wanted.items())
        environ.update(dict(tensorflow_settings))
        glibc: tuple[tuple[str, int], ...] = ()
        if name == "system":
            user_glibc = tuple(variable for variable in _GLIBC_VARIABLES if variable in environ)
            kept += user_glibc
            if not user_glibc:
                glibc = _set_glibc()
        reason = f"kept the user's {', '.join(kept)}" if kept else ""
        _choice = AllocatorChoice(name, True, tensorflow_settings, glibc, kept, reason)
        return _choice


def _too_late(name: str, tensorflow_allocated: Callable[[], bool] | None) -> str:
    """Why ``name`` can no longer take effect, or ``""``."""
    if "tensorflow" not in sys.modules or name == "tensorflow":
        return ""
    if name == "no-onednn":
        return "TensorFlow was already imported: it reads TF_ENABLE_ONEDNN_OPTS when imported"
    if tensorflow_allocated is None or tensorflow_allocated():
        return (
            "TensorFlow has allocated already: it reads TF_ONEDNN_USE_SYSTEM_ALLOCATOR at its "
            "first allocation; import lifecycle first"
        )
    return ""


def _set_glibc() -> tuple[tuple[str, int], ...]:
    # Imported here: the command line loads this module on its own, to read
    # the choices without importing the library (and TensorFlow).
    from . import _malloc

    libc = _malloc.libc()
    if libc is None:
        return ()
    done = tuple(
        (label, value) for label, option, value in GLIBC_SETTINGS if libc.mallopt(option, value)
    )
    # Freed blocks now stay in the heap until trimmed: cleaners trim after
    # every collection, as well as after trim_threshold bytes released.
    _malloc.trim_after_collections()
    return done


def apply_from_environment(
    environ: dict[str, str] | None = None,
    *,
    tensorflow_allocated: Callable[[], bool] | None = None,
) -> AllocatorChoice | None:
    """Apply ``LIFECYCLE_ALLOCATOR`` if set (by ``import lifecycle``, first thing).

    Args:
        environ: The environment; ``os.environ`` by default.
        tensorflow_allocated: As for :func:`use_allocator`.

    Returns:
        The choice made, or ``None`` when the variable is not set.

    Raises:
        ValueError: The variable names no known choice.
    """
    environ = os.environ if environ is None else environ
    name = environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not name:
        return None
    try:
        check_allocator(name)
    except ValueError as error:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: {error}") from None
    return use_allocator(name, environ=environ, tensorflow_allocated=tensorflow_allocated)


def current_choice() -> AllocatorChoice | None:
    """The CPU allocator choice made in this process, or ``None`` if none was.

    A choice is made by ``LIFECYCLE_ALLOCATOR`` (read by ``import lifecycle``)
    or by a ``lifecycle`` command's ``--allocator``. What TensorFlow runs with
    in the end is ``lc.statistics().cpu_allocator``.

    Returns:
        The :class:`AllocatorChoice`, or ``None``.

    Example:
        >>> import lifecycle as lc
        >>> choice = lc.tuning.allocator_choice()
        >>> choice is None or choice.name in ("tensorflow", "system", "no-onednn")
        True
    """
    return _choice
