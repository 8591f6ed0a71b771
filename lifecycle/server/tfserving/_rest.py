"""TensorFlow Serving's REST API (``g3doc/api_rest.md``) over the model service.

::

    GET  /v1/models/{m}[/versions/{v}|/labels/{l}]            model status
    GET  /v1/models/{m}[/versions/{v}|/labels/{l}]/metadata   signature_def
    POST /v1/models/{m}[/versions/{v}|/labels/{l}]:predict    instances / inputs
    POST /v1/models/{m}[/versions/{v}|/labels/{l}]:classify   examples -> [label, score]
    POST /v1/models/{m}[/versions/{v}|/labels/{l}]:regress    examples -> values

The status and metadata bodies are the JSON of TensorFlow Serving's own protos
(``GetModelStatusResponse``, ``SignatureDefMap``), produced by protobuf's
``json_format`` as TensorFlow Serving does. Every signature of a version is
served (a SavedModel's each, by ``signature_name``); ``:classify`` and
``:regress`` take ``tf.Example``s in JSON for signatures of those methods
(``_examples``).
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2

from ..._core._checks import LABEL_SYNTAX
from ..._registry import NamedTensorSpec, ServingSignature, VersionState, VersionStatus
from .._auth import http_sticky_key
from .._errors import BadRequestError
from .._http import blocking, json_response, read_body
from .._json import LazyList, as_array, dumps, loads, step_for
from .._service import ModelService
from .._shapes import check_shape
from ._examples import (
    CLASSIFY,
    REGRESS,
    b64_bytes,
    classifications,
    examples_from_json,
    is_b64,
    regressions,
    serve_examples,
)

__all__ = ["metadata", "routes", "signature_def_map", "status_response"]

_PATH = re.compile(
    r"(?P<name>[^/:]+)"
    rf"(?:/versions/(?P<version>\d+)|/labels/(?P<label>{LABEL_SYNTAX}))?"
    r"(?:(?P<metadata>/metadata)|:(?P<verb>[a-z]+))?"
)

_STATE = get_model_status_pb2.ModelVersionStatus.State
# VersionState -> ModelVersionStatus.State.
_STATES = {
    VersionState.LOADING: _STATE.LOADING,
    VersionState.READY: _STATE.AVAILABLE,
    VersionState.RETIRING: _STATE.UNLOADING,
    VersionState.UNLOADED: _STATE.END,
}


def routes(service: ModelService, max_request_bytes: int) -> list[Route]:
    """The routes of TensorFlow Serving's REST API."""

    async def models(request: Request) -> Response:
        match = _PATH.fullmatch(request.path_params["path"])
        if match is None:
            raise BadRequestError(
                f"Malformed request: {request.method} {request.url.path}. See "
                "TensorFlow Serving's REST API: /v1/models/<model>[/versions/<version>"
                "|/labels/<label>][/metadata|:predict]."
            )
        name, label = match["name"], match["label"]
        version = int(match["version"]) if match["version"] is not None else None
        if request.method == "GET":
            if match["verb"] is not None:
                raise BadRequestError(f"{request.url.path} takes POST, not GET.")
            if match["metadata"]:
                return json_response(await blocking(_metadata, service, name, version, label))
            statuses = await blocking(service.versions, name, version, label)
            return json_response(_as_dict(status_response(statuses)))
        verb = match["verb"]
        if verb not in ("predict", CLASSIFY, REGRESS):
            raise BadRequestError(
                f"The verbs served are :predict, :classify and :regress; received "
                f"{request.url.path!r}."
            )
        body = await read_body(request, max_request_bytes)
        key = http_sticky_key(request, service.config)
        return json_response(await blocking(_run, verb, service, name, version, label, body, key))

    return [Route("/v1/models/{path:path}", models, methods=["GET", "POST"])]


def status_response(
    statuses: tuple[VersionStatus, ...],
) -> get_model_status_pb2.GetModelStatusResponse:
    """TensorFlow Serving's ``GetModelStatusResponse`` for versions' statuses."""
    response = get_model_status_pb2.GetModelStatusResponse()
    for status in statuses:
        entry = response.model_version_status.add(
            version=status.version, state=_STATES[status.state]
        )
        entry.status.SetInParent()  # status OK: written out, as TensorFlow Serving does
    return response


