"""Lifecycle under ``tf.distribute``: a training loop that ``dispose()`` can wait for.

``dispose()`` itself needs nothing from here: under any strategy it releases
every replica, parameter-server variable and shard, and under
``MultiWorkerMirroredStrategy`` it coordinates with the other workers.

The local clusters and private networks the tests and the parameter-server
example run in (``_cluster``, ``_network``) are not part of the API.
"""

from typing import TYPE_CHECKING

from .._core._lazy import attach

if TYPE_CHECKING:
    from ._training import train as train

__getattr__, __dir__, __all__ = attach(__name__)
