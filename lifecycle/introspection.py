"""Introspection: the self-check and the statistics of single objects.

What the library reports about itself beyond the everyday names of
:mod:`lifecycle` (``lc.statistics()``, ``model.dispose()``'s report,
``lc.find_leaks()``):

- :func:`check_compatibility` and :class:`CompatibilityReport`: every
  TensorFlow/Keras internal the library relies on, exercised once;
- the frozen values that ``statistics()`` methods return, for annotations:
  :class:`ModelStatistics` (a model's), :class:`SessionStatistics` and
  :class:`CleanerStatistics` (a session's and its cleaner's),
  :class:`RegistryStatistics` and :class:`BatchingStatistics` (a registry's and
  a version's batcher's);
- :class:`DeviceRelease`: one device's share of a ``DisposeReport``.

The names are also importable from :mod:`lifecycle` itself, where they used
to be; each is imported on first use.

Example:
    >>> from lifecycle import introspection
    >>> introspection.check_compatibility().tensorflow  # doctest: +SKIP
    '2.21.0'
"""

import typing as _typing

from ._core._lazy import attach as _attach

if _typing.TYPE_CHECKING:
    from ._core import CleanerStatistics as CleanerStatistics
    from ._disposal import DeviceRelease as DeviceRelease
    from ._model import ModelStatistics as ModelStatistics
    from ._registry import BatchingStatistics as BatchingStatistics
    from ._registry import RegistryStatistics as RegistryStatistics
    from ._session import SessionStatistics as SessionStatistics
    from ._tf import CompatibilityReport as CompatibilityReport
    from ._tf import check_compatibility as check_compatibility

__getattr__, __dir__, __all__ = _attach(__name__)
