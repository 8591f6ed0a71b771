"""Leak trends: is memory growing per cycle, and how sure is that?

One high reading is not a leak; steady growth is. The monitor fits a
least-squares line through one sample per cycle (epoch, training run, swap)
and judges its slope by a confidence interval from the t distribution: a leak
is called only when even the interval's lower bound grows faster than the
tolerance.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable

import attrs

from .._core import MiB, check_int

__all__ = ["LeakTrendMonitor", "Trend"]


def _t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t distribution with ``df`` degrees of freedom.

    Exact for 1 and 2 degrees of freedom; the Cornish-Fisher expansion
    otherwise (within 0.3 % of the exact value at 3, better above).
    """
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / df ** (k + 1) for k, term in enumerate(terms))


@attrs.frozen
class Trend:
    """The growth of a sampled quantity per cycle, with its confidence interval.

    Attributes:
        samples: Samples used (after the warm-up).
        slope: Least-squares growth per cycle (bytes per cycle for RSS), or
            ``None`` with fewer than 3 samples.
        low: Lower bound of the confidence interval of the slope.
        high: Upper bound.
        confidence: The interval's confidence level, e.g. 0.95.
        tolerance: Growth per cycle that is not called a leak.
        leaking: ``True`` when ``low`` exceeds ``tolerance``: the growth is
            both real (the interval excludes it) and large.
        verdict: ``"leaking"``, ``"flat"`` or ``"insufficient data"``.
    """

    samples: int
    slope: float | None
    low: float | None
    high: float | None
    confidence: float
    tolerance: float
    leaking: bool
    verdict: str

    def __str__(self) -> str:
        if self.slope is None:
            return f"insufficient data: {self.samples} samples (need at least 3)"
        assert self.low is not None and self.high is not None
        return (
            f"{self.verdict}: {self.slope / MiB:+.2f} MiB/cycle "
            f"({self.confidence:.0%} interval {self.low / MiB:+.2f} to {self.high / MiB:+.2f}, "
            f"{self.samples} samples, tolerance {self.tolerance / MiB:.2f} MiB/cycle)"
        )


def fit(values: list[float], *, confidence: float, tolerance: float) -> Trend:
    """The :class:`Trend` of ``values`` (one per cycle)."""
    n = len(values)
    if n < 3:
        return Trend(n, None, None, None, confidence, tolerance, False, "insufficient data")
    xs = range(n)
    mean_x = (n - 1) / 2
    mean_y = statistics.fmean(values)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, values, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, values, strict=True))
    error = math.sqrt(residual / (n - 2) / sxx)
    half = _t_quantile(0.5 + confidence / 2, n - 2) * error
    low, high = slope - half, slope + half
    leaking = low > tolerance
    return Trend(
        n, slope, low, high, confidence, tolerance, leaking, "leaking" if leaking else "flat"
    )


def _rss() -> float:
    from ._statistics import statistics as process_statistics

    rss = process_statistics(count_graphs=False).rss_bytes
    if rss is None:
        raise RuntimeError("this platform does not report the process's RSS; pass value=")
    return float(rss)


class LeakTrendMonitor:
    """Samples memory once per cycle and tells whether it grows, with confidence.

    Args:
        warmup: Samples to ignore first (caches fill, the allocator settles).
        tolerance: Growth per cycle (bytes) that is not a leak; 1 MiB by default.
        confidence: Confidence level of the interval, in (0, 1).
        probe: Reads the value when :meth:`sample` gets none; the process's RSS
            by default.

    Example:
        >>> monitor = LeakTrendMonitor(warmup=2)
        >>> for cycle in range(20):  # doctest: +SKIP
        ...     train_one_model()
        ...     monitor.sample()
        >>> print(monitor.trend())  # doctest: +SKIP
        flat: +0.03 MiB/cycle (95% interval -0.05 to +0.11, 18 samples, ...)
    """

    def __init__(
        self,
        *,
        warmup: int = 3,
        tolerance: float = 1 * MiB,
        confidence: float = 0.95,
        probe: Callable[[], float] | None = None,
    ) -> None:
        check_int(warmup, "warmup")
        if not 0 < confidence < 1:
            raise ValueError(f"`confidence` must be in (0, 1). Received: {confidence!r}")
        if tolerance < 0:
            raise ValueError(f"`tolerance` must be >= 0. Received: {tolerance!r}")
        self.warmup = warmup
        self.tolerance = float(tolerance)
        self.confidence = float(confidence)
        self._probe = probe or _rss
        self._lock = threading.Lock()
        self._values: list[float] = []

    @property
    def values(self) -> tuple[float, ...]:
        """Every sample so far, warm-up included."""
        with self._lock:
            return tuple(self._values)

    def sample(self, value: float | None = None) -> Trend:
        """Record one cycle's value (default: the probe's reading); returns the trend so far."""
        reading = float(self._probe() if value is None else value)
        with self._lock:
            self._values.append(reading)
        return self.trend()

    def trend(self) -> Trend:
        """The trend over the samples after the warm-up."""
        with self._lock:
            values = self._values[self.warmup :]
        return fit(values, confidence=self.confidence, tolerance=self.tolerance)
