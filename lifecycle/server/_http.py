"""What both REST adapters share: JSON bodies (orjson) under a size limit, answers, threads.

Blocking calls (a model, a load) run on worker threads of this module's own
pool rather than anyio's: a request takes two thread hops, and anyio's
(capacity limiter, cancel shield, backend lookup per call) cost about twice
the CPU of a queue put and a ``call_soon_threadsafe`` (measured), on the path
of every prediction. The event loop itself never runs a model, so health
checks, status and admin calls are answered during a long prediction.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ._errors import BadRequestError, PayloadTooLargeError

__all__ = ["blocking", "json_response", "read_body", "read_json"]

T = TypeVar("T")


async def read_json(request: Request, limit: int, *, empty: Any = None) -> Any:
    """The request's JSON body, read no further than ``limit`` bytes.

    Args:
        request: The request.
        limit: The most bytes to read.
        empty: What an empty body means; ``None``: an empty body is not JSON.

    Raises:
        PayloadTooLargeError: The body (declared or read) is over ``limit``.
        BadRequestError: The body is not JSON.
    """
    body = await read_body(request, limit)
    if not body and empty is not None:
        return empty
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequestError(f"The request body is not valid JSON: {error}") from None


async def read_body(request: Request, limit: int) -> bytearray:
    """The request's body, read no further than ``limit`` bytes.

    Raises:
        PayloadTooLargeError: The body (declared or read) is over ``limit``.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(
            f"The request body has {declared} bytes; this server takes at most {limit}."
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLargeError(
                f"The request body is over {limit} bytes, the most this server takes."
            )
    return body


def json_response(content: Any, status: int = 200) -> Response:
    """``content`` as a JSON response; NumPy arrays serialise as nested lists."""
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
    )


async def blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (a model, a load) on a worker thread, in the caller's context.

    If the awaiting task is cancelled, the call still runs to its end on its
    thread (what it holds, a lease say, is returned there); only its result is
    dropped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()
    _WORKERS.submit((loop, future, context, function, args, kwargs))
    return await future


# A call for a worker: (loop, future, context, function, args, kwargs).
_Call = tuple[
    asyncio.AbstractEventLoop,
    "asyncio.Future[Any]",
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
    dict[str, Any],
]


class _Workers:
    """Daemon threads taking blocking calls from a queue, started on demand.

    At most ``limit`` threads (anyio's default for its pool); a thread idle
    for ``idle_seconds`` ends, so a quiet server holds none. Not a
    ``ThreadPoolExecutor``: its ``run_in_executor`` round trip (a
    ``concurrent.futures.Future`` and a wrapping future per call) took 1.4-2.6x
    this pool's CPU, and drops a queued call whose request is cancelled
    (``benchmarks/worker_hop.py``, docs/benchmarks.md).
    """

    def __init__(self, limit: int = 40, idle_seconds: float = 10.0) -> None:
        self._limit = limit
        self._idle_seconds = idle_seconds
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Threads alive, and those of them waiting for a call (both under _lock).
        self._threads = 0
        self._idle = 0

    def submit(self, call: _Call) -> None:
        """Queue ``call``; start a thread if none is idle and the limit allows."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # this call is that thread's
            elif self._threads < self._limit:
                self._threads += 1
                threading.Thread(target=self._work, name="lifecycle-http", daemon=True).start()
        self._calls.put(call)

    def _work(self) -> None:
        while True:
            try:
                call = self._calls.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    # A submit may have counted on this thread meanwhile: then
                    # its call is queued, and the thread stays for it.
                    if self._idle > 0:
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            _run(*call)
            with self._lock:
                self._idle += 1


def _run(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    context: contextvars.Context,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Run one call on a worker thread and hand its outcome to ``future``'s loop."""
    try:
        result = context.run(function, *args, **kwargs)
    except BaseException as error:  # handed to the awaiting task
        outcome: tuple[Any, BaseException | None] = (None, error)
    else:
        outcome = (result, None)
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody awaits the outcome
        loop.call_soon_threadsafe(_settle, future, *outcome)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


_WORKERS = _Workers()
