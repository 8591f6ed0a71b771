"""Monitoring: statistics, leak reports and trends, Prometheus metrics, a Keras callback.

``prometheus-client`` (extra ``prometheus``) and ``objgraph`` (extra ``leaks``)
are imported only when their functions are called.
"""

from typing import TYPE_CHECKING

from .._core._lazy import attach

if TYPE_CHECKING:
    from ._callback import LifecycleCallback as LifecycleCallback
    from ._leaks import Leak as Leak
    from ._leaks import LeakReport as LeakReport
    from ._leaks import check_disposed as check_disposed
    from ._leaks import find_leaks as find_leaks
    from ._prometheus import Exporter as Exporter
    from ._prometheus import LifecycleCollector as LifecycleCollector
    from ._prometheus import register_prometheus as register_prometheus
    from ._prometheus import start_exporter as start_exporter
    from ._statistics import DeviceMemory as DeviceMemory
    from ._statistics import Statistics as Statistics
    from ._statistics import statistics as statistics
    from ._trend import LeakTrendMonitor as LeakTrendMonitor
    from ._trend import Trend as Trend

__getattr__, __dir__, __all__ = attach(__name__)
