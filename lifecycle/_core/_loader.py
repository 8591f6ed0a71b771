"""A background thread for work that must not slow down serving.

Building a model version (its layers, initial values, traced serving path) is
CPU work of the same kind as serving, and most of it is Python, run under the
GIL. A build on an ordinary thread takes its share of the cores from the
request threads, and holds the GIL for up to the switch interval (5 ms) each
time a request thread waits for it: the requests' tail latency grows by that
much. The loader thread here

* runs at a lower priority (Linux, where a thread's ``nice`` value is its own),
  so the scheduler prefers the request threads when the cores are busy; and
* paces its Python work while requests are in flight: after each slice of
  ``SLICE_SECONDS`` under the GIL it sleeps, so a waiting request thread takes
  the GIL at once. ``gil_share`` is the loader's share of the time while it
  paces. A profile hook on the loader thread does the pacing; it sees only the
  loader's own calls.

Both hold a load back, and the hook alone slows its Python work. For a small
model that turns a short load into a long one, while the requests it protects
would barely notice it (``benchmarks/first_response.py``,
``docs/benchmarks.md#swap-to-first-response``). So work whose
size is known beforehand and is at most ``foreground_bytes`` (a SavedModel's
variables, a ``.keras`` archive's weights) runs in the foreground instead: on
the calling thread, at its priority, unpaced.
"""

from __future__ import annotations

import contextvars
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any, TypeVar

from ._checks import check_int, check_optional_int

__all__ = ["Loader", "check_foreground_bytes", "check_gil_share", "check_nice"]

_T = TypeVar("_T")
# Linux's range for a nice increment from 0.
MAX_NICE = 19
# Seconds of Python work between two pauses of a paced load.
SLICE_SECONDS = 0.0005


def check_nice(value: object, field: str) -> int | None:
    """``value`` if it is ``None`` or an int in 1..19 on Linux; otherwise a clear error."""
    if value is None:
        return None
    check_optional_int(value, field, minimum=1, maximum=MAX_NICE, what="an int (a nice increment)")
    if not sys.platform.startswith("linux"):
        raise NotImplementedError(
            f"`{field}` needs per-thread priorities, which only Linux has; leave it None "
            f"on {sys.platform}."
        )
    return value


def check_gil_share(value: object, field: str) -> float:
    """``value`` as a float if it is a number in (0, 1]; otherwise a clear error."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= 1
    ):
        raise ValueError(f"`{field}` must be a number in (0, 1]. Received: {field}={value!r}")
    return float(value)


def check_foreground_bytes(value: object, field: str) -> int:
    """``value`` if it is an int >= 0 (a number of bytes); otherwise a clear error."""
    return check_int(value, field, minimum=0, what="an int (a number of bytes)")


class Loader:
    """Runs callables one at a time on a background thread of its own.

    The thread starts on the first :meth:`run` that needs it. Calls wait for
    the result and re-raise the callable's exception; a call made on the
    loader thread itself runs at once (no deadlock). The caller's context
    variables are carried over.

    Args:
        name: Names the thread ``lifecycle-loader-<name>``.
        nice: The thread's nice increment (Linux), or ``None`` for none.
        gil_share: The share of time the loader's Python work may take while
            ``busy()`` is true; ``1.0`` never pauses.
        busy: Whether serving work is in flight (checked once per slice).
        foreground_bytes: Work that will hold at most this many bytes (the
            ``nbytes`` of :meth:`run`) runs in the foreground, on the calling
            thread; ``0``: all work runs on the loader thread.

    Example:
        >>> loader = Loader("demo", nice=None, gil_share=0.5, busy=lambda: True,
        ...                 foreground_bytes=2**20)
        >>> loader.run(lambda: "small", nbytes=1000), loader.foreground_runs
        ('small', 1)
        >>> loader.close()
    """

    def __init__(
        self,
        name: str,
        *,
        nice: int | None,
        gil_share: float,
        busy: Callable[[], bool],
        foreground_bytes: int = 0,
    ) -> None:
        self.nice = nice
        self.gil_share = gil_share
        self.foreground_bytes = foreground_bytes
        self._busy = busy
        self._pause = SLICE_SECONDS * (1 - gil_share) / gil_share
        #: How many times loads paused for requests in flight.
        self.pauses = 0
        #: How many calls ran in the foreground, on the calling thread.
        self.foreground_runs = 0
        self._ident: int | None = None
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"lifecycle-loader-{name}", initializer=self._start
        )

    def _start(self) -> None:
        self._ident = threading.get_ident()
        if self.nice is not None:
            # On Linux, PRIO_PROCESS with a thread id sets that thread's nice value alone.
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + self.nice)

    def on_thread(self) -> bool:
        """Whether the calling thread is the loader thread."""
        return threading.get_ident() == self._ident

    def in_foreground(self, nbytes: int | None) -> bool:
        """Whether work that will hold ``nbytes`` (``None``: unknown) runs on the calling thread."""
        if nbytes is None or not self.foreground_bytes:  # unknown size, or never
            return False
        return nbytes <= self.foreground_bytes

    def run(self, function: Callable[[], _T], *, nbytes: int | None = None) -> _T:
        """Run ``function`` and return its result: on the loader thread, or in the foreground.

        Args:
            function: The work.
            nbytes: The bytes the work will hold, if known before it runs. At
                most ``foreground_bytes``: it runs at once on the calling
                thread, at that thread's priority and unpaced.
        """
        if self.on_thread():
            return function()
        if self.in_foreground(nbytes):
            self.foreground_runs += 1
            return function()
        context = contextvars.copy_context()
        return self._executor.submit(context.run, self._paced, function).result()

    def _paced(self, function: Callable[[], _T]) -> _T:
        if self._pause <= 0:
            return function()
        clock, sleep, busy, pause = time.perf_counter, time.sleep, self._busy, self._pause
        slice_ends = clock() + SLICE_SECONDS

        def hook(frame: FrameType, event: str, arg: Any) -> None:
            nonlocal slice_ends
            if event == "call" and clock() > slice_ends:
                if busy():
                    sleep(pause)  # releases the GIL: a waiting request thread takes it
                    self.pauses += 1
                slice_ends = clock() + SLICE_SECONDS

        previous = sys.getprofile()
        sys.setprofile(hook)
        try:
            return function()
        finally:
            sys.setprofile(previous)

    def close(self) -> None:
        """Wait for the call in progress, then stop the thread. Safe to call twice."""
        self._executor.shutdown(wait=True)
