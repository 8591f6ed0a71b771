"""KServe's v2 REST protocol (the Open Inference Protocol) over the model service.

::

    GET  /v2/health/live | /v2/health/ready           200, or 400 when not
    GET  /v2                                          server metadata
    GET  /v2/models/{m}[/versions/{v}]                model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready          200, or 400 when not
    POST /v2/models/{m}[/versions/{v}]/infer          tensors in and out: JSON or binary
    POST /v2/repository/index                         the model repository extension
    POST /v2/repository/models/{m}/load | /unload

Tensors travel as JSON (``data`` flat in row-major order, or nested), or with
the binary tensor data extension, tritonclient's default: the JSON part first,
its length in the header ``Inference-Header-Content-Length``, then each binary
input's raw bytes in the order of ``inputs``, each sized by its
``parameters.binary_data_size``. An output is answered in binary when the
request asks so for it (``parameters.binary_data: true``) or for all that say
nothing (the request's ``parameters.binary_data_output: true``); such an
answer is ``application/octet-stream`` with the same header, each binary
output's size in its ``parameters.binary_data_size``. An answer without
binary outputs is JSON, as is every answer to a request that asks none.
Tensors are read and written by ``_tensors``. The protocol's steps (server
and model metadata, model readiness, the repository index, :func:`infer`) are
written once, here, and called by both faces: these routes and the gRPC
service (``_grpc``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..._registry import VersionState
from ...errors import UnknownModelError
from .._auth import authorize_http as authorize
from .._auth import http_sticky_key as sticky_key
from .._errors import BadRequestError
from .._http import blocking, json_response, read_body, read_json
from .._json import dumps, loads
from .._service import ModelService
from .._shapes import check_shape
from ._tensors import DATATYPES, Decoder, from_json, from_raw, tensor_metadata, to_json, to_raw

__all__ = [
    "HEADER_LENGTH",
    "infer",
    "model_metadata",
    "model_ready",
    "repository_index",
    "routes",
    "server_metadata",
]

#: The binary tensor data extension's header: the length of the body's JSON part.
HEADER_LENGTH = "Inference-Header-Content-Length"


def routes(service: ModelService, max_request_bytes: int) -> list[Route]:
    """The routes of the v2 protocol and its model repository extension."""

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        return json_response({"ready": service.ready}, 200 if service.ready else 400)

    async def server(request: Request) -> Response:
        return json_response(server_metadata())

    async def model(request: Request) -> Response:
        name, version = _model(request)
        return json_response(await blocking(model_metadata, service, name, version))

    async def is_ready(request: Request) -> Response:
        name, version = _model(request)
        answer = await blocking(model_ready, service, name, version)
        return json_response({"name": name, "ready": answer}, 200 if answer else 400)

    async def run(request: Request) -> Response:
        name, version = _model(request)
        encoding = request.headers.get("content-encoding", "identity")
        if encoding.strip().lower() != "identity":
            raise BadRequestError(
                f"Content-Encoding {encoding!r} is not supported: send the request body "
                "uncompressed."
            )
        body = await read_body(request, max_request_bytes)
        length = request.headers.get(HEADER_LENGTH)
        key = sticky_key(request, service.config)
        answer, head = await blocking(_run_infer, service, name, version, body, length, key)
        if head is None:
            return json_response(answer)
        return Response(
            answer, media_type="application/octet-stream", headers={HEADER_LENGTH: str(head)}
        )

    async def index(request: Request) -> Response:
        body = await read_json(request, max_request_bytes, empty={})
        only_ready = isinstance(body, dict) and body.get("ready") is True
        return json_response(await blocking(repository_index, service, only_ready))

    def admin(call: Callable[[str], None]) -> Callable[[Request], Any]:
        async def repository(request: Request) -> Response:
            authorize(request, service.config)  # an admin call
            await blocking(call, request.path_params["name"])
            return json_response({})

        return repository

    path = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version:int}"
    return [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server),
        Route(path, model),
        Route(versioned, model),
        Route(f"{path}/ready", is_ready),
        Route(f"{versioned}/ready", is_ready),
        Route(f"{path}/infer", run, methods=["POST"]),
        Route(f"{versioned}/infer", run, methods=["POST"]),
        Route("/v2/repository/index", index, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", admin(service.load), methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", admin(service.unload), methods=["POST"]),
    ]


# -- what both transports answer (REST here, gRPC in _grpc) -----------------------------


def server_metadata() -> dict[str, Any]:
    """The server's name, version and protocol extensions."""
    return {
        "name": "keras-lifecycle",
        "version": metadata.version("keras-lifecycle"),
        "extensions": ["model_repository", "binary_tensor_data"],
    }


