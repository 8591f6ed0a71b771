"""lifecycle.server._http: the worker pool that runs the REST routes' blocking calls."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from support.waits import wait_until

from lifecycle.server import _http
from lifecycle.server._http import _Workers, blocking

REQUEST = contextvars.ContextVar("REQUEST", default="none")


def test_blocking_returns_the_result_on_another_thread_in_the_callers_context() -> None:
    def call(x: int, *, y: int) -> tuple[int, str, bool]:
        return x + y, REQUEST.get(), threading.current_thread() is threading.main_thread()

    async def main() -> tuple[int, str, bool]:
        REQUEST.set("r1")
        return await blocking(call, 1, y=2)

    assert asyncio.run(main()) == (3, "r1", False)


def test_blocking_raises_the_calls_error() -> None:
    def call() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        asyncio.run(blocking(call))


def test_calls_beyond_the_limit_wait_for_a_thread_and_idle_threads_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workers = _Workers(limit=2, idle_seconds=0.1)
    monkeypatch.setattr(_http, "_WORKERS", workers)
    release = threading.Event()
    running: list[int] = []

    def call(i: int) -> int:
        running.append(i)
        release.wait(10)
        return i

    async def main() -> list[int]:
        tasks = [asyncio.create_task(blocking(call, i)) for i in range(3)]
        await asyncio.to_thread(wait_until, lambda: len(running) == 2, "two calls running")
        # An absence (the third does not start while both threads are busy), so a
        # bounded wait, once two calls are seen running.
        await asyncio.sleep(0.2)
        assert len(running) == 2  # the third waits for one of the two threads
        assert workers._threads == 2
        release.set()
        return list(await asyncio.gather(*tasks))

    assert asyncio.run(main()) == [0, 1, 2]
    wait_until(lambda: workers._threads == 0, "the idle threads ended")


def test_a_cancelled_call_still_runs_to_its_end() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def call() -> None:
        started.set()
        release.wait(10)
        finished.set()

    async def main() -> None:
        task = asyncio.create_task(blocking(call))
        assert await asyncio.to_thread(started.wait, 10), "the call did not start"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not finished.is_set()
        release.set()

    asyncio.run(main())
    assert finished.wait(10), "the cancelled call did not run to its end"
