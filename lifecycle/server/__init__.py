"""``lifecycle serve``: the model registry behind TensorFlow Serving's and KServe's APIs.

Needs the ``serve`` extra (Starlette, uvicorn, orjson, grpcio, tensorflow-serving-api);
importing this package without it raises an ``ImportError`` naming the
``pip install`` that fixes it. Its names are imported on first use. The registry
never imports this package.

Modules, one concern each:

* ``_flags``: each flag declared once (name, type, default, help, check), with
  the checks of one flag's value;
* ``_config``: :class:`ServerConfig`, built from the flags in one pass, or from
  TensorFlow Serving's model config file, with all it checks when built (directories,
  the repository's start-up models, the rules between flags, the batching policy);
* ``_batching_file``: TensorFlow Serving's batching parameters file, and the protobuf
  text reader the model config file shares; these three import no TensorFlow,
  so the command builds its configuration, and refuses a bad flag, first;
* ``_service``: :class:`ModelService`, the server's models over the registry;
* ``tfserving/`` and ``kserve/``: the protocol families side by side, each with its
  REST face (``_rest``), its gRPC face (``_grpc``) and its codecs (TensorFlow Serving's
  ``_tensorproto`` and ``_examples``; KServe v2's ``_tensors`` and ``_open_inference``,
  compiled from ``open_inference.proto``); a request holds its version through
  :meth:`ModelRegistry.serving`, from decoding to the answer;
* ``_grpc_server``: :func:`build_grpc_server`, one ``grpc.Server`` with both
  families' services;
* ``_admin``: the admin API (promote, labels, routes); ``_auth``: admin credentials
  and sticky routing keys, one check for both transports;
* ``_errors``: the one table from exceptions to wire statuses;
* ``_http``: bodies under a size limit and worker threads, shared by the REST faces;
  ``_json``: JSON in bounded pieces; ``_shapes``: a claimed shape checked before a read;
* ``_app``: :func:`build_app` (the ASGI app) and :func:`serve` (the process, with
  the gRPC server of :func:`build_grpc_server`).
"""

import importlib.util
from typing import TYPE_CHECKING

from .._core._lazy import attach as _attach

SERVE_INSTALL = 'pip install "keras-lifecycle[serve]"'

# The extra is looked for, not imported: the command line reads the flags
# (`_flags`, `_config`) without paying for grpc and uvicorn, or TensorFlow, which the
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
    from ._batching_file import read_batching_parameters as read_batching_parameters
    from ._config import ServedModel as ServedModel
    from ._config import ServerConfig as ServerConfig
    from ._grpc_server import build_grpc_server as build_grpc_server
    from ._service import ModelService as ModelService

__getattr__, __dir__, __all__ = _attach(__name__)
