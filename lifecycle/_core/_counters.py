"""Process-wide counters: what every session, model and cleaner has done so far.

Sessions and cleaners come and go; these totals outlive them, so process
statistics stay monotonic (as Prometheus counters must).
"""

from __future__ import annotations

import threading

__all__ = ["PROCESS", "Counters"]


class Counters:
    """Named, thread-safe numeric totals."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = {}

    def add(self, name: str, delta: float = 1) -> None:
        """Add ``delta`` to the total called ``name``."""
        with self._lock:
            self._values[name] = self._values.get(name, 0) + delta

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
