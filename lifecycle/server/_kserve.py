"""KServe's v2 REST protocol (the Open Inference Protocol) over the model service.

::

    GET  /v2/health/live | /v2/health/ready           200, or 400 when not
    GET  /v2                                          server metadata
    GET  /v2/models/{m}[/versions/{v}]                model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready          200, or 400 when not
    POST /v2/models/{m}[/versions/{v}]/infer          JSON tensors in and out
    POST /v2/repository/index                         the model repository extension
    POST /v2/repository/models/{m}/load | /unload

Tensors travel as JSON (``data`` flat in row-major order, or nested); the
binary tensor data extension is refused with a 400 that says so.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._registry import VersionState
from ..errors import UnknownModelError
from ._auth import authorize_http as authorize
from ._auth import http_sticky_key as sticky_key
from ._errors import BadRequestError
from ._http import blocking, json_response, read_json
from ._service import ModelService

__all__ = ["routes"]

# TensorFlow dtype name <-> the protocol's datatype.
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
    "string": "BYTES",
}


def routes(service: ModelService, max_request_bytes: int) -> list[Route]:
    """The routes of the v2 protocol and its model repository extension."""

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        return json_response({"ready": service.ready}, 200 if service.ready else 400)

    async def server_metadata(request: Request) -> Response:
        return json_response(
            {
                "name": "keras-lifecycle",
                "version": metadata.version("keras-lifecycle"),
                "extensions": ["model_repository"],
            }
        )

    async def model_metadata(request: Request) -> Response:
        name, version = _model(request)
        signature = await blocking(service.serving_signature, name, version)
        statuses = await blocking(service.versions, name)
        return json_response(
            {
                "name": name,
                "versions": [str(s.version) for s in statuses],
                "platform": "tensorflow_keras",
                "inputs": [_tensor_metadata(spec) for spec in signature.inputs],
                "outputs": [_tensor_metadata(spec) for spec in signature.outputs],
            }
        )

    async def model_ready(request: Request) -> Response:
        name, version = _model(request)
        try:
            statuses = await blocking(service.versions, name, version)
        except UnknownModelError:
            statuses = ()
        is_ready = any(s.state is VersionState.READY for s in statuses)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 400)

    async def infer(request: Request) -> Response:
        name, version = _model(request)
        if "inference-header-content-length" in request.headers:
            raise BadRequestError(
                "The binary tensor data extension is not supported: send tensors as "
                "JSON (tritonclient: binary_data=False)."
            )
        body = await read_json(request, max_request_bytes)
        key = sticky_key(request, service.config)
        return json_response(await blocking(_infer, service, name, version, body, key))

    async def index(request: Request) -> Response:
        body = await read_json(request, max_request_bytes, empty={})
        only_ready = isinstance(body, dict) and body.get("ready") is True
        rows = await blocking(service.repository)
        return json_response(
            [
                {"name": name, "version": "" if v is None else str(v), "state": state}
                for name, v, state in rows
                if not only_ready or state == "READY"
            ]
        )

    async def load(request: Request) -> Response:
        authorize(request, service.config)  # an admin call
        await blocking(service.load, request.path_params["name"])
        return json_response({})

    async def unload(request: Request) -> Response:
        authorize(request, service.config)  # an admin call
        await blocking(service.unload, request.path_params["name"])
        return json_response({})

    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version:int}"
    return [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route(model, model_metadata),
        Route(versioned, model_metadata),
        Route(f"{model}/ready", model_ready),
        Route(f"{versioned}/ready", model_ready),
        Route(f"{model}/infer", infer, methods=["POST"]),
        Route(f"{versioned}/infer", infer, methods=["POST"]),
        Route("/v2/repository/index", index, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", unload, methods=["POST"]),
    ]


def _model(request: Request) -> tuple[str, int | None]:
    return request.path_params["name"], request.path_params.get("version")


def _tensor_metadata(spec: Any) -> dict[str, Any]:
    return {
        "name": spec.name,
        "datatype": DATATYPES.get(spec.dtype, spec.dtype.upper()),
        "shape": [-1 if d is None else d for d in spec.shape],
    }


def _infer(
    service: ModelService, name: str, version: int | None, body: Any, key: str | None
) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise BadRequestError("The request body must be an object with an 'inputs' list.")
    signature = service.serving_signature(name, version)
    inputs = {}
    for item in body["inputs"]:
        if not isinstance(item, dict) or not {"name", "shape", "datatype", "data"} <= set(item):
            raise BadRequestError(
                "Each input must be an object with 'name', 'shape', 'datatype' and 'data'."
            )
        spec = signature.input(item["name"])
        expected = DATATYPES.get(spec.dtype)
        if item["datatype"] != expected:
            raise BadRequestError(
                f"Input {spec.name!r} has datatype {item['datatype']!r}; the model takes "
                f"{expected!r}."
            )
        inputs[spec.name] = _array(item)
    requested = body.get("outputs")
    result = service.infer(name, inputs, version, key=key)
    names = list(result.outputs)
    if requested is not None:
        if not isinstance(requested, list) or not all(
            isinstance(o, dict) and "name" in o for o in requested
        ):
            raise BadRequestError("'outputs' must be a list of objects with a 'name'.")
        names = [o["name"] for o in requested]
        unknown = [n for n in names if n not in result.outputs]
        if unknown:
            raise BadRequestError(
                f"The model has no outputs {unknown}. Outputs: {list(result.outputs)}"
            )
    answer: dict[str, Any] = {
        "model_name": name,
        "model_version": str(result.version),
        "outputs": [_output(n, result.outputs[n]) for n in names],
    }
    if "id" in body:
        answer["id"] = body["id"]
    return answer


def _array(item: dict[str, Any]) -> Any:
    shape = item["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadRequestError(f"Input {item['name']!r}: 'shape' must be a list of ints >= 0.")
    data = item["data"]
    if item["datatype"] == "BYTES":
        flat = np.asarray(data, dtype=object).reshape(-1)
        flat = np.array([v.encode() if isinstance(v, str) else v for v in flat], dtype=object)
    else:
        flat = np.asarray(data).reshape(-1)
    if flat.size != int(np.prod(shape)):
        raise BadRequestError(
            f"Input {item['name']!r} has {flat.size} values, but its shape {shape} "
            f"holds {int(np.prod(shape))}."
        )
    return flat.reshape(shape)


def _output(name: str, array: np.ndarray) -> dict[str, Any]:
    if array.dtype.kind in "OS":
        data: Any = [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
            for v in array.reshape(-1).tolist()
        ]
        datatype = "BYTES"
    else:
        data = array.reshape(-1)
        datatype = DATATYPES.get(array.dtype.name, array.dtype.name.upper())
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": data}
