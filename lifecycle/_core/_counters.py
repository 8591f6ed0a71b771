"""Process-wide counters: what every session, model and cleaner has done so far.

Sessions and cleaners come and go; these totals outlive them, so process
statistics stay monotonic (as Prometheus counters must).
"""

from __future__ import annotations

import threading

__all__ = ["LIVE_MODELS", "PROCESS", "Counters", "Gauge"]


class Counters:
    """Named, thread-safe numeric totals (and high-water marks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = {}

    def add(self, name: str, delta: float = 1) -> None:
        """Add ``delta`` to the total called ``name``."""
        with self._lock:
            self._values[name] = self._values.get(name, 0) + delta

    def maximum(self, name: str, value: float) -> None:
        """Raise the value called ``name`` to ``value`` if it is below (a high-water mark)."""
        with self._lock:
            self._values[name] = max(self._values.get(name, value), value)

    def get(self, name: str) -> float:
        """The total called ``name`` (0 if never added to)."""
        with self._lock:
            return self._values.get(name, 0)

    def snapshot(self) -> dict[str, float]:
        """Every total, at one instant."""
        with self._lock:
            return dict(self._values)


#: The totals of this process.
PROCESS = Counters()


class Gauge:
    """A thread-safe integer that goes up and down (a level, not a total)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, delta: int) -> None:
        """Add ``delta`` (negative to lower it)."""
        with self._lock:
            self.value += delta


#: Managed models owned by any session of this process and not yet disposed
#: or cleaned up.
LIVE_MODELS = Gauge()
