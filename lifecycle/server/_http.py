"""What both REST adapters share: bodies under limits, JSON off the loop, answers, threads.

Blocking calls (a model, a load) run on worker threads of this module's own
pool rather than anyio's: a request takes two thread hops, and anyio's
(capacity limiter, cancel shield, backend lookup per call) cost several times
the CPU of a queue put and a ``call_soon_threadsafe``, on the path of every
prediction (``benchmarks/worker_hop.py``; docs/benchmarks.md, "Worker hop").
The event loop itself never runs a model, nor parses or writes a large JSON
document (``_json`` does it on a worker thread, in pieces), so health checks,
status and admin calls are answered during a long prediction.

:class:`HttpLimits` (an ASGI middleware) holds the request limits of one app:
how long a body may take to arrive, and how many calls may wait for a worker
(one more is refused at once with :class:`~._errors.ServerBusyError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import _flags, _json
from ._errors import PayloadTooLargeError, RequestTimeoutError, ServerBusyError

__all__ = [
    "BodyReads",
    "HttpLimits",
    "blocking",
    "json_response",
    "read_body",
    "read_json",
]

T = TypeVar("T")


async def read_json(request: Request, limit: int, *, empty: Any = None) -> Any:
    """The request's JSON body, read no further than ``limit`` bytes.

    A body longer than :data:`~._json.PIECE` is parsed on a worker thread; a
    body nested deeper than the app's ``max_json_depth`` is refused unparsed.

    Args:
        request: The request.
        limit: The most bytes to read.
        empty: What an empty body means; ``None``: an empty body is not JSON.

    Raises:
        PayloadTooLargeError: The body (declared or read) is over ``limit``.
        RequestTimeoutError: The body did not arrive within the app's timeout.
        BadRequestError: The body is not JSON, or nests too deep.
    """
    body = await read_body(request, limit)
    if not body and empty is not None:
        return empty
    depth = _LIMITS.get().max_json_depth
    if len(body) <= _json.PIECE:
        return _json.loads(body, depth, _BODY)
    return await blocking(_json.loads, body, depth, _BODY)


_BODY = "The request body"


async def read_body(request: Request, limit: int) -> bytearray:
    """The request's body, read no further than ``limit`` bytes.

    Raises:
        PayloadTooLargeError: The body (declared or read) is over ``limit``.
        RequestTimeoutError: The body did not arrive within the app's timeout
            (:class:`HttpLimits`), or the server is shutting down.
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
    """``content`` as a JSON response; NumPy arrays serialise as nested lists.

    ``bytes`` are JSON already: an answer that may be long is written on the
    worker thread that computed it (``_json.dumps``), not on the event loop.
    """
    if not isinstance(content, bytes):
        content = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, status_code=status, media_type="application/json")


@attrs.frozen
class _RequestLimits:
    """The limits that calls made for one request read (a context variable)."""

    max_queued: int | None = None
    max_json_depth: int = _flags.by_name("max_json_depth").default


_UNBOUNDED = _RequestLimits()
# Set by HttpLimits for its app's requests; outside them (start-up, tests) no bound.
_LIMITS: contextvars.ContextVar[_RequestLimits] = contextvars.ContextVar(
    "lifecycle_http_limits", default=_UNBOUNDED
)


class BodyReads:
    """The request bodies an app is reading, each under its deadline; all ended at shutdown.

    A client that stalls in the middle of a body would otherwise hold its
    request, and the server's shutdown, until the drain timeout.
    """

    def __init__(self) -> None:
        # The bodies not complete yet; stopped: the server is shutting down,
        # and no body is read any more.
        self._reading: set[_Body] = set()
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped

    def stop(self) -> None:
        """End every body read now, and refuse those to come (on the app's loop).

        Their requests are answered 408 and their connections closed. Safe to
        call twice.
        """
        self._stopped = True
        for body in list(self._reading):
            body.end()

    def add(self, body: _Body) -> None:
        self._reading.add(body)

    def discard(self, body: _Body) -> None:
        self._reading.discard(body)


