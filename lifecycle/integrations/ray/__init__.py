"""Ray: multiplexed serving and tuning trials that give memory back on every node.

Needs Ray (extra ``ray``: ``pip install "keras-lifecycle[ray]"``). Ray is
imported when a name is first used, never by ``import lifecycle``:

* Ray Serve — :func:`multiplexed`, a drop-in for ``ray.serve.multiplexed``
  backed by a per-replica :class:`~lifecycle.ModelRegistry`: an evicted model
  is handed out no more, the requests that obtained it finish on it, and it is
  disposed once none holds it; eviction may also follow a memory budget in
  bytes. :func:`multiplexed_statistics` and Ray metrics report each replica.
* Ray Tune — :func:`managed_trainable` for function trainables and the
  :class:`ManagedTrainable` mixin for class trainables: every Keras model a
  trial builds is managed and disposed when the trial ends, whether it
  finishes, fails or is stopped early, with or without ``reuse_actors``.
  :func:`worker_statistics` reports the worker process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._serve import MultiplexStatistics as MultiplexStatistics
    from ._serve import multiplexed as multiplexed
    from ._serve import multiplexed_statistics as multiplexed_statistics
    from ._tune import ManagedTrainable as ManagedTrainable
    from ._tune import WorkerStatistics as WorkerStatistics
    from ._tune import managed_trainable as managed_trainable
    from ._tune import worker_statistics as worker_statistics

# Public name -> the module (under this package) that defines it.
_MODULES = {
    "MultiplexStatistics": "_serve",
    "multiplexed": "_serve",
    "multiplexed_statistics": "_serve",
    "ManagedTrainable": "_tune",
    "WorkerStatistics": "_tune",
    "managed_trainable": "_tune",
    "worker_statistics": "_tune",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
