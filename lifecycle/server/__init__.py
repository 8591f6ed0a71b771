"""``lifecycle serve``: the model registry behind TensorFlow Serving's and KServe's APIs.

Needs the ``serve`` extra (Starlette, uvicorn, orjson, grpcio, tensorflow-serving-api);
importing this package without it raises an ``ImportError`` naming the
``pip install`` that fixes it. The registry never imports this package.

Modules, one concern each:

* ``_config``: :class:`ServerConfig`, the flags, TensorFlow Serving's model config file;
* ``_flags``: the flags' checks that need no TensorFlow, which the command runs first;
* ``_service``: :class:`ModelService`, the one request path into the registry;
* ``_tfserving``, ``_kserve``, ``_grpc``, ``_kserve_grpc``: the protocol adapters, side
  by side (TensorFlow Serving's REST, KServe v2's REST, TensorFlow Serving's gRPC,
  KServe v2's gRPC on the same ``grpc.Server``);
* ``_v2tensors``: KServe v2 tensors as JSON, raw bytes and typed gRPC contents, shared
  by both v2 adapters; ``_open_inference``: v2's gRPC messages, compiled from
  ``open_inference.proto``;
* ``_admin``: the admin API (promote, labels, routes), bearer tokens, sticky keys;
* ``_errors``: the one table from exceptions to wire statuses;
* ``_http``: JSON bodies under a size limit, shared by the adapters;
* ``_app``: :func:`build_app` (the ASGI app) and :func:`serve` (the process, with
  the gRPC server of :func:`build_grpc_server`).
"""

SERVE_INSTALL = 'pip install "keras-lifecycle[serve]"'

try:
    import grpc  # noqa: F401
    import orjson  # noqa: F401
    import starlette  # noqa: F401
    import tensorflow_serving  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        f"lifecycle.server needs the serve extra ({error.name} is missing): {SERVE_INSTALL}"
    ) from error

from ._app import build_app as build_app  # noqa: E402 (after the extra check)
from ._app import serve as serve  # noqa: E402
from ._config import ServedModel as ServedModel  # noqa: E402
from ._config import ServerConfig as ServerConfig  # noqa: E402
from ._config import read_batching_parameters as read_batching_parameters  # noqa: E402
from ._grpc import build_grpc_server as build_grpc_server  # noqa: E402
from ._service import ModelService as ModelService  # noqa: E402

__all__ = [
    "SERVE_INSTALL",
    "ModelService",
    "ServedModel",
    "ServerConfig",
    "build_app",
    "build_grpc_server",
    "read_batching_parameters",
    "serve",
]