class HttpLimits:
    """ASGI middleware: the body read timeout and the limits of calls made for a request.

    A request's body must arrive within ``body_read_timeout`` seconds of its
    headers (else :class:`~._errors.RequestTimeoutError`, 408, and the
    connection closes); its blocking calls may wait behind at most
    ``max_queued`` others (:func:`blocking`), and its JSON nest at most
    ``max_json_depth`` deep (:func:`read_json`).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        body_read_timeout: float,
        max_queued: int,
        max_json_depth: int,
        reads: BodyReads,
    ) -> None:
        self._app = app
        self._timeout = body_read_timeout
        self._limits = _RequestLimits(max_queued=max_queued, max_json_depth=max_json_depth)
        self._reads = reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        body = _Body(receive, send, self._timeout, self._reads)
        token = _LIMITS.set(self._limits)
        try:
            await self._app(scope, body.receive, body.send)
        finally:
            _LIMITS.reset(token)
            body.close()


class _Body:
    """One request's ``receive`` under a deadline until its body is complete, and its ``send``.

    One timer per request rather than a task per ``receive``: at the
    deadline, or at shutdown, it cancels the request's task if it is waiting
    for the body, and that wait raises :class:`~._errors.RequestTimeoutError`.
    """

    def __init__(self, receive: Receive, send: Send, timeout: float, reads: BodyReads) -> None:
        self._receive = receive
        self._send = send
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + timeout
        self._timeout = timeout
        self._reads = reads
        # Set at the first read: the task reading, and the timer that ends its
        # wait at the deadline (registered with reads until the body is complete).
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # Waiting: the task awaits the next part of the body. Ended: end()
        # cancelled that wait. Complete: the last part arrived. Failed: the body
        # did not arrive in time; the answer closes the connection.
        self._waiting = False
        self._ended = False
        self._complete = False
        self._failed = False

    async def receive(self) -> Message:
        if self._complete:  # waiting for a disconnect: no deadline
            return await self._receive()
        if self._reads.stopped or self._loop.time() >= self._deadline:
            self._fail()
        if self._timer is None:
            self._task = asyncio.current_task()
            self._timer = self._loop.call_at(self._deadline, self.end)
            self._reads.add(self)
        self._waiting = True
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            if not self._ended:  # cancelled by someone else
                raise
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
            self._fail()
        finally:
            self._waiting = False
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._complete = True
            self.close()
        return message

    def end(self) -> None:
        """Cut the wait for the body short (the deadline, or shutdown); the wait raises."""
        if self._waiting and not self._ended and self._task is not None:
            self._ended = True
            self._task.cancel()

    def close(self) -> None:
        """Drop the timer: the body is complete, or the request is over."""
        if self._timer is not None:
            self._timer.cancel()
            self._reads.discard(self)

    def _fail(self) -> None:
        self._failed = True
        if self._reads.stopped:
            raise RequestTimeoutError(
                "The server is shutting down: the request body did not arrive in full before "
                "it stopped reading. Retry on another replica."
            ) from None
        raise RequestTimeoutError(
            f"The request body did not arrive within {self._timeout:g} s "
            "(--body_read_timeout_seconds); the connection is closed."
        ) from None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self._failed:
            # The rest of the body may still come: this connection cannot carry
            # another request.
            message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
        await self._send(message)


_CLOSE = (b"connection", b"close")


async def blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (a model, a load) on a worker thread, in the caller's context.

    If the awaiting task is cancelled, the call still runs to its end on its
    thread (what it holds, a lease say, is returned there); only its result is
    dropped.

    Raises:
        ServerBusyError: Called for a request of an app (:class:`HttpLimits`)
            while its ``max_queued_requests`` calls wait for a thread already.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()
    _WORKERS.submit((loop, future, context, function, args, kwargs), _LIMITS.get().max_queued)
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
    ``concurrent.futures.Future`` and a wrapping future per call) costs more CPU
    than this pool's (``benchmarks/worker_hop.py``, docs/benchmarks.md), and
    drops a queued call whose request is cancelled.
    """

    def __init__(self, limit: int = 40, idle_seconds: float = 10.0) -> None:
        self._limit = limit
        self._idle_seconds = idle_seconds
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Threads alive, those of them waiting for a call, and the queued calls
        # that no thread is free for (all under _lock). The queue holds a call
        # for each idle thread counted on, each thread being started, and the
        # backlog.
        self._threads = 0
        self._idle = 0
        self._backlog = 0

    def submit(self, call: _Call, max_backlog: int | None = None) -> None:
        """Queue ``call``; start a thread if none is idle and the limit allows.

        Raises:
            ServerBusyError: Every thread is busy and ``max_backlog`` calls
                wait already; ``call`` is not queued.
        """
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # this call is that thread's
            elif self._threads < self._limit:
                self._threads += 1
                threading.Thread(target=self._work, name="lifecycle-http", daemon=True).start()
            elif max_backlog is not None and self._backlog >= max_backlog:
                raise ServerBusyError(
                    f"The server is busy: {self._threads} requests are running and "
                    f"{self._backlog} wait for a worker thread, the most it queues "
                    "(--max_queued_requests). Retry later, or on another replica."
                )
            else:
                self._backlog += 1
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
                if self._backlog > 0:
                    self._backlog -= 1  # the next call this thread takes is one of them
                else:
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
