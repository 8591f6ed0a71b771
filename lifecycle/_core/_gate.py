"""A gate that counts calls in flight and refuses new ones once closed.

Releasing a model's buffers while another thread runs its graph can crash the
process, so every entry point of a managed model passes through a gate, and
``dispose()`` closes the gate and waits for it to drain before releasing.
"""

from __future__ import annotations

import threading


class CallGate:
    """Counts calls in flight per thread; refuses new calls once closed.

    A thread already inside a call may enter again (``fit`` calls the model),
    even while the gate is closing, so a call in flight always completes.
    All methods are thread-safe.
    """

    __slots__ = ("_active", "_closed", "_cond")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        # Invariant: maps thread ident -> nesting depth >= 1, for every thread
        # currently inside a call; empty when no call is in flight.
        self._active: dict[int, int] = {}
        self._closed = False

    def enter(self) -> int:
        """Enter a call.

        Returns:
            The calling thread's nesting depth including this call (1 for an
            outermost call), or 0 — entering nothing — if the gate is closed.
        """
        ident = threading.get_ident()
        with self._cond:
            depth = self._active.get(ident, 0)
            if self._closed and not depth:
                return 0
            self._active[ident] = depth + 1
            return depth + 1

    def exit(self) -> None:
        """Leave a call entered with :meth:`enter`."""
        ident = threading.get_ident()
        with self._cond:
            depth = self._active[ident] - 1
            if depth:
                self._active[ident] = depth
            else:
                del self._active[ident]
                if not self._active:
                    self._cond.notify_all()

    def in_flight(self) -> int:
        """How many threads are inside a call right now."""
        with self._cond:
            return len(self._active)

    def held_by_current_thread(self) -> bool:
        """Whether the calling thread is inside a call through this gate."""
        with self._cond:
            return threading.get_ident() in self._active

    def close(self, timeout: float | None) -> int:
        """Refuse new calls and wait for calls in flight to finish.

        Args:
            timeout: Seconds to wait; ``None`` waits forever.

        Returns:
            0 once drained. Otherwise the number of calls still in flight when
            the wait expired; the gate is then open again, as before the call.
        """
        with self._cond:
            self._closed = True
            if self._cond.wait_for(lambda: not self._active, timeout):
                return 0
            self._closed = False
            return len(self._active)

    def reopen(self) -> None:
        """Accept calls again after a ``close()`` whose follow-up was abandoned."""
        with self._cond:
            self._closed = False

    @property
    def closed(self) -> bool:
        """Whether new calls are refused."""
        return self._closed
