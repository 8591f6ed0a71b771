"""The ASGI application and the process that runs it.

:func:`build_app` puts the protocol adapters side by side over one
:class:`ModelService`; :func:`serve` runs it with uvicorn in a process of its
own, with the gRPC server over the same service, the registry's serving
settings, and a graceful shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator
from types import FrameType
from typing import Any

import grpc
import tensorflow as tf
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .. import _tf
from .._core import tune_allocator
from .._registry import ModelRegistry
from ..errors import LifecycleError
from ._admin import routes as admin_routes
from ._config import ServerConfig
from ._errors import ERRORS, OVERLOADED, error_status, wire_message
from ._grpc_server import build_grpc_server
from ._http import BodyReads, HttpLimits, blocking, json_response
from ._service import ModelService
from .kserve._rest import routes as kserve_routes
from .tfserving._rest import routes as tfserving_routes

__all__ = ["build_app", "serve"]

_log = logging.getLogger("lifecycle.server")
# uvicorn's logger: configured by uvicorn, so its lines reach the console.
_uvicorn_log = logging.getLogger("uvicorn.error")


def build_app(
    registry: ModelRegistry, config: ServerConfig, *, service: ModelService | None = None
) -> Starlette:
    """The server's ASGI application over ``registry``.

    On start-up (the ASGI lifespan) it loads the configured models into
    ``registry`` and warms them up; a server such as uvicorn opens its port
    only after that. The app does not close ``registry``: its creator does.

    Args:
        registry: Where the versions live; may already hold models of its own.
        config: The models to load and the request limits.
        service: The service to serve (its models and configuration), to share
            it with a gRPC server (:func:`build_grpc_server`); by default one over
            ``registry`` and ``config``. The app's start-up starts it.

    Returns:
        A Starlette application serving TensorFlow Serving's REST API, KServe's
        v2 protocol, the admin API and Prometheus metrics, under ``config``'s
        request limits. Its ``state.body_reads`` (:class:`BodyReads`) ends
        the body reads in progress when the server shuts down.

    Example:
        >>> import lifecycle as lc
        >>> from lifecycle.server import ServerConfig, build_app
        >>> registry = lc.ModelRegistry()
        >>> app = build_app(registry, ServerConfig())  # run it with any ASGI server
        >>> registry.close()
    """
    if service is None:
        service = ModelService(registry, config)
    elif service.registry is not registry:
        raise ValueError("`service` must serve `registry`; it was built over another registry.")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await blocking(service.start)
        try:
            yield
        finally:
            await blocking(service.stop)

    async def wire_error(request: Request, error: Exception) -> Response:
        status = error_status(error)
        if status.status >= 500 and not isinstance(error, OVERLOADED):
            _log.error("%s %s failed", request.method, request.url.path, exc_info=error)
        response = json_response({"error": wire_message(error)}, status.status)
        if status.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        if isinstance(error, OVERLOADED):
            response.headers["Retry-After"] = "1"
        return response

    async def disconnected(request: Request, error: Exception) -> Response:
        # The client left before its body arrived: nobody reads the answer.
        return Response(status_code=400)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        return json_response(
            {"error": f"{error.detail}: {request.method} {request.url.path}"}, error.status_code
        )

    handlers: dict[Any, Any] = {kind: wire_error for kind, _ in ERRORS}
    handlers[HTTPException] = http_error
    handlers[ClientDisconnect] = disconnected
    handlers[Exception] = wire_error
    reads = BodyReads()
    app = Starlette(
        routes=[
            *tfserving_routes(service, config.max_request_bytes),
            *kserve_routes(service, config.max_request_bytes),
            *admin_routes(registry, config),
            *_metrics_routes(registry),
        ],
        middleware=[Middleware(HttpLimits, config=config, reads=reads)],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    app.state.body_reads = reads
    return app


def _metrics_routes(registry: ModelRegistry) -> list[Route]:
    """Prometheus metrics at TensorFlow Serving's path and ``/metrics``, with prometheus-client."""
    try:
        import prometheus_client
    except ImportError:
        return []
    from ..monitoring import register_prometheus

    metrics = prometheus_client.CollectorRegistry()
    register_prometheus(metrics, model_registries=[registry])

    async def scrape(request: Request) -> Response:
        body = await blocking(prometheus_client.generate_latest, metrics)
        return Response(body, media_type=prometheus_client.CONTENT_TYPE_LATEST)

    # TensorFlow Serving's path, and the one Prometheus scrapes by default.
    return [Route(path, scrape) for path in ("/monitoring/prometheus/metrics", "/metrics")]


class _Server(uvicorn.Server):
    """uvicorn's server for ``app``, with the gRPC server over ``service``; exits 0 on a signal.

    uvicorn shuts down gracefully on SIGTERM or SIGINT (stops accepting, waits
    for requests in flight up to ``timeout_graceful_shutdown``, runs the
    lifespan's shutdown), then raises the signal again, which ends the process
    with it. A model server stopped on purpose should exit 0: this one does not
    raise it again.

    Unless ``grpc_port`` is 0 it also serves gRPC: the gRPC port opens with the
    HTTP one, once the models are loaded, and closes with it, letting calls in
    flight finish within ``drain_seconds``. Request bodies still arriving at
    shutdown (the app's ``body_reads``) are answered at once (408) rather than
    waited for until the drain ends.
    """

    def __init__(self, app: Starlette, service: ModelService) -> None:
        super().__init__(uvicorn_config(app, service.config))
        self._service = service
        self._body_reads: BodyReads = app.state.body_reads
        self._grpc: grpc.Server | None = None
        # Set when the gRPC server could not start: the process exits 1.
        self.failed = False

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        config = self._service.config
        if self.should_exit or not config.grpc_port:
            return
        try:
            self._grpc = build_grpc_server(self._service, config)
        except (OSError, ValueError) as error:
            _uvicorn_log.error("gRPC: %s", error)
            self.failed = self.should_exit = True
            return
        self._grpc.start()
        _uvicorn_log.info("gRPC running on %s:%s", config.host, config.grpc_port)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        grace = self._service.config.drain_seconds
        stopped = self._grpc.stop(grace) if self._grpc is not None else None
        self._body_reads.stop()
        await super().shutdown(sockets)
        if stopped is not None:
            await asyncio.to_thread(stopped.wait, grace + 5)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's, without recording the signal to raise again once stopped.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for requests in flight
        self.should_exit = True


