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

from typing import TYPE_CHECKING

from ..._core._lazy import attach

if TYPE_CHECKING:
    from ._serve import MultiplexStatistics as MultiplexStatistics
    from ._serve import multiplexed as multiplexed
    from ._serve import multiplexed_statistics as multiplexed_statistics
    from ._tune import ManagedTrainable as ManagedTrainable
    from ._tune import WorkerStatistics as WorkerStatistics
    from ._tune import managed_trainable as managed_trainable
    from ._tune import worker_statistics as worker_statistics

__getattr__, __dir__, __all__ = attach(__name__)
