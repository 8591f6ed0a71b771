"""The numbers of the benchmarks: medians and ranges, percentiles, slopes, collections.

One helper each, used by the harness's report and by the scripts' measurements.
"""

from __future__ import annotations

import gc
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """The median of a few measurements and their range."""

    median: float
    low: float
    high: float
    count: int


def spread_of(values: Iterable[float | None]) -> Spread | None:
    """The median and range of ``values`` that are neither None nor NaN; None if none are."""
    found = [v for v in values if v is not None and not math.isnan(v)]
    if not found:
        return None
    return Spread(statistics.median(found), min(found), max(found), len(found))


def percentiles(values: Sequence[float], *points: float) -> list[float | None]:
    """The ``points`` percentiles (0-100) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    if not ordered:
        return [None for _ in points]
    found = []
    for point in points:
        at = (len(ordered) - 1) * point / 100
        low = math.floor(at)
        high = min(low + 1, len(ordered) - 1)
        found.append(ordered[low] + (ordered[high] - ordered[low]) * (at - low))
    return found


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """A cell: ``value`` formatted, or ``"-"`` for None or NaN."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:{spec}}{suffix}"


def slope(values: Sequence[float]) -> float | None:
    """Least-squares slope of ``values`` against their index (None for fewer than 2)."""
    if len(values) < 2:
        return None
    return statistics.linear_regression(range(len(values)), values).slope


class Collections:
    """Python's collections while ``active``, through ``gc.callbacks``.

    Each is ``(start, end, generation, thread name)``, perf_counter seconds. A
    collection's time is not all time the GIL was held: the finalizers it runs
    can let other threads run. :meth:`close` removes the callback.
    """

    def __init__(self, active: bool = True) -> None:
        self.active = active
        self.events: list[tuple[float, float, int, str]] = []
        self._started: dict[str, float] = {}
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        thread = threading.current_thread().name
        if phase == "start":
            self._started[thread] = time.perf_counter()
        elif self.active and thread in self._started:
            started = self._started.pop(thread)
            self.events.append((started, time.perf_counter(), info["generation"], thread))

    def close(self) -> None:
        gc.callbacks.remove(self)

    def summary(self, prefix: str, keep: Callable[[int, str], bool]) -> dict[str, float]:
        """Count, total and longest (ms) of the collections ``keep(generation, thread)``."""
        ms = [1000 * (end - start) for start, end, gen, name in self.events if keep(gen, name)]
        found = {"collections": len(ms), "total_ms": sum(ms), "max_ms": max(ms, default=0.0)}
        return {f"{prefix}_{key}": value for key, value in found.items()}

    def inside(self, start: float, end: float) -> float:
        """Milliseconds of collections within ``[start, end]``."""
        return sum(1000 * max(0.0, min(end, e) - max(start, s)) for s, e, *_ in self.events)
