"""lifecycle.server._http: the worker pool that runs the REST routes' blocking calls."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from support.waits import wait_until

from lifecycle.server import _http
from lifecycle.server._errors import ServerBusyError
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


def test_a_call_beyond_max_queued_is_refused_at_once_and_the_queue_drains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workers = _Workers(limit=1, idle_seconds=0.1)
    monkeypatch.setattr(_http, "_WORKERS", workers)
    release = threading.Event()
    started: list[int] = []

    def call(i: int) -> int:
        started.append(i)
        release.wait(10)
        return i

    async def main() -> list[int]:
        # What HttpLimits sets for a request of an app with --max_queued_requests 1.
        _http._LIMITS.set(_http._RequestLimits(max_queued=1))
        running = asyncio.create_task(blocking(call, 0))
        await asyncio.to_thread(wait_until, lambda: started == [0], "the first call running")
        queued = asyncio.create_task(blocking(call, 1))
        await asyncio.sleep(0)  # the task submits its call
        assert workers._backlog == 1
        with pytest.raises(ServerBusyError) as refused:
            await blocking(call, 2)
        assert "1 requests are running and 1 wait for a worker thread" in str(refused.value)
        assert "(--max_queued_requests)" in str(refused.value)
        release.set()
        return [await running, await queued]

    assert asyncio.run(main()) == [0, 1]
    assert started == [0, 1]  # the refused call never ran
    assert workers._backlog == 0
    wait_until(lambda: workers._threads == 0, "the idle thread ended")


def test_calls_outside_a_request_are_never_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up and shutdown (the app's lifespan) run outside any request's limits."""
    workers = _Workers(limit=1, idle_seconds=0.1)
    monkeypatch.setattr(_http, "_WORKERS", workers)
    release = threading.Event()

    async def main() -> list[bool]:
        calls = [asyncio.create_task(blocking(release.wait, 10)) for _ in range(5)]
        await asyncio.sleep(0)
        assert workers._backlog == 4
        release.set()
        return list(await asyncio.gather(*calls))

    assert asyncio.run(main()) == [True] * 5