def uvicorn_config(app: Any, config: ServerConfig) -> uvicorn.Config:
    """The uvicorn settings that serve ``app`` as ``config`` says.

    uvicorn picks its HTTP parser and event loop by what is installed: the
    ``serve`` extra installs httptools and (except on Windows) uvloop, which
    took a sixth to a quarter less CPU per request than h11 and asyncio's own
    loop in the server benchmark's recorded runs.

    uvicorn refuses a request with 503 (a plain-text body, the connection
    closed) once ``limit_concurrency`` connections are open, counting the
    request's own: one more than ``max_connections`` lets that many serve. Its
    log line for each request so refused goes through once per 10 s at most.
    """
    if not any(isinstance(f, _Throttle) for f in _uvicorn_log.filters):
        _uvicorn_log.addFilter(_Throttle())
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.rest_api_port,
        lifespan="on",
        timeout_graceful_shutdown=config.drain_seconds,  # type: ignore[arg-type]
        log_level="info",
        access_log=config.access_log,
        limit_concurrency=config.max_connections + 1,
    )


class _Throttle(logging.Filter):
    """Lets uvicorn's line per request refused beyond its limit through once per 10 s.

    A flood of refused requests would otherwise write a flood of lines on the
    event loop. The line that passes says how many were dropped since the last.
    """

    MESSAGE = "Exceeded concurrency limit."

    def __init__(self) -> None:
        super().__init__()
        self._next = 0.0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE:
            return True
        now = time.monotonic()
        if now < self._next:
            self._dropped += 1
            return False
        if self._dropped:
            record.msg = f"{self.MESSAGE} ({self._dropped} more since the last such line)"
        self._next, self._dropped = now + 10.0, 0
        return True


def set_parallelism(config: ServerConfig) -> None:
    """Give TensorFlow the thread counts of ``config`` (0: leave TensorFlow's choice)."""
    threading_ = tf.config.threading
    counts = (
        (
            "--tensorflow_intra_op_parallelism",
            config.intra_op_parallelism,
            threading_.get_intra_op_parallelism_threads,
            threading_.set_intra_op_parallelism_threads,
        ),
        (
            "--tensorflow_inter_op_parallelism",
            config.inter_op_parallelism,
            threading_.get_inter_op_parallelism_threads,
            threading_.set_inter_op_parallelism_threads,
        ),
    )
    for flag, count, get, set_ in counts:
        if not count or get() == count:
            continue
        try:
            set_(count)
        except RuntimeError:
            raise RuntimeError(
                f"{flag} {count} cannot take effect: this process ran TensorFlow ops "
                f"already, with {get() or 'TensorFlow-chosen'} threads. Serve from a fresh "
                "process (the `lifecycle serve` command does)."
            ) from None


def serve(config: ServerConfig) -> None:
    """Run the server until SIGTERM or SIGINT, then drain, close the registry and return.

    The registry gets the serving process's settings from ``config``
    (background loads, heap freezing, the allocator). The ports (HTTP, and
    gRPC unless ``grpc_port`` is 0) open once the configured models are loaded
    and warmed up; both protocols share one :class:`ModelService`. On a signal
    the server stops accepting, lets requests in flight finish (up to
    ``drain_seconds``), and closes the registry, which drains leases and
    disposes every version.

    Raises:
        SystemExit: The configured models could not be loaded, or a port could
            not be bound (status 1).
        RuntimeError: A thread count of ``config`` cannot take effect: this
            process ran a TensorFlow op with other counts already.
    """
    set_parallelism(config)
    # Not over the system allocator: a low mmap threshold would map and zero every
    # block afresh (docs/benchmarks.md, "Allocator settings": benchmarks/allocator.py).
    if config.tune_allocator and _tf.memory.cpu_allocator() != "onednn-system":
        tune_allocator()
    registry = ModelRegistry(
        memory_budget=config.memory_budget,
        max_loaded=config.max_loaded,
        drain_timeout=config.drain_seconds,
        loader_nice=config.loader_nice,
        loader_gil_share=config.loader_gil_share,
        loader_foreground_bytes=config.loader_foreground_bytes,
        freeze_heap=config.freeze_heap,
        swap_policy=config.swap_policy,
        name="server",
    )
    service = ModelService(registry, config)
    app = build_app(registry, config, service=service)
    server = _Server(app, service)
    try:
        # The models load before the ports open, here rather than in the app's
        # start-up: a model that cannot be served is one line naming it, not a
        # traceback through uvicorn's lifespan (the lifespan then finds it started).
        try:
            service.start()
        except (OSError, ValueError, LifecycleError) as error:
            _uvicorn_log.error("Start-up failed: %s", error)
            raise SystemExit(1) from None
        server.run()
    finally:
        versions = len(registry.status())
        registry.close()
        _uvicorn_log.info("Registry closed: %d version(s) drained and disposed.", versions)
    if not server.started or server.failed:
        raise SystemExit(1)
