"""``lifecycle serve``: the model registry behind TensorFlow Serving's and KServe's APIs.

Needs the ``serve`` extra (Starlette, uvicorn, orjson, grpcio, tensorflow-serving-api);
importing this package without it raises an ``ImportError`` naming the
``pip install`` that fixes it. Its names are imported on first use. The registry
never imports this package.

Modules, one concern each:

* ``_config``: :class:`ServerConfig`, built from the flags or TensorFlow Serving's model
  config file;
* ``_flags``: each flag declared once (name, type, default, help, check), and
  ``_rules``: the rules of flags that go together; no TensorFlow, so the command
  checks its flags first;
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

import importlib.util
from typing import TYPE_CHECKING

from .._core._lazy import attach as _attach

SERVE_INSTALL = 'pip install "keras-lifecycle[serve]"'

# The extra is looked for, not imported: the command line reads the flags
# (`_flags`, `_rules`) without paying for grpc and uvicorn, or TensorFlow, which the
# modules below import when a name of theirs is first used (PEP 562).
for _extra in ("grpc", "orjson", "starlette", "tensorflow_serving", "uvicorn"):
    if importlib.util.find_spec(_extra) is None:  # pragma: no cover - without the extra
        raise ImportError(
            f"lifecycle.server needs the serve extra ({_extra} is missing): {SERVE_INSTALL}",
            name=_extra,
        )

if TYPE_CHECKING:
    from ._app import build_app as build_app
    from ._app import serve as serve
    from ._config import ServedModel as ServedModel
    from ._config import ServerConfig as ServerConfig
    from ._config import read_batching_parameters as read_batching_parameters
    from ._grpc import build_grpc_server as build_grpc_server
    from ._service import ModelService as ModelService

__getattr__, __dir__ = _attach(
    __name__,
    {
        "._app": ("build_app", "serve"),
        "._config": ("ServedModel", "ServerConfig", "read_batching_parameters"),
        "._grpc": ("build_grpc_server",),
        "._service": ("ModelService",),
    },
)

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
