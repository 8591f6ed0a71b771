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
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tensorflow.core.protobuf import meta_graph_pb2
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
    classifications,
    examples_from_json,
    regressions,
    run_examples,
)

__all__ = ["SIGNATURE", "routes", "signature_def", "signature_def_map", "status_response"]

SIGNATURE = "serving_default"

_PATH = re.compile(
    r"(?P<name>[^/:]+)"
    rf"(?:/versions/(?P<version>\d+)|/labels/(?P<label>{LABEL_SYNTAX}))?"
    r"(?:(?P<metadata>/metadata)|:(?P<verb>[a-z]+))?"
)

# VersionState -> ModelVersionStatus.State.
_STATES = {
    VersionState.LOADING: "LOADING",
    VersionState.READY: "AVAILABLE",
    VersionState.RETIRING: "UNLOADING",
    VersionState.UNLOADED: "END",
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
            return json_response(_status_body(statuses))
        verb = match["verb"]
        if verb not in _VERBS:
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
        entry = response.model_version_status.add()
        entry.version = status.version
        entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(_STATES[status.state])
        entry.status.error_message = ""
    return response


def _status_body(statuses: tuple[VersionStatus, ...]) -> dict[str, Any]:
    return json_format.MessageToDict(
        status_response(statuses),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def _metadata(
    service: ModelService, name: str, version: int | None, label: str | None
) -> dict[str, Any]:
    served, found = service.registry.peek(name, version=version, label=label)
    spec = model_pb2.ModelSpec(name=name, signature_name="")
    spec.version.value = served
    signatures = signature_def_map(found)
    options = {"preserving_proto_field_name": True, "always_print_fields_with_no_presence": True}
    return {
        "model_spec": json_format.MessageToDict(spec, **options),
        "metadata": {"signature_def": json_format.MessageToDict(signatures, **options)},
    }


def signature_def_map(
    signatures: Mapping[str, ServingSignature],
) -> get_model_metadata_pb2.SignatureDefMap:
    """The ``SignatureDefMap`` of a version: each of its signatures by name."""
    definitions = get_model_metadata_pb2.SignatureDefMap()
    for name, signature in signatures.items():
        definitions.signature_def[name].CopyFrom(signature_def(signature, name))
    return definitions


def signature_def(
    signature: ServingSignature, name: str = SIGNATURE
) -> meta_graph_pb2.SignatureDef:
    """The ``SignatureDef`` of a signature, its tensors named as a SavedModel's are."""
    result = meta_graph_pb2.SignatureDef(method_name=signature.method_name)
    for spec in signature.inputs:
        _tensor_info(result.inputs[spec.name], spec, f"{name}_{spec.name}:0")
    for i, spec in enumerate(signature.outputs):
        _tensor_info(result.outputs[spec.name], spec, f"StatefulPartitionedCall:{i}")
    return result


def _tensor_info(info: Any, spec: Any, tensor_name: str) -> None:
    info.name = tensor_name
    info.dtype = tf.as_dtype(spec.dtype).as_datatype_enum
    for size in spec.shape:
        info.tensor_shape.dim.add(size=-1 if size is None else size)


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
    the health checks it answers, never wait long for the GIL.
    """
    config = service.config
    parsed = loads(body, config.max_json_depth, "The request body", numbers=verb == "predict")
    return dumps(_VERBS[verb](service, name, version, label, parsed, key))


def _predict(
    service: ModelService,
    name: str,
    version: int | None,
    label: str | None,
    body: Any,
    key: str | None,
) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequestError("The request body must be a JSON object.")
    wanted = _signature_name(body)
    if ("instances" in body) == ("inputs" in body):
        raise BadRequestError(
            "The request must have exactly one of 'instances' (row format) or "
            "'inputs' (columnar format)."
        )
    rows = "instances" in body
    max_rows = service.config.max_request_rows
    # One version from decoding to answer: in an A/B split, the inputs are read
    # by the names of the version that runs them.
    with service.registry.serving(name, version=version, label=label, key=key) as lease:
        specs = {spec.name: spec for spec in lease.signature_named(wanted).inputs}
        inputs = (
            _from_rows(body["instances"], list(specs))
            if rows
            else _from_columns(body["inputs"], list(specs))
        )
        for key, value in inputs.items():  # before any array is made of them
            if isinstance(value, (list, np.ndarray)):
                check_shape(key, [len(value)], max_rows=max_rows)
        inputs = {key: _input(specs.get(key), value) for key, value in inputs.items()}
        result = lease.infer(inputs, wanted)
    outputs = {key: _jsonable(key, value) for key, value in result.outputs.items()}
    if not rows:
        return {"outputs": next(iter(outputs.values())) if len(outputs) == 1 else outputs}
    if len(outputs) == 1:
        return {"predictions": next(iter(outputs.values()))}
    arrays = result.outputs
    batch = len(next(iter(arrays.values())))

    def instances(start: int, stop: int) -> list[dict[str, Any]]:
        columns = {k: _json_values(k, v[start:stop]) for k, v in arrays.items()}
        return [{k: v[i] for k, v in columns.items()} for i in range(min(stop, batch) - start)]

    width = sum(v[0].size if v.ndim > 1 else 1 for v in arrays.values())
    return {"predictions": LazyList(batch, instances, step_for(width))}


def _signature_name(body: dict[str, Any]) -> str | None:
    """The body's ``signature_name``; ``None`` for the default one."""
    wanted = body.get("signature_name")
    if wanted is not None and not isinstance(wanted, str):
        raise BadRequestError(f"'signature_name' must be a string. Received: {wanted!r}")
    return wanted or None


def _examples_verb(verb: str) -> Callable[..., dict[str, Any]]:
    """``:classify`` or ``:regress``: ``{"examples": [...], "context"?: {...}}`` -> ``result``."""

    def run(
        service: ModelService,
        name: str,
        version: int | None,
        label: str | None,
        body: Any,
        key: str | None,
    ) -> dict[str, Any]:
        if not isinstance(body, dict) or "examples" not in body:
            raise BadRequestError(
                f"A :{verb} request body must be an object with 'examples' (and optionally "
                "'context' and 'signature_name')."
            )
        config = service.config
        with service.registry.serving(name, version=version, label=label, key=key) as lease:
            # Read (and expanded with the context) only once the signature takes them.
            outputs = run_examples(
                lease,
                _signature_name(body),
                verb,
                lambda: examples_from_json(
                    body["examples"],
                    body.get("context"),
                    max_rows=config.max_request_rows,
                    max_bytes=config.max_request_bytes,
                ),
            )
        if verb == CLASSIFY:
            return {"result": [[list(pair) for pair in row] for row in classifications(outputs)]}
        return {"result": regressions(outputs)}

    return run


def _from_rows(instances: Any, names: list[str]) -> dict[str, Any]:
    if not isinstance(instances, (list, np.ndarray)) or not len(instances):
        raise BadRequestError("'instances' must be a non-empty list, one item per example.")
    if isinstance(instances, list):  # an array (see _json.loads) holds numbers only
        named = [isinstance(item, dict) and not _is_b64(item) for item in instances]
        if all(named):
            keys = set(instances[0])
            if any(set(item) != keys for item in instances):
                raise BadRequestError(
                    "Every object in 'instances' must name the same inputs; "
                    f"the first names {sorted(keys)}."
                )
            return {key: [item[key] for item in instances] for key in keys}
        if any(named):
            raise BadRequestError("'instances' mixes named objects and plain values.")
    if len(names) != 1:
        raise BadRequestError(
            f"The model has {len(names)} inputs {names}: each instance must be an "
            "object naming them."
        )
    return {names[0]: instances}


def _from_columns(inputs: Any, names: list[str]) -> dict[str, Any]:
    if isinstance(inputs, dict) and not _is_b64(inputs):
        return inputs
    if len(names) != 1:
        raise BadRequestError(
            f"The model has {len(names)} inputs {names}: 'inputs' must be an object naming them."
        )
    return {names[0]: inputs}


def _input(spec: NamedTensorSpec | None, value: Any) -> Any:
    """An input's JSON value as the model takes it: numbers as one array, b64 as bytes.

    Rows of numbers become an array of the input's dtype a block of rows at a
    time (one ``np.asarray`` of them all would hold the GIL throughout).
    Anything else goes on as JSON gave it, for the signature's check.
    """
    if spec is not None and spec.dtype != "string":
        array = as_array(value, np.dtype(tf.as_dtype(spec.dtype).as_numpy_dtype))
        if array is not None:
            return array
    return value if isinstance(value, np.ndarray) else _decode_b64(value)


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"b64"}


def _decode_b64(value: Any) -> Any:
    """``{"b64": "..."}`` objects, anywhere in ``value``, as the bytes they encode."""
    if _is_b64(value):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError) as error:
            raise BadRequestError(f"A 'b64' value is not valid base64: {error}") from None
    if isinstance(value, list):
        # A row of numbers or strings holds nothing to decode: the types of its
        # items, gathered in C, instead of a call per item (JSON gives exact types).
        kinds = set(map(type, value))
        if dict not in kinds and list not in kinds:
            return value
        return [_decode_b64(item) for item in value]
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


# The verbs of ``/v1/models/...:<verb>``.
_VERBS: dict[str, Callable[..., dict[str, Any]]] = {
    "predict": _predict,
    CLASSIFY: _examples_verb(CLASSIFY),
    REGRESS: _examples_verb(REGRESS),
}
