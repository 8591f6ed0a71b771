"""Tuning: the CPU allocator and the defaults behind sessions and dispose.

The knobs whose trade-offs are measured (``docs/allocator.md``,
``docs/sessions.md``), apart from the everyday names of :mod:`lifecycle`:

- :func:`tune_allocator` and :class:`AllocatorSettings`: glibc's mmap threshold
  and trims;
- :func:`allocator_choice` and :class:`AllocatorChoice`: what
  ``LIFECYCLE_ALLOCATOR`` (or a command's ``--allocator``) chose;
- ``DEFAULT_PRESSURE_THRESHOLD``, ``DEFAULT_TRIM_THRESHOLD``: a session's
  defaults for byte pressure and trims; ``DEFAULT_DISPOSE_TIMEOUT``: how long
  ``dispose()`` waits for calls in flight.

Importing this module imports no TensorFlow; the allocator names never do, so
they can run before anything allocates. The names are also importable from
:mod:`lifecycle` itself, where they used to be.

Example:
    >>> from lifecycle import tuning
    >>> tuning.DEFAULT_TRIM_THRESHOLD
    33554432
"""

import typing as _typing

from ._core._lazy import attach as _attach

if _typing.TYPE_CHECKING:
    from ._core import AllocatorChoice as AllocatorChoice
    from ._core import AllocatorSettings as AllocatorSettings
    from ._core import allocator_choice as allocator_choice
    from ._core import tune_allocator as tune_allocator
    from ._disposal import DEFAULT_DISPOSE_TIMEOUT as DEFAULT_DISPOSE_TIMEOUT
    from ._session import DEFAULT_PRESSURE_THRESHOLD as DEFAULT_PRESSURE_THRESHOLD
    from ._session import DEFAULT_TRIM_THRESHOLD as DEFAULT_TRIM_THRESHOLD

__getattr__, __dir__, __all__ = _attach(__name__)