def model_metadata(service: ModelService, name: str, version: int | None) -> dict[str, Any]:
    """A model's versions and the inputs and outputs of ``version`` (the default: None).

    Raises:
        UnknownModelError: No such model or version.
    """
    signature = service.registry.signature(name, version=version)
    return {
        "name": name,
        "versions": [str(s.version) for s in service.registry.status(name)],
        "platform": "tensorflow_keras",
        "inputs": [tensor_metadata(s.name, s.dtype, s.shape) for s in signature.inputs],
        "outputs": [tensor_metadata(s.name, s.dtype, s.shape) for s in signature.outputs],
    }


def model_ready(service: ModelService, name: str, version: int | None) -> bool:
    """Whether ``name`` (``version`` of it, if given) has a version ready to serve."""
    try:
        statuses = service.versions(name, version)
    except UnknownModelError:
        return False
    return any(s.state is VersionState.READY for s in statuses)


def repository_index(service: ModelService, only_ready: bool) -> list[dict[str, str]]:
    """The repository's models: each loaded version, and every model not loaded."""
    return [
        {"name": name, "version": "" if v is None else str(v), "state": state}
        for name, v, state in service.repository()
        if not only_ready or state == "READY"
    ]


def infer(
    service: ModelService,
    name: str,
    version: int | None,
    key: str | None,
    inputs: Sequence[tuple[str, str, list[int], Decoder, Any]],
    requested: Sequence[str] | None,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Run a request on the version it resolves to: its answer, and the outputs' arrays.

    The version is resolved once (:meth:`ModelRegistry.serving`), and each
    input is checked against its signature before its values are read: its
    name, its datatype, and its declared shape (rank, known dimensions,
    ``--max_request_rows``); its decoder then takes exactly the values that
    shape holds.

    Args:
        service: The server's models and configuration.
        name: The model.
        version: The version asked for; ``None``: the model's routing decides.
        key: The request's sticky routing key, if any.
        inputs: ``(name, datatype, shape, decoder, data)`` of each input as the
            request sends it, the shape a list of ints.
        requested: The outputs asked for, in order; ``None``: all of the model's.

    Returns:
        The answer's ``model_name``, ``model_version`` and ``outputs`` (each
        output's name, datatype and shape, its values for the face to add),
        and the arrays of those outputs, in order.

    Raises:
        BadRequestError: An input is given twice, its datatype or shape is not
            the model's, its values do not fill its shape, or a requested
            output is not the model's.
        ValueError: The model has no such input.
        UnknownModelError: No such model or version.
    """
    max_rows = service.config.max_request_rows
    with service.registry.serving(name, version=version, key=key) as lease:
        decoded: dict[str, Any] = {}
        for input_name, datatype, shape, decode, data in inputs:
            spec = lease.signature.input(input_name)
            if spec.name in decoded:
                raise BadRequestError(f"Input {spec.name!r} appears twice in the request.")
            expected = DATATYPES.get(spec.dtype)
            if datatype != expected:
                raise BadRequestError(
                    f"Input {spec.name!r} has datatype {datatype!r}; the model takes {expected!r}."
                )
            # The declared shape alone, before any value is read.
            check_shape(spec.name, shape, spec, max_rows)
            decoded[spec.name] = decode(spec.name, datatype, shape, data)
        outputs = [spec.name for spec in lease.signature.outputs]
        unknown = [output for output in requested or () if output not in outputs]
        if unknown:
            raise BadRequestError(f"The model has no outputs {unknown}. Outputs: {outputs}")
        result = lease.infer(decoded)
    names = outputs if requested is None else requested
    arrays = [(output, result.outputs[output]) for output in names]
    answer = {
        "model_name": name,
        "model_version": str(result.version),
        "outputs": [tensor_metadata(output, array.dtype, array.shape) for output, array in arrays],
    }
    return answer, [array for _, array in arrays]


# -- REST's infer ---------------------------------------------------------------------------


def _model(request: Request) -> tuple[str, int | None]:
    return request.path_params["name"], request.path_params.get("version")


def _run_infer(
    service: ModelService,
    name: str,
    version: int | None,
    body: bytearray,
    length: str | None,
    key: str | None,
) -> tuple[bytes, int | None]:
    """A v2 request on a worker thread, from its body to its answer's bytes.

    Returns:
        The answer, and the length of its JSON part if binary outputs follow
        it (``None``: all JSON). Parsing and writing go in pieces (``_json``),
        so that the event loop, and the health checks it answers, never wait
        long for the GIL.
    """
    request, binary = _split(body, length, service.config.max_json_depth)
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequestError("The request body must be an object with an 'inputs' list.")
    inputs = _inputs(request["inputs"], binary)
    requested, binary_outputs = _requested_outputs(request)
    answer, arrays = infer(service, name, version, key, inputs, requested)
    parts = []
    for tensor, array in zip(answer["outputs"], arrays, strict=True):
        if binary_outputs(tensor["name"]):
            parts.append(to_raw(array))
            tensor["parameters"] = {"binary_data_size": len(parts[-1])}
        else:
            tensor["data"] = to_json(array)
    if "id" in request:
        answer["id"] = request["id"]
    head = dumps(answer)
    if not parts:
        return head, None
    return b"".join([head, *parts]), len(head)


def _split(body: bytearray, length: str | None, max_depth: int) -> tuple[Any, memoryview]:
    """The body's JSON part, parsed, and the binary data after it.

    Raises:
        BadRequestError: The header is not a byte count within the body, or the
            JSON part is not UTF-8 JSON, or nests deeper than ``max_depth``.
    """
    if length is None:
        return loads(body, max_depth, "The request body", numbers=True), memoryview(b"")
    if not length.strip().isdigit():
        raise BadRequestError(
            f"{HEADER_LENGTH} must be the byte length of the body's JSON part. Received: {length!r}"
        )
    size = int(length)
    if size > len(body):
        raise BadRequestError(
            f"{HEADER_LENGTH} is {size}, beyond the body's end: the body has {len(body)} bytes."
        )
    view = memoryview(body)
    what = f"The body's JSON part (its first {size} bytes, as {HEADER_LENGTH} says)"
    try:
        return loads(view[:size], max_depth, what, numbers=True), view[size:]
    except BadRequestError:
        try:
            bytes(view[:size]).decode("utf-8")
        except UnicodeDecodeError as bad:
            raise BadRequestError(f"{what} is not valid UTF-8: {bad}") from None
        raise


def _parameters(owner: str, item: dict[str, Any]) -> dict[str, Any]:
    parameters = item.get("parameters", {})
    if not isinstance(parameters, dict):
        raise BadRequestError(f"{owner}: 'parameters' must be an object.")
    if "shared_memory_region" in parameters:
        raise BadRequestError(
            f"{owner} names a shared memory region, which this server does not support: "
            "send the tensor in the request body."
        )
    return parameters


def _inputs(items: list[Any], binary: memoryview) -> list[tuple[str, str, list[int], Decoder, Any]]:
    """Each input as :func:`infer` takes it: its JSON ``data``, or its bytes of the binary data.

    Raises:
        BadRequestError: An input is malformed, or the binary sizes do not add
            up to the binary data after the JSON part.
    """
    inputs: list[tuple[str, str, list[int], Decoder, Any]] = []
    offset = 0
    for item in items:
        if not isinstance(item, dict) or not {"name", "shape", "datatype"} <= set(item):
            raise BadRequestError(
                "Each input must be an object with 'name', 'shape', 'datatype' and 'data' "
                "(or, in binary, 'parameters': {'binary_data_size': <bytes>})."
            )
        name, shape = item["name"], item["shape"]
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise BadRequestError(f"Input {name!r}: 'shape' must be a list of ints >= 0.")
        size = _parameters(f"Input {name!r}", item).get("binary_data_size")
        if size is None:
            if "data" not in item:
                raise BadRequestError(
                    f"Input {name!r} has neither 'data' nor 'parameters.binary_data_size'."
                )
            inputs.append((name, item["datatype"], shape, from_json, item["data"]))
            continue
        if "data" in item:
            raise BadRequestError(
                f"Input {name!r} has both 'data' and 'parameters.binary_data_size': "
                "send it one way."
            )
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequestError(
                f"Input {name!r}: binary_data_size must be a byte count >= 0. Received: {size!r}"
            )
        if offset + size > len(binary):
            raise BadRequestError(
                f"Input {name!r} has binary_data_size {size} at byte {offset} of the "
                f"binary data, which has only {len(binary)} bytes after the JSON part"
                + ("" if len(binary) else f" (is the {HEADER_LENGTH} header missing?)")
                + "."
            )
        inputs.append((name, item["datatype"], shape, from_raw, binary[offset : offset + size]))
        offset += size
    if offset != len(binary):
        raise BadRequestError(
            f"The body has {len(binary)} bytes of binary data after its JSON part, but the "
            f"inputs' binary_data_size add up to {offset}."
        )
    return inputs


def _requested_outputs(body: dict[str, Any]) -> tuple[list[str] | None, Any]:
    """The outputs asked for (``None``: all), and which of them go in binary.

    An output goes in binary if it asks so (``parameters.binary_data``), or
    says nothing and the request asks binary for all
    (``parameters.binary_data_output``), as Triton decides.
    """
    default = _parameters("The request", body).get("binary_data_output") is True
    requested = body.get("outputs")
    if requested is None:
        return None, lambda name: default
    if not isinstance(requested, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in requested
    ):
        raise BadRequestError("'outputs' must be a list of objects with a 'name'.")
    binary = {
        o["name"]: _parameters(f"Output {o['name']!r}", o).get("binary_data", default) is True
        for o in requested
    }
    return [o["name"] for o in requested], lambda name: binary.get(name, default)
