"""Lifecycle under ``tf.distribute``: local clusters, a training loop, private networks.

``dispose()`` itself needs nothing from here: under any strategy it releases
every replica, parameter-server variable and shard, and under
``MultiWorkerMirroredStrategy`` it coordinates with the other workers.
"""

from ._cluster import PS_ENV as PS_ENV
from ._cluster import LocalCluster as LocalCluster
from ._cluster import free_ports as free_ports
from ._cluster import run_in_private_network as run_in_private_network
from ._network import enter_private_network as enter_private_network
from ._network import in_private_network as in_private_network
from ._training import train as train

__all__ = [
    "PS_ENV",
    "LocalCluster",
    "enter_private_network",
    "free_ports",
    "in_private_network",
    "run_in_private_network",
    "train",
]
