"""Monitoring: statistics, leak trends, Prometheus metrics and a Keras callback."""

from ._statistics import DeviceMemory as DeviceMemory
from ._statistics import Statistics as Statistics
from ._statistics import statistics as statistics

__all__ = ["DeviceMemory", "Statistics", "statistics"]