def metadata(
    service: ModelService, name: str, version: int | None, label: str | None
) -> tuple[model_pb2.ModelSpec, get_model_metadata_pb2.SignatureDefMap]:
    """The version a metadata request means, as its ``model_spec``, and its signatures.

    The version and its signatures are read together (``ModelRegistry.peek``).

    Raises:
        UnknownModelError: No such model, version or label.
    """
    served, signatures = service.registry.peek(name, version=version, label=label)
    spec = model_pb2.ModelSpec(name=name)
    spec.version.value = served
    return spec, signature_def_map(signatures)


def signature_def_map(
    signatures: Mapping[str, ServingSignature],
) -> get_model_metadata_pb2.SignatureDefMap:
    """The ``SignatureDefMap`` of a version: each of its signatures by name.

    The tensors are named as a SavedModel's are: ``<signature>_<input>:0``, and
    ``StatefulPartitionedCall:<i>`` for the outputs.
    """
    definitions = get_model_metadata_pb2.SignatureDefMap()
    for name, signature in signatures.items():
        definition = definitions.signature_def[name]
        definition.method_name = signature.method_name
        for spec in signature.inputs:
            _tensor_info(definition.inputs[spec.name], spec, f"{name}_{spec.name}:0")
        for i, spec in enumerate(signature.outputs):
            _tensor_info(definition.outputs[spec.name], spec, f"StatefulPartitionedCall:{i}")
    return definitions


def _tensor_info(info: Any, spec: NamedTensorSpec, tensor_name: str) -> None:
    info.name = tensor_name
    info.dtype = tf.as_dtype(spec.dtype).as_datatype_enum
    for size in spec.shape:
        info.tensor_shape.dim.add(size=-1 if size is None else size)


