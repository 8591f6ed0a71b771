"""Local ``tf.distribute`` clusters and private networks, for the distributed tests.

The library keeps them private (``lifecycle/distribute/_cluster.py`` and
``_network.py``, not exported: they are the harness of these tests and of the
parameter-server example, not an API); test modules import them from here.
"""

from __future__ import annotations

from lifecycle.distribute import _cluster, _network
from lifecycle.distribute._cluster import PS_ENV, LocalCluster, free_ports, run_in_private_network
from lifecycle.distribute._network import (
    enter_private_network,
    in_private_network,
    launcher_command,
)

__all__ = [
    "PS_ENV",
    "LocalCluster",
    "_cluster",
    "_network",
    "enter_private_network",
    "free_ports",
    "in_private_network",
    "launcher_command",
    "run_in_private_network",
]
