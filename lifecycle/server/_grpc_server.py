"""The one gRPC server of ``lifecycle serve``: both protocol families' services on one port.

::

    tensorflow.serving.PredictionService, ModelService   TensorFlow Serving (``tfserving``)
    inference.GRPCInferenceService                       KServe v2 (``kserve``)

Each family adds its own servicers (``tfserving._grpc.add_tfserving_services``,
``kserve._grpc.add_inference_service``); this module owns what they share: the address,
the worker threads, the message size limit, the queue bound and the admin interceptor,
which checks every admin call of either family once.
"""

from __future__ import annotations

from concurrent import futures

import grpc

from ._auth import AdminInterceptor
from ._config import ServerConfig
from ._service import ModelService
from .kserve._grpc import add_inference_service
from .tfserving._grpc import add_tfserving_services

__all__ = ["build_grpc_server"]


def build_grpc_server(service: ModelService, config: ServerConfig) -> grpc.Server:
    """A gRPC server of TensorFlow Serving's and KServe v2's APIs over ``service``, not started.

    It listens on ``config.host`` and ``config.grpc_port`` with
    ``config.grpc_max_threads`` worker threads, and takes messages up to
    ``config.max_request_bytes``. Up to ``config.max_queued_requests`` calls
    wait for a thread; one more is refused at once with ``RESOURCE_EXHAUSTED``.
    Start it once ``service`` is started (its models loaded); stop it with
    ``server.stop(grace)``.

    Args:
        service: The server's models and configuration, shared with the REST app.
        config: The address, thread count and request limits.

    Returns:
        The ``grpc.Server``, not started.

    Raises:
        ValueError: ``config.grpc_port`` is 0 (gRPC is off).
        OSError: The address cannot be bound (the port is in use, say).

    Example:
        >>> import lifecycle as lc
        >>> from lifecycle.server import ModelService, ServerConfig, build_grpc_server
        >>> registry = lc.ModelRegistry()
        >>> service = ModelService(registry, ServerConfig(grpc_port=8570))
        >>> service.start()
        >>> server = build_grpc_server(service, service.config)
        >>> server.start()
        >>> server.stop(grace=5).wait()
        True
        >>> service.stop(); registry.close()
    """
    if config.grpc_port == 0:
        raise ValueError("--port is 0: the gRPC server is off. Give it a port to serve gRPC.")
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=config.grpc_max_threads, thread_name_prefix="lifecycle-grpc"
        ),
        options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            # gRPC shares a port with other processes by default: a second
            # server on the same port must fail, as the HTTP one does.
            ("grpc.so_reuseport", 0),
        ],
        # Admin calls (TensorFlow Serving's reload, KServe's repository load and
        # unload) pass the one check every transport runs: the token, and --no_admin_api.
        interceptors=[AdminInterceptor(config)],
        # The calls running plus those queued for a thread; gRPC answers the
        # next one RESOURCE_EXHAUSTED ("Concurrent RPC limit exceeded!").
        maximum_concurrent_rpcs=config.grpc_max_threads + config.max_queued_requests,
    )
    add_tfserving_services(server, service)
    add_inference_service(server, service)
    host = f"[{config.host}]" if ":" in config.host else config.host
    address = f"{host}:{config.grpc_port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"--port {config.grpc_port}: cannot listen on {address}; is it in use?")
    return server