def _as_dict(message: Message) -> dict[str, Any]:
    """A message as TensorFlow Serving's REST API writes it: proto field names, every field."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _metadata(
    service: ModelService, name: str, version: int | None, label: str | None
) -> dict[str, Any]:
    spec, signatures = metadata(service, name, version, label)
    return {"model_spec": _as_dict(spec), "metadata": {"signature_def": _as_dict(signatures)}}


def _run(
    verb: str,
    service: ModelService,
    name: str,
    version: int | None,
    label: str | None,
    body: bytearray,
    key: str | None,
) -> bytes:
    """One verb's request, on a worker thread: the body parsed, run, the answer written.

    Parsing and writing go in pieces (``_json``), so that the event loop, and
    the health checks it answers, never wait long for the GIL. ``:classify``
    and ``:regress`` take ``{"examples": [...], "context"?: {...}}`` and answer
    ``{"result": ...}``.
    """
    config = service.config
    parsed = loads(body, config.max_json_depth, "The request body", numbers=verb == "predict")
    if not isinstance(parsed, dict):
        raise BadRequestError("The request body must be a JSON object.")
    signature_name = parsed.get("signature_name")
    if signature_name is not None and not isinstance(signature_name, str):
        raise BadRequestError(f"'signature_name' must be a string. Received: {signature_name!r}")
    model = (name, version, label)
    if verb == "predict":
        return dumps(_predict(service, model, signature_name or None, parsed, key))
    if "examples" not in parsed:
        raise BadRequestError(
            f"A :{verb} request body must be an object with 'examples' (and optionally "
            "'context' and 'signature_name')."
        )
    read = functools.partial(examples_from_json, parsed["examples"], parsed.get("context"))
    _, outputs = serve_examples(service, model, signature_name or None, verb, key, read)
    result = classifications(outputs) if verb == CLASSIFY else regressions(outputs)
    return dumps({"result": result})


def _predict(
    service: ModelService,
    model: tuple[str, int | None, str | None],
    signature_name: str | None,
    body: dict[str, Any],
    key: str | None,
) -> dict[str, Any]:
    if ("instances" in body) == ("inputs" in body):
        raise BadRequestError(
            "The request must have exactly one of 'instances' (row format) or "
            "'inputs' (columnar format)."
        )
    rows = "instances" in body
    name, version, label = model
    max_rows = service.config.max_request_rows
    # One version from decoding to answer: in an A/B split, the inputs are read
    # by the names of the version that runs them.
    with service.registry.serving(name, version=version, label=label, key=key) as lease:
        specs = {spec.name: spec for spec in lease.signature_named(signature_name).inputs}
        named = _named(body["instances"] if rows else body["inputs"], rows, list(specs))
        inputs = {k: _input(k, specs.get(k), value, max_rows) for k, value in named.items()}
        result = lease.infer(inputs, signature_name)
    outputs = {k: _jsonable(k, value) for k, value in result.outputs.items()}
    if len(outputs) == 1:
        return {"predictions" if rows else "outputs": next(iter(outputs.values()))}
    if not rows:
        return {"outputs": outputs}
    arrays = result.outputs
    batch = len(next(iter(arrays.values())))

    def instances(start: int, stop: int) -> list[dict[str, Any]]:
        columns = {k: _json_values(k, v[start:stop]) for k, v in arrays.items()}
        return [{k: v[i] for k, v in columns.items()} for i in range(min(stop, batch) - start)]

    width = sum(v[0].size if v.ndim > 1 else 1 for v in arrays.values())
    return {"predictions": LazyList(batch, instances, step_for(width))}


def _named(value: Any, rows: bool, names: list[str]) -> dict[str, Any]:
    """A body's ``instances`` (``rows``) or ``inputs`` as ``{input name: its values}``.

    An object names the inputs (in ``instances``, every item does); anything
    else is the values of a model's only input.
    """
    if rows:
        if not isinstance(value, (list, np.ndarray)) or not len(value):
            raise BadRequestError("'instances' must be a non-empty list, one item per example.")
        if isinstance(value, list):  # an array (see _json.loads) holds numbers only
            named = [isinstance(item, dict) and not is_b64(item) for item in value]
            if all(named):
                keys = set(value[0])
                if any(set(item) != keys for item in value):
                    raise BadRequestError(
                        "Every object in 'instances' must name the same inputs; "
                        f"the first names {sorted(keys)}."
                    )
                return {key: [item[key] for item in value] for key in keys}
            if any(named):
                raise BadRequestError("'instances' mixes named objects and plain values.")
    elif isinstance(value, dict) and not is_b64(value):
        return value
    if len(names) != 1:
        where = "each instance" if rows else "'inputs'"
        raise BadRequestError(
            f"The model has {len(names)} inputs {names}: {where} must be an object naming them."
        )
    return {names[0]: value}


def _input(name: str, spec: NamedTensorSpec | None, value: Any, max_rows: int) -> Any:
    """An input's JSON value as the model takes it: numbers as one array, b64 as bytes.

    Its rows are counted against ``--max_request_rows`` first. Rows of numbers
    become an array of the input's dtype a block of rows at a time (one
    ``np.asarray`` of them all would hold the GIL throughout). Anything else
    goes on as JSON gave it, for the signature's check.
    """
    if isinstance(value, (list, np.ndarray)):  # before any array is made of it
        check_shape(name, [len(value)], max_rows=max_rows)
    if spec is not None and spec.dtype != "string":
        array = as_array(value, np.dtype(tf.as_dtype(spec.dtype).as_numpy_dtype))
        if array is not None:
            return array
    return value if isinstance(value, np.ndarray) else _decode_b64(name, value)


def _decode_b64(name: str, value: Any) -> Any:
    """``{"b64": "..."}`` objects, anywhere in input ``name``'s value, as the bytes they encode."""
    if is_b64(value):
        return b64_bytes(value, f"Input {name!r}")
    if isinstance(value, list):
        # A row of numbers or strings holds nothing to decode: the types of its
        # items, gathered in C, instead of a call per item (JSON gives exact types).
        kinds = set(map(type, value))
        if dict not in kinds and list not in kinds:
            return value
        return [_decode_b64(name, item) for item in value]
    return value


def _jsonable(name: str, array: np.ndarray) -> Any:
    """An output as JSON (see :func:`_json_values`), written a block of rows at a time."""
    if not array.ndim:
        return _json_values(name, array)
    return LazyList(
        len(array),
        lambda start, stop: _json_values(name, array[start:stop]),
        step_for(array[0].size),
    )


def _json_values(name: str, array: np.ndarray) -> Any:
    """Values of an output as JSON: numbers as they are, strings as text, ``*_bytes`` as b64."""
    if array.dtype.kind not in "OSU":
        return array.tolist()

    def convert(value: Any) -> Any:
        if isinstance(value, list):
            return [convert(item) for item in value]
        if not isinstance(value, bytes):
            return value
        if name.endswith("_bytes"):
            return {"b64": base64.b64encode(value).decode("ascii")}
        return value.decode("utf-8", errors="replace")

    return convert(array.tolist())
