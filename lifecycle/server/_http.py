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

from . import _json
from ._config import ServerConfig
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
        return _json.loads(body, depth, "The request body")
    return await blocking(_json.loads, body, depth, "The request body")


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
    max_json_depth: int = attrs.fields(ServerConfig).max_json_depth.default


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
        # The waits for the next part of a body in progress; stopped: the
        # server is shutting down, and no body is read any more.
        self._waits: set[asyncio.Timeout] = set()
        self.stopped = False

    def stop(self) -> None:
        """End every body read now, and refuse those to come (on the app's loop).

        Their requests are answered 408 and their connections closed. Safe to
        call twice.
        """
        self.stopped = True
        now = asyncio.get_running_loop().time()
        for wait in self._waits:
            if not wait.expired():  # an expired one ends its wait already
                wait.reschedule(now)

    async def receive(self, receive: Receive, deadline: float) -> Message:
        """``receive()``, if it answers by ``deadline`` (the loop's time) and before :meth:`stop`.

        The wait is an ``asyncio`` timeout (a timer, not a task), which
        :meth:`stop` brings forward to now.

        Raises:
            TimeoutError: The deadline passed, or the server is shutting down.
        """
        if self.stopped or asyncio.get_running_loop().time() >= deadline:
            raise TimeoutError
        async with asyncio.timeout_at(deadline) as wait:
            self._waits.add(wait)
            try:
                return await receive()
            finally:
                self._waits.discard(wait)


class HttpLimits:
    """ASGI middleware: the body read timeout and the limits of calls made for a request.

    A request's body must arrive within ``config.body_read_timeout_seconds``
    of its headers (else :class:`~._errors.RequestTimeoutError`, 408, and the
    connection closes); its blocking calls may wait behind at most
    ``config.max_queued_requests`` others (:func:`blocking`), and its JSON nest
    at most ``config.max_json_depth`` deep (:func:`read_json`). ``reads`` ends
    the bodies being read at shutdown.
    """

    def __init__(self, app: ASGIApp, *, config: ServerConfig, reads: BodyReads) -> None:
        self._app = app
        self._timeout = config.body_read_timeout_seconds
        self._limits = _RequestLimits(config.max_queued_requests, config.max_json_depth)
        self._reads = reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self._timeout
        # Complete: the last part of the body arrived. Failed: the body did not
        # arrive in time; the answer closes the connection.
        complete = failed = False

        async def receive_body() -> Message:
            nonlocal complete, failed
            if complete:  # waiting for a disconnect: no deadline
                return await receive()
            try:
                message = await self._reads.receive(receive, deadline)
            except TimeoutError:
                failed = True
                if self._reads.stopped:
                    raise RequestTimeoutError(
                        "The server is shutting down: the request body did not arrive in full "
                        "before it stopped reading. Retry on another replica."
                    ) from None
                raise RequestTimeoutError(
                    f"The request body did not arrive within {self._timeout:g} s "
                    "(--body_read_timeout_seconds); the connection is closed."
                ) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def send_answer(message: Message) -> None:
            if message["type"] == "http.response.start" and failed:
                # The rest of the body may still come: this connection cannot
                # carry another request.
                close = (b"connection", b"close")
                message = {**message, "headers": [*message.get("headers", []), close]}
            await send(message)

        token = _LIMITS.set(self._limits)
        try:
            await self._app(scope, receive_body, send_answer)
        finally:
            _LIMITS.reset(token)


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

    def call() -> None:  # on the worker thread
        outcome: tuple[Any, BaseException | None]
        try:
            outcome = (context.run(function, *args, **kwargs), None)
        except BaseException as error:  # handed to the awaiting task
            outcome = (None, error)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody awaits the outcome
            loop.call_soon_threadsafe(_settle, future, *outcome)

    _WORKERS.submit(call, _LIMITS.get().max_queued)
    return await future


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


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
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Threads alive, those of them waiting for a call, and the queued calls
        # that no thread is free for (all under _lock). The queue holds a call
        # for each idle thread counted on, each thread being started, and the
        # backlog.
        self._threads = 0
        self._idle = 0
        self._backlog = 0

    def submit(self, call: Callable[[], None], max_backlog: int | None = None) -> None:
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
            call()
            with self._lock:
                if self._backlog > 0:
                    self._backlog -= 1  # the next call this thread takes is one of them
                else:
                    self._idle += 1


_WORKERS = _Workers()
