"""Every decoder of ``lifecycle serve``, driven with generated input (hypothesis).

Properties, for every input (``tests/support/fuzzing.py``): the decoder returns a
value or raises the library's error for bad input, never another exception; and
what it allocates is bounded by the input's size. ``make test`` runs a bounded,
derandomized number of inputs per decoder; ``make fuzz`` a long random run, with
``tests/test_server_json.py``'s (JSON parsed in pieces is orjson's whole parse).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import orjson
from hypothesis import given
from hypothesis import strategies as st
from support.fuzzing import FUZZ, JSON, SHAPES, SIZES, TENSORS, bounded_allocation, tokens
from support.models import constant_model, pair_model, words_model
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import input_pb2

import lifecycle as lc
from lifecycle import NamedTensorSpec
from lifecycle.server import ModelService, ServerConfig, _json
from lifecycle.server._config import read_batching_parameters, read_model_config
from lifecycle.server._errors import BadRequestError, PayloadTooLargeError, error_status
from lifecycle.server.kserve import _rest as kserve_rest
from lifecycle.server.tfserving import _rest as tfserving_rest
from lifecycle.server.tfserving._examples import examples_from_input, examples_from_json
from lifecycle.server.tfserving._tensorproto import decode_tensor_proto

# -- files an operator writes: the model config and the batching parameters ------------------

_BASE = Path(tempfile.mkdtemp(prefix="lifecycle-fuzz-"))
(_BASE / "m" / "1").mkdir(parents=True)

CONFIG_WORDS = [
    "model_config_list",
    "{",
    "}",
    "config",
    "name:",
    '"m"',
    "base_path:",
    f'"{_BASE / "m"}"',
    f'"{_BASE}"',
    '"/nonexistent"',
    "model_platform:",
    '"tensorflow"',
    "model_version_policy",
    "specific",
    "versions:",
    "latest",
    "num_versions:",
    "all",
    "version_labels",
    "key:",
    '"stable"',
    "value:",
    "1",
    "[",
    "]",
    ",",
    ":",
    "<",
    ">",
    "# comment\n",
    "custom_model_config",
]

BATCHING_WORDS = [
    "max_batch_size",
    "batch_timeout_micros",
    "max_enqueued_batches",
    "num_batch_threads",
    "thread_pool_name",
    "allowed_batch_sizes:",
    "pad_variable_length_inputs:",
    "true",
    "false",
    "{",
    "}",
    "value:",
    '"pool"',
    "[",
    "]",
    ",",
    "8",
    "32",
    "0",
    "-1",
]


_HOSTILE_INTS = st.one_of(st.integers(-3, 4), st.sampled_from([2**31, 2**63 - 1, 2**64, -(2**63)]))
_NAMES = st.sampled_from(["m", "n", "", "a/b", "..", "m m", "\\x00", "é"])


@st.composite
def _config_entry(draw: st.DrawFn) -> str:
    fields = [f'name: "{draw(_NAMES)}"']
    base = draw(st.sampled_from([_BASE / "m", _BASE, _BASE / "m" / "1", "/nonexistent", ""]))
    fields.append(f'base_path: "{base}"')
    if draw(st.booleans()):
        fields.append(f'model_platform: "{draw(st.sampled_from(["tensorflow", "onnx", ""]))}"')
    policy = draw(st.sampled_from(["", "all {}", "latest", "specific"]))
    if policy == "latest":
        fields.append(
            f"model_version_policy {{ latest {{ num_versions: {draw(_HOSTILE_INTS)} }} }}"
        )
    elif policy == "specific":
        versions = " ".join(f"versions: {v}" for v in draw(st.lists(_HOSTILE_INTS, max_size=3)))
        fields.append(f"model_version_policy {{ specific {{ {versions} }} }}")
    elif policy:
        fields.append(f"model_version_policy {{ {policy} }}")
    for key, value in draw(st.dictionaries(_NAMES, _HOSTILE_INTS, max_size=2)).items():
        fields.append(f'version_labels {{ key: "{key}" value: {value} }}')
    return "config { " + " ".join(fields) + " }"


_CONFIGS = st.lists(_config_entry(), max_size=3).map(
    lambda entries: "model_config_list { " + " ".join(entries) + " }"
)


@st.composite
def _batching_text(draw: st.DrawFn) -> str:
    fields = []
    for name in ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches"):
        if draw(st.booleans()):
            fields.append(f"{name} {{ value: {draw(_HOSTILE_INTS)} }}")
    if draw(st.booleans()):
        fields.append(f"num_batch_threads {{ value: {draw(_HOSTILE_INTS)} }}")
    sizes = draw(st.lists(_HOSTILE_INTS, max_size=4))
    if sizes:
        fields.append(f"allowed_batch_sizes: [{', '.join(map(str, sizes))}]")
    if draw(st.booleans()):
        fields.append(f"pad_variable_length_inputs: {draw(st.sampled_from(['true', 'false']))}")
    return "\n".join(fields)


def _file(tmp: Path, text: str) -> str:
    path = tmp / "file.pbtxt"
    path.write_text(text, encoding="utf-8")
    return str(path)


@FUZZ
@given(text=st.one_of(_CONFIGS, tokens(CONFIG_WORDS)))
def test_the_model_config_file(text: str) -> None:
    path = _file(_BASE, text)
    try:
        with bounded_allocation(len(text.encode()), "--model_config_file"):
            read_model_config(path)
    except (ValueError, FileNotFoundError) as error:
        assert "--model_config_file" in str(error), error


@FUZZ
@given(text=st.one_of(_batching_text(), tokens(BATCHING_WORDS)))
def test_the_batching_parameters_file(text: str) -> None:
    path = _file(_BASE, text)
    try:
        with bounded_allocation(len(text.encode()), "--batching_parameters_file"):
            read_batching_parameters(path)
    except ValueError as error:
        assert "--batching_parameters_file" in str(error), error


@FUZZ
@given(text=st.text(max_size=200))
def test_the_config_files_with_any_text(text: str) -> None:
    path = _file(_BASE, text)
    for read, flag in (
        (read_model_config, "--model_config_file"),
        (read_batching_parameters, "--batching_parameters_file"),
    ):
        try:
            read(path)
        except (ValueError, FileNotFoundError) as error:
            assert flag in str(error), error


# -- gRPC: TensorProto (TensorFlow Serving's Predict) ----------------------------------------

_DTYPES = [1, 2, 3, 4, 5, 6, 7, 9, 10, 14, 17, 19, 22, 23, 8, 18, 11, 20, 101]  # DataType values
_SPEC = NamedTensorSpec("x", "float32", (None, 4))
_FIELDS = [
    *("", "float_val", "double_val", "int_val", "int64_val", "string_val", "half_val"),
    *("bool_val", "scomplex_val", "uint32_val", "uint64_val", "tensor_content"),
]


@st.composite
def _tensor_protos(draw: st.DrawFn) -> bytes:
    proto = tensor_pb2.TensorProto(dtype=draw(st.sampled_from(_DTYPES)))
    if draw(st.booleans()):
        proto.tensor_shape.unknown_rank = draw(st.booleans())
    for size in draw(SHAPES):
        proto.tensor_shape.dim.add(size=max(min(size, 2**63 - 1), -(2**63)))
    field = draw(st.sampled_from(_FIELDS))
    if field == "tensor_content":
        proto.tensor_content = draw(st.binary(max_size=64))
    elif field == "string_val":
        proto.string_val.extend(draw(st.lists(st.binary(max_size=8), max_size=8)))
    elif field in ("float_val", "double_val", "scomplex_val"):
        getattr(proto, field).extend(draw(st.lists(st.floats(width=32), max_size=8)))
    elif field == "bool_val":
        proto.bool_val.extend(draw(st.lists(st.booleans(), max_size=8)))
    elif field:
        bits = {"int_val": 31, "half_val": 31, "uint32_val": 32, "uint64_val": 64}.get(field, 63)
        low = 0 if field.startswith("uint") else -(2**bits)
        values = st.integers(low, 2**bits - 1)
        getattr(proto, field).extend(draw(st.lists(values, max_size=8)))
    return proto.SerializeToString()


@FUZZ
@given(
    data=st.one_of(_tensor_protos(), st.binary(max_size=128)),
    spec=st.sampled_from([None, _SPEC]),
    max_rows=st.sampled_from([None, 3]),
)
def test_the_tensor_proto(data: bytes, spec: NamedTensorSpec | None, max_rows: int | None) -> None:
    try:
        with bounded_allocation(len(data), "TensorProto"):
            array = decode_tensor_proto("x", data, spec=spec, max_rows=max_rows)
    except BadRequestError as error:
        assert "'x'" in str(error) or "TensorProto" in str(error), error
        return
    assert isinstance(array, np.ndarray)


# -- tf.Example: Classify and Regress, in JSON (REST) and in an Input message (gRPC) ----------

_FEATURES = st.dictionaries(
    st.text(max_size=4),
    st.one_of(JSON, st.lists(st.integers(-(2**64), 2**64), max_size=4), st.binary(max_size=8)),
    max_size=4,
)


@FUZZ
@given(
    examples=st.one_of(st.lists(_FEATURES, max_size=6), JSON),
    context=st.one_of(st.none(), _FEATURES, JSON),
)
def test_the_examples_of_a_rest_request(examples: object, context: object) -> None:
    size = len(repr((examples, context)))  # no shorter than their JSON
    try:
        with bounded_allocation(size, "examples"):
            examples_from_json(examples, context, max_rows=4, max_bytes=4096)
    except (BadRequestError, PayloadTooLargeError):
        pass


@st.composite
def _inputs(draw: st.DrawFn) -> bytes:
    given = input_pb2.Input()
    which = draw(st.sampled_from(["example_list", "example_list_with_context", "none"]))
    if which == "none":
        return given.SerializeToString()
    target = getattr(given, which)
    for _ in range(draw(st.integers(0, 6))):
        example = target.examples.add()
        example.features.feature["f"].float_list.value.extend(
            draw(st.lists(st.floats(width=32), max_size=4))
        )
    if which == "example_list_with_context":
        size = draw(st.sampled_from([0, 10, 5000]))
        target.context.features.feature["c"].bytes_list.value.append(b"c" * size)
    return given.SerializeToString()


@FUZZ
@given(data=st.one_of(_inputs(), st.binary(max_size=128)))
def test_the_examples_of_a_grpc_request(data: bytes) -> None:
    try:
        with bounded_allocation(len(data), "Input"):
            examples_from_input(data, max_rows=4, max_bytes=8192)
    except (BadRequestError, PayloadTooLargeError):
        pass


# -- JSON bodies: parsed in pieces, as orjson parses them whole ------------------------------

# Strings full of what the structural scan must skip: quotes, escapes, brackets.
_TRICKY = st.text(alphabet=st.sampled_from('ab"\\[]{},: \u00e9\u2028\U0001f600'), max_size=12)
_DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | _TRICKY,
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(_TRICKY, inner, max_size=5),
    max_leaves=60,
)


@FUZZ
@given(value=_DOCUMENTS.filter(lambda v: v == v), step=st.sampled_from([1, 3, 65536]))
def test_json_written_in_pieces_reads_back(value: object, step: int) -> None:
    try:
        expected = orjson.dumps(value)
    except TypeError:
        return  # integers past 64 bits: never in an answer (outputs are arrays)
    with mock.patch.object(_json, "_ELEMENTS", step):
        written = _json.dumps(value)
    assert orjson.loads(written) == orjson.loads(expected)


# -- REST bodies through the adapters, on served models: TF Serving JSON, v2 JSON and binary --


@contextlib.contextmanager
def _served() -> Iterator[ModelService]:
    """Three small models behind a service: numbers, two named inputs, strings."""
    with lc.ModelRegistry() as registry:
        registry.load("m", 1, functools.partial(constant_model, 1.0))
        registry.load("pair", 1, pair_model)
        registry.load("words", 1, words_model)
        service = ModelService(registry, ServerConfig(max_request_rows=8, max_json_depth=8))
        service.start()
        try:
            yield service
        finally:
            service.stop()


def _refused_as_a_client_error(error: Exception) -> None:
    wire = error_status(error)
    assert wire.status < 500, f"{type(error).__name__}: {error} would answer {wire.status}"


_B64 = st.binary(max_size=6).map(lambda b: {"b64": base64.b64encode(b).decode()})
_CELLS = st.one_of(
    TENSORS, JSON, _B64, st.just({"b64": "%%"}), st.lists(st.integers(0, 2), min_size=1)
)
_TF_BODIES = st.one_of(
    st.fixed_dictionaries({"instances": st.lists(_CELLS, max_size=10)}),
    st.fixed_dictionaries({"inputs": _CELLS}),
    st.fixed_dictionaries(
        {"instances": st.lists(st.fixed_dictionaries({"a": _CELLS, "b": _CELLS}), max_size=10)}
    ),
    st.fixed_dictionaries({"inputs": st.fixed_dictionaries({"a": _CELLS, "b": _CELLS})}),
    st.fixed_dictionaries({"signature_name": JSON, "instances": _CELLS}),
    JSON,
)


# What each served model takes, row by row: well-formed rows, which a draw may spoil.
_ROWS = {
    "m": st.fixed_dictionaries({"features": st.lists(st.floats(-9, 9), min_size=3, max_size=3)}),
    "pair": st.fixed_dictionaries(
        {"a": st.lists(st.floats(-9, 9), min_size=2, max_size=2), "b": st.tuples(st.integers(0, 9))}
    ),
    "words": st.fixed_dictionaries(
        {"word": st.tuples(st.one_of(st.sampled_from(["cat", "dog", "é"]), _B64))}
    ),
}


@st.composite
def _tf_body(draw: st.DrawFn, model: str) -> object:
    """A TF Serving body for ``model``, row or columnar, named or not, perhaps spoiled."""
    rows = [dict(row) for row in draw(st.lists(_ROWS[model], min_size=1, max_size=10))]
    if draw(st.integers(0, 2)) == 0:  # spoil one cell
        row = draw(st.sampled_from(rows))
        row[draw(st.sampled_from(sorted(row)))] = draw(_CELLS)
    named = model == "pair" or draw(st.booleans())
    if draw(st.booleans()):
        instances = rows if named else [next(iter(row.values())) for row in rows]
        return {"instances": instances}
    columns = {key: [row[key] for row in rows] for key in rows[0]}
    return {"inputs": columns if named else next(iter(columns.values()))}


def _body(value: object) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer past 64 bits
        return json.dumps(value).encode()


def test_a_tensorflow_serving_predict_body() -> None:
    with _served() as service:  # one registry for every input

        @FUZZ
        @given(data=st.data(), model=st.sampled_from(["m", "pair", "words"]))
        def run(data: st.DataObject, model: str) -> None:
            kinds = st.one_of(_tf_body(model), _tf_body(model), _TF_BODIES)
            body = data.draw(st.one_of(kinds.map(_body), st.binary(max_size=64)))
            try:
                with bounded_allocation(len(body), "TF Serving JSON"):
                    answer = tfserving_rest._run("predict", service, model, None, None, body, None)
            except Exception as error:
                _refused_as_a_client_error(error)
                return
            assert isinstance(orjson.loads(answer), dict)

        run()


_V2_INPUTS = {
    "m": [("features", "FP32", 3, "<f4")],
    "pair": [("a", "FP32", 2, "<f4"), ("b", "INT64", 1, "<i8")],
    "words": [("word", "BYTES", 1, None)],
}


@st.composite
def _v2_bodies(draw: st.DrawFn, model: str) -> tuple[bytes, str | None]:
    """A v2 body for ``model``, JSON or binary after its JSON part, perhaps spoiled."""
    rows = draw(st.integers(0, 10))
    items, binary = [], b""
    for name, datatype, width, dtype in _V2_INPUTS[model]:
        item: dict[str, object] = {"name": name, "datatype": datatype, "shape": [rows, width]}
        values = np.arange(rows * width) % 2
        if draw(st.booleans()):
            if dtype is None:
                raw = b"".join(len(w).to_bytes(4, "little") + w for w in [b"cat"] * values.size)
            else:
                raw = values.astype(dtype).tobytes()
            item["parameters"] = {"binary_data_size": len(raw)}
            binary += raw
        else:
            item["data"] = ["cat"] * values.size if dtype is None else values.tolist()
        items.append(item)
    if items and draw(st.integers(0, 2)) == 0:  # spoil one field
        item = draw(st.sampled_from(items))
        field = draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters"]))
        item[field] = draw(
            st.one_of(JSON, SHAPES, st.fixed_dictionaries({"binary_data_size": SIZES}))
        )
    header = _body({"inputs": items})
    if binary or draw(st.booleans()):
        length = draw(st.sampled_from([str(len(header))] * 4 + ["0", "x", str(2**70)]))
        return header + binary, length
    return header, None


def test_a_kserve_v2_infer_body() -> None:
    with _served() as service:  # one registry for every input

        @FUZZ
        @given(data=st.data(), model=st.sampled_from(["m", "pair", "words"]))
        def run(data: st.DataObject, model: str) -> None:
            junk = st.tuples(st.one_of(JSON.map(_body), st.binary(max_size=64)), st.none())
            body, length = data.draw(st.one_of(_v2_bodies(model), _v2_bodies(model), junk))
            try:
                with bounded_allocation(len(body), "v2"):
                    kserve_rest._run_infer(service, model, None, bytearray(body), length, None)
            except Exception as error:
                _refused_as_a_client_error(error)

        run()
