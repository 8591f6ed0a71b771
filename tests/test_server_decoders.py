"""Request decoders bound their work by the bytes received, not by the sizes a request claims.

Unit tests of ``decode_tensor_proto`` (every dtype, every refusal), of the
``tf.Example`` expansion (context copies counted before they are made), and of
KServe's typed contents; then ``lifecycle serve`` in a child process, on its
defaults, spoken to with tensorflow-serving-api's stubs and plain HTTP: each
hostile request is refused with its message, and the server's peak RSS
(VmHWM, reset through ``/proc/PID/clear_refs`` before each request) rises by
no more than the noise measured on good requests plus a small multiple of the
request's own size.
"""

from __future__ import annotations

import contextlib
import json
import random
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.servers import free_port, lifecycle_serve
from tensorflow.core.example import example_pb2
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    input_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from lifecycle._registry import NamedTensorSpec, ServingSignature
from lifecycle.server._errors import BadRequestError, PayloadTooLargeError
from lifecycle.server.kserve._tensors import from_contents
from lifecycle.server.tfserving._examples import (
    REGRESS,
    examples_from_input,
    examples_from_json,
    run_examples,
)
from lifecycle.server.tfserving._tensorproto import DTYPES, decode_tensor_proto

MiB = 2**20
TIMEOUT = 60  # seconds, every call's deadline
DT = types_pb2.DataType
CLIENT_ERRORS = (BadRequestError, PayloadTooLargeError)


def tensor(dtype: int, shape: list[int], **fields: object) -> tensor_pb2.TensorProto:
    """A TensorProto of ``dtype`` that declares ``shape`` and holds ``fields``, as given."""
    proto = tensor_pb2.TensorProto(dtype=dtype)
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    for name, value in fields.items():
        if name == "tensor_content":
            proto.tensor_content = value
        else:
            getattr(proto, name).extend(value)
    return proto


def refusal(call: Callable[[], object], error: type[Exception] = BadRequestError) -> str:
    with pytest.raises(error) as caught:
        call()
    return str(caught.value)


# -- decode_tensor_proto: what every client sends ------------------------------------------

DTYPE_NAMES = [
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex64",
    "complex128",
]


def values_of(dtype: str) -> np.ndarray:
    """A 2 x 3 array of ``dtype`` with its extremes where it has them."""
    if dtype == "bool":
        return np.array([[True, False, True], [False, False, True]])
    numpy_dtype = tf.as_dtype(dtype).as_numpy_dtype
    if np.issubdtype(numpy_dtype, np.integer):
        info = np.iinfo(numpy_dtype)
        return np.array([[info.min, 0, 1], [2, 3, info.max]], numpy_dtype)
    return np.array([[-1.5, 0.0, 1.0], [2.5, 65504.0, -0.25]]).astype(numpy_dtype)


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_what_make_tensor_proto_writes_decodes_to_the_same_array(dtype):
    array = values_of(dtype)
    proto = tf.make_tensor_proto(array)
    decoded = decode_tensor_proto("x", proto)
    expected = array.astype(np.float32) if dtype == "bfloat16" else array
    assert decoded.dtype == expected.dtype
    assert decoded.shape == (2, 3)
    np.testing.assert_array_equal(decoded, expected)
    # The serialized bytes, as a fuzzer or a proxy hands them over, decode alike.
    np.testing.assert_array_equal(decode_tensor_proto("x", proto.SerializeToString()), expected)


TYPED = {
    "float32": ("float_val", DT.DT_FLOAT),
    "float64": ("double_val", DT.DT_DOUBLE),
    "int8": ("int_val", DT.DT_INT8),
    "int16": ("int_val", DT.DT_INT16),
    "int32": ("int_val", DT.DT_INT32),
    "int64": ("int64_val", DT.DT_INT64),
    "uint8": ("int_val", DT.DT_UINT8),
    "uint16": ("int_val", DT.DT_UINT16),
    "uint32": ("uint32_val", DT.DT_UINT32),
    "uint64": ("uint64_val", DT.DT_UINT64),
    "bool": ("bool_val", DT.DT_BOOL),
}


@pytest.mark.parametrize("dtype", sorted(TYPED))
def test_values_in_the_typed_field_decode_to_the_dtype(dtype):
    field, enum = TYPED[dtype]
    array = values_of(dtype)
    decoded = decode_tensor_proto("x", tensor(enum, [2, 3], **{field: array.reshape(-1).tolist()}))
    assert decoded.dtype == array.dtype
    np.testing.assert_array_equal(decoded, array)


def test_complex_values_travel_as_real_imaginary_pairs():
    pairs = tensor(DT.DT_COMPLEX64, [2], scomplex_val=[1.0, 2.0, -3.0, 0.5])
    decoded = decode_tensor_proto("z", pairs)
    assert decoded.dtype == np.complex64
    assert decoded.tolist() == [1 + 2j, -3 + 0.5j]
    odd = tensor(DT.DT_COMPLEX128, [2], dcomplex_val=[1.0, 2.0, 3.0])
    assert "holds 2 values, but the request sends 3 in dcomplex_val (two per complex" in refusal(
        lambda: decode_tensor_proto("z", odd)
    )


def test_half_val_holds_bit_patterns_of_float16_and_bfloat16():
    halves = np.array([1.5, -2.0, 65504.0], np.float16)
    proto = tensor(DT.DT_HALF, [3], half_val=halves.view(np.uint16).tolist())
    decoded = decode_tensor_proto("h", proto)
    assert decoded.dtype == np.float16
    assert decoded.tolist() == [1.5, -2.0, 65504.0]
    # bfloat16 bits are a float32's upper half: 0x3FC0 is 1.5, 0xC040 is -3.0.
    proto = tensor(DT.DT_BFLOAT16, [2], half_val=[0x3FC0, 0xC040])
    decoded = decode_tensor_proto("b", proto)
    assert decoded.dtype == np.float32  # the signature rounds it back to bfloat16, exactly
    assert decoded.tolist() == [1.5, -3.0]
    for value in (-1, 0x10000):
        message = refusal(
            lambda v=value: decode_tensor_proto("h", tensor(DT.DT_HALF, [1], half_val=[v]))
        )
        assert "half_val holds the 16-bit patterns of float16 values, from 0 to 65535" in message


def test_strings_decode_to_an_object_array_of_the_bytes_sent():
    words = [b"", b"cat", b"\xff\x00binary", "é".encode()]
    decoded = decode_tensor_proto("s", tensor(DT.DT_STRING, [2, 2], string_val=words))
    assert decoded.dtype == object and decoded.shape == (2, 2)
    assert decoded.reshape(-1).tolist() == words
    made = decode_tensor_proto("s", tf.make_tensor_proto(np.array([[b"a"], [b"bc"]], object)))
    assert made.tolist() == [[b"a"], [b"bc"]]


def test_one_value_fills_a_scalar_and_nothing_else():
    scalar = decode_tensor_proto("x", tf.make_tensor_proto(3.5))
    assert scalar.shape == () and scalar.dtype == np.float32 and float(scalar) == 3.5
    message = refusal(lambda: decode_tensor_proto("x", tensor(DT.DT_FLOAT, [3], float_val=[3.5])))
    assert "tensor_shape [3] holds 3 values, but the request sends 1 in float_val" in message
    assert "Values are never repeated to fill a shape" in message
    word = tensor(DT.DT_STRING, [], string_val=[b"w"])
    assert decode_tensor_proto("s", word).tolist() == b"w"


@pytest.mark.parametrize("dtype", [DT.DT_FLOAT, DT.DT_STRING, DT.DT_BFLOAT16, DT.DT_BOOL])
def test_a_tensor_of_no_values_has_a_zero_in_its_shape(dtype):
    decoded = decode_tensor_proto("x", tensor(dtype, [0, 4]))
    assert decoded.shape == (0, 4)
    expected = {DT.DT_FLOAT: np.float32, DT.DT_STRING: object, DT.DT_BFLOAT16: np.float32}
    assert decoded.dtype == np.dtype(expected.get(dtype, bool))


def test_tensor_content_is_little_endian_whatever_the_host():
    little = np.array([1.0, -2.0], "<f4").tobytes()
    decoded = decode_tensor_proto("x", tensor(DT.DT_FLOAT, [2], tensor_content=little))
    assert decoded.tolist() == [1.0, -2.0]
    assert decoded.dtype.isnative  # on every host this suite runs on (little-endian)
    # Any byte but 0 is true, as TensorFlow reads a bool.
    flags = decode_tensor_proto("b", tensor(DT.DT_BOOL, [3], tensor_content=b"\x00\x01\x02"))
    assert flags.tolist() == [False, True, True]


# -- decode_tensor_proto: what it refuses, and why ------------------------------------------


@pytest.mark.parametrize(
    ("proto", "fragment"),
    [
        (
            tensor(DT.DT_FLOAT, [1, 25_000_000], float_val=[1.0]),
            "Input 'x': tensor_shape [1, 25000000] holds 25000000 values, but the request sends "
            "1 in float_val; send every value (tf.make_tensor_proto does)",
        ),
        (
            tensor(DT.DT_STRING, [25_000_000], string_val=[b"a"]),
            "holds 25000000 values, but the request sends 1 in string_val",
        ),
        (
            tensor(DT.DT_FLOAT, [50_000, 4]),
            "tensor_shape [50000, 4] holds 200000 values, but the request sends none",
        ),
        (
            tensor(DT.DT_FLOAT, [2**40]),
            "tensor_shape [1099511627776] holds 1099511627776 values, but the request sends none",
        ),
        (
            tensor(DT.DT_FLOAT, [1, 3], tensor_content=b"\x00" * 5),
            "tensor_shape [1, 3] of float32 takes 12 bytes of tensor_content (4 a value), but the "
            "request sends 5",
        ),
        (
            tensor(DT.DT_FLOAT, [1], tensor_content=b"\x00" * 8),
            "takes 4 bytes of tensor_content (4 a value), but the request sends 8",
        ),
        (tensor(DT.DT_FLOAT, [-1, 3]), "declares shape [-1, 3]: a dimension cannot be negative"),
        (tensor(DT.DT_FLOAT, [2**62, 2**62]), "too large for any array"),
        (tensor(DT.DT_FLOAT, [0, 2**62]), "too large for any array"),
        (tensor(DT.DT_FLOAT, [1] * 65), "declares 65 dimensions; a tensor has at most 64"),
        (
            tensor_pb2.TensorProto(dtype=DT.DT_FLOAT, tensor_shape={"unknown_rank": True}),
            "has a tensor_shape of unknown rank",
        ),
        (tensor(DT.DT_INVALID, [1]), "has no dtype (DT_INVALID): set the TensorProto's dtype"),
        (tensor(DT.DT_QINT8, [1]), "has DT_QINT8, which this server does not decode"),
        (tensor(DT.DT_RESOURCE, [1]), "has DT_RESOURCE, which this server does not decode"),
        (tensor(DT.DT_VARIANT, [1]), "has DT_VARIANT, which this server does not decode"),
        (tensor(DT.DT_FLOAT8_E4M3FN, [1]), "has DT_FLOAT8_E4M3FN, which this server does not"),
        (tensor(999, [1]), "has dtype 999, which this server does not decode. Send one of: "),
        (
            tensor(DT.DT_FLOAT, [1], int_val=[1]),
            "is float32: its values go in tensor_content or float_val, but the request sends "
            "int_val",
        ),
        (
            tensor(DT.DT_STRING, [1], tensor_content=b"ab"),
            "is string: its values go in string_val, but the request sends tensor_content",
        ),
        (
            tensor(DT.DT_FLOAT, [1], tensor_content=b"\x00" * 4, float_val=[1.0]),
            "sends both tensor_content and float_val: send the values one way",
        ),
        (
            tensor(DT.DT_INT8, [2], int_val=[1, 300]),
            "int_val holds int8 values, from -128 to 127; the request sends values from 1 to 300",
        ),
        (
            tensor(DT.DT_UINT8, [1], int_val=[-1]),
            "int_val holds uint8 values, from 0 to 255",
        ),
    ],
)
def test_a_tensor_that_does_not_add_up_is_refused_with_its_reason(proto, fragment):
    assert fragment in refusal(lambda: decode_tensor_proto("x", proto))
    # The same from its bytes.
    assert fragment in refusal(lambda: decode_tensor_proto("x", proto.SerializeToString()))


def test_bytes_that_are_not_a_tensor_proto_are_refused():
    message = refusal(lambda: decode_tensor_proto("x", b"\xff\xff\xff"))
    assert "Input 'x' is not a valid TensorProto" in message
    with pytest.raises(TypeError, match="takes a TensorProto or its bytes"):
        decode_tensor_proto("x", [1.0])  # type: ignore[arg-type]


def test_every_dtype_decoded_is_listed():
    assert DTYPES == (
        "DT_FLOAT",
        "DT_DOUBLE",
        "DT_HALF",
        "DT_BFLOAT16",
        "DT_INT8",
        "DT_INT16",
        "DT_INT32",
        "DT_INT64",
        "DT_UINT8",
        "DT_UINT16",
        "DT_UINT32",
        "DT_UINT64",
        "DT_BOOL",
        "DT_COMPLEX64",
        "DT_COMPLEX128",
        "DT_STRING",
    )


FEATURES = NamedTensorSpec("features", "float32", (None, 4))


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        ([1, 25_000_000], "Input 'x' has shape (1, 25000000), but the model takes (-1, 4)"),
        ([25_000_000], "has shape (25000000,), but the model takes (-1, 4) (-1: any size)"),
        ([2**40, 4], "has 1099511627776 rows (its first dimension); a request may hold at most 8"),
        ([9, 4], "has 9 rows (its first dimension); a request may hold at most 8 "),
    ],
)
def test_the_shape_is_checked_against_the_signature_and_rows_before_the_values(shape, fragment):
    # No values at all: the header alone is refused, whatever the values would be.
    proto = tensor(DT.DT_FLOAT, shape)
    message = refusal(lambda: decode_tensor_proto("x", proto, spec=FEATURES, max_rows=8))
    assert fragment in message
    if "rows" in fragment:
        assert "(--max_request_rows)" in message
    fits = tensor(DT.DT_FLOAT, [8, 4], float_val=[1.0] * 32)
    assert decode_tensor_proto("x", fits, spec=FEATURES, max_rows=8).shape == (8, 4)


def peak_traced(call: Callable[[], object]) -> int:
    """The most bytes Python and NumPy held at once during ``call()``, above where it started."""
    tracemalloc.start()
    try:
        with contextlib.suppress(CLIENT_ERRORS):
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_refused_tensor_allocates_nothing_its_shape_asks_for():
    lying = [
        tensor(DT.DT_FLOAT, [1, 25_000_000], float_val=[1.0]),
        tensor(DT.DT_STRING, [25_000_000], string_val=[b"a"]),
        tensor(DT.DT_FLOAT, [50_000, 4]),
        tensor(DT.DT_DOUBLE, [2**40]),
    ]
    for proto in lying:
        assert peak_traced(lambda p=proto: decode_tensor_proto("x", p)) < 64 * 1024, proto
    # The measure sees NumPy's buffers: a tensor that sends its 4 MB is 4 MB.
    honest = tf.make_tensor_proto(np.ones((1, 2**20), np.float32))
    assert peak_traced(lambda: decode_tensor_proto("x", honest)) >= 4 * MiB


def test_mangled_bytes_give_an_array_or_a_client_error_only():
    seeds = [tf.make_tensor_proto(values_of(name)).SerializeToString() for name in DTYPE_NAMES] + [
        tensor(DT.DT_STRING, [2], string_val=[b"a", b"b"]).SerializeToString()
    ]
    rng = random.Random(1234)
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(data))
            data[position] = rng.randrange(256)
        try:
            decoded = decode_tensor_proto("x", bytes(data))
        except CLIENT_ERRORS:
            continue
        assert isinstance(decoded, np.ndarray)
        assert decoded.nbytes <= 16 * len(data)


# -- tf.Example expansion -------------------------------------------------------------------


def example(**features: bytes | float) -> example_pb2.Example:
    result = example_pb2.Example()
    for name, value in features.items():
        feature = result.features.feature[name]
        if isinstance(value, bytes):
            feature.bytes_list.value.append(value)
        else:
            feature.float_list.value.append(value)
    return result


def with_context(context: example_pb2.Example, count: int) -> input_pb2.Input:
    given = input_pb2.Input()
    listed = given.example_list_with_context
    listed.context.CopyFrom(context)
    for _ in range(count):
        listed.examples.add()
    return given


def test_each_example_follows_the_context_so_its_own_features_win():
    given = with_context(example(f=1.0, g=2.0), 0)
    given.example_list_with_context.examples.extend([example(), example(f=5.0)])
    serialized = examples_from_input(given, max_rows=10, max_bytes=10_000)
    parsed = [example_pb2.Example.FromString(data).features.feature for data in serialized]
    assert [(p["f"].float_list.value[0], p["g"].float_list.value[0]) for p in parsed] == [
        (1.0, 2.0),
        (5.0, 2.0),
    ]
    # The same examples from the message's bytes (compared parsed: a map's
    # entries may serialize in another order).
    again = examples_from_input(given.SerializeToString(), max_rows=10, max_bytes=10_000)
    assert [example_pb2.Example.FromString(data) for data in again] == [
        example_pb2.Example.FromString(data) for data in serialized
    ]
    listed = input_pb2.Input()
    listed.example_list.examples.extend([example(f=1.0)])
    assert examples_from_input(listed, max_rows=1, max_bytes=100) == [
        example(f=1.0).SerializeToString()
    ]


def test_a_context_copied_past_the_byte_limit_is_refused_before_any_copy():
    given = with_context(example(pad=b"x" * 100_000), 1000)
    size = len(given.example_list_with_context.context.SerializeToString())
    message = refusal(
        lambda: examples_from_input(given, max_rows=65536, max_bytes=64 * MiB),
        PayloadTooLargeError,
    )
    assert (
        f"The request's 1000 examples, each with the context's {size} bytes, take "
        f"{1000 * size} bytes once serialized: over the server's limit of {64 * MiB} "
        "(--max_request_bytes)" in message
    )
    assert "send fewer examples per request, or a smaller context" in message
    peak = peak_traced(lambda: examples_from_input(given, max_rows=65536, max_bytes=64 * MiB))
    assert peak < 2 * size  # the context, serialized once; 1000 copies would be 100 MB
    # The limit is inclusive: exactly at it, the examples are made.
    assert len(examples_from_input(given, max_rows=65536, max_bytes=1000 * size)) == 1000
    with pytest.raises(PayloadTooLargeError):
        examples_from_input(given, max_rows=65536, max_bytes=1000 * size - 1)


def test_json_examples_are_bounded_the_same_way():
    context = {"pad": "x" * 100_000}
    message = refusal(
        lambda: examples_from_json([{}] * 1000, context, max_rows=65536, max_bytes=MiB),
        PayloadTooLargeError,
    )
    size = example(pad=b"x" * 100_000).ByteSize()
    assert f"The request's 1000 examples, each with the context's {size} bytes" in message
    (one,) = examples_from_json([{"f": 1.0}], {"f": 2.0, "g": 3}, max_rows=1, max_bytes=100)
    features = example_pb2.Example.FromString(one).features.feature
    assert (features["f"].float_list.value[0], features["g"].int64_list.value[0]) == (1.0, 3)


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (
            lambda: examples_from_json([{}] * 9, max_rows=8, max_bytes=MiB),
            "The request holds 9 examples; a request may hold at most 8 (--max_request_rows)",
        ),
        (
            lambda: examples_from_input(with_context(example(), 9), max_rows=8, max_bytes=MiB),
            "The request holds 9 examples; a request may hold at most 8",
        ),
        (
            lambda: examples_from_input(input_pb2.Input(), max_rows=8, max_bytes=MiB),
            "must be an example_list or an example_list_with_context",
        ),
        (
            lambda: examples_from_input(with_context(example(), 0), max_rows=8, max_bytes=MiB),
            "The request's input holds no examples",
        ),
        (
            lambda: examples_from_input(b"\xff\xff", max_rows=8, max_bytes=MiB),
            "The request's input is not a valid Input message",
        ),
        (
            lambda: examples_from_json([{"n": 2**64}], max_rows=8, max_bytes=MiB),
            "example 0, feature 'n' cannot be stored in a tf.Example",
        ),
        (
            lambda: examples_from_json([{"n": [1.5, 10**400]}], max_rows=8, max_bytes=MiB),
            "example 0, feature 'n' cannot be stored in a tf.Example",
        ),
        (
            lambda: examples_from_json([{"s": "\ud800"}], max_rows=8, max_bytes=MiB),
            "example 0, feature 's': a string is not valid text",
        ),
        (
            lambda: examples_from_json([{1: 2}], max_rows=8, max_bytes=MiB),
            "example 0: feature names are strings. Received: 1",
        ),
    ],
)
def test_examples_that_cannot_be_read_are_a_client_error(call, fragment):
    assert fragment in refusal(call)


class PredictOnlyLease:
    """A lease whose only signature is a predict one (a Keras model's)."""

    version = 1

    def signature_named(self, name: str | None) -> ServingSignature:
        return ServingSignature(inputs=(NamedTensorSpec("x", "float32", (None, 3)),), outputs=())


def test_the_method_is_checked_before_the_examples_are_read():
    read: list[str] = []

    def examples() -> list[bytes]:
        read.append("read")
        return [b""]

    lease = PredictOnlyLease()
    message = refusal(lambda: run_examples(lease, None, REGRESS, examples))  # type: ignore[arg-type]
    assert "Expected regress signature method_name to be tensorflow/serving/regress" in message
    assert read == []


# -- KServe v2 typed contents ---------------------------------------------------------------


def test_typed_contents_are_range_checked_for_narrower_integers():
    contents = type("Contents", (), {"uint_contents": [1, 255], "int_contents": [1, -129]})()
    assert from_contents("u", "UINT8", [2], contents).tolist() == [1, 255]
    assert from_contents("u", "UINT8", [2], contents).dtype == np.uint8
    message = refusal(lambda: from_contents("i", "INT8", [2], contents))
    assert "Input 'i': INT8 values run from -128 to 127; int_contents sends -129 to 1" in message


# -- lifecycle serve, end to end ------------------------------------------------------------

CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"


class Signatures(tf.Module):
    """serving_default: x [-1, 4] -> y = sum; wide: x [-1, -1] -> y = 2x;
    text: s [-1, -1] -> n = length; classify / regress: tf.Examples with feature f.

    ``wide`` and ``text`` take any number of columns: only the values sent can
    bound such an input, not the signature.
    """

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.reduce_sum(x, axis=1, keepdims=True)}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
    def wide(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": 2.0 * x}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string, name="s")])
    def text(self, s: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"n": tf.strings.length(s)}

    @staticmethod
    def _feature(serialized: tf.Tensor) -> tf.Tensor:
        spec = {"f": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0])}
        return tf.io.parse_example(serialized, spec)["f"]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        p = self._feature(inputs) / 10.0
        return {"scores": tf.concat([1.0 - p, p], axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"outputs": 3.0 * self._feature(inputs)}


def export(path: Path) -> None:
    """The SavedModel, its classify and regress signatures given those methods."""
    module = Signatures()
    names = ["wide", "text", "classify", "regress"]
    signatures = {"serving_default": module.serve, **{n: getattr(module, n) for n in names}}
    tf.saved_model.save(module, str(path), signatures=signatures)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    definitions = saved.meta_graphs[0].signature_def
    definitions["classify"].method_name = CLASSIFY_METHOD
    definitions["regress"].method_name = REGRESS_METHOD
    (path / "saved_model.pb").write_bytes(saved.SerializeToString())


def status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # kB
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def peak_rise(pid: int, call: Callable[[], object]) -> int:
    """How far the process's peak RSS rose during ``call()``: VmHWM reset first."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status_bytes(pid, "VmHWM")
    call()
    return status_bytes(pid, "VmHWM") - before


class Server:
    """The ``lifecycle serve`` child, its stub, its REST URL, and the noise of its peak RSS."""

    def __init__(self, pid: int, url: str, stub: prediction_service_pb2_grpc.PredictionServiceStub):
        self.pid, self.url, self.stub = pid, url, stub
        self.noise = 0

    def predict(
        self, signature: str, name: str, proto: tensor_pb2.TensorProto, model: str = "m"
    ) -> predict_pb2.PredictRequest:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        request.model_spec.signature_name = signature
        request.inputs[name].CopyFrom(proto)
        return request

    def rest(self, verb: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(
            f"{self.url}/v1/models/m:{verb}",
            content=json.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=TIMEOUT,
        )

    def assert_bounded(self, rise: int, request_bytes: int) -> None:
        # The request itself is held a few times (gRPC's buffer, the parsed message,
        # a JSON body and its objects); 2 MiB above the noise is far below what the
        # shapes asked for (100 MB to 4 TiB).
        bound = self.noise + 2 * MiB + 4 * request_bytes
        assert rise <= bound, (
            f"peak RSS rose {rise / MiB:.1f} MiB for a {request_bytes}-byte request; "
            f"bound {bound / MiB:.1f} MiB (noise {self.noise / MiB:.1f} MiB)"
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("decoders") / "m"
    export(base / "1")
    rest, port = free_port(), free_port()
    flags = ["--rest_api_port", str(rest), "--port", str(port), "--model_name", "m"]
    with (
        lifecycle_serve(*flags, "--model_base_path", str(base)) as process,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        served = Server(
            process.pid,
            f"http://127.0.0.1:{rest}",
            prediction_service_pb2_grpc.PredictionServiceStub(channel),
        )
        good = served.predict("", "x", tf.make_tensor_proto(np.ones((2, 4), np.float32)))
        regress = {"signature_name": "regress", "context": {"f": 1.0}, "examples": [{}, {}]}

        def both() -> None:
            served.stub.Predict(good, timeout=TIMEOUT)
            assert served.rest("regress", regress).status_code == 200

        for _ in range(3):  # first calls warm up threads, connections and caches
            both()
        served.noise = max(peak_rise(process.pid, both) for _ in range(10))
        yield served


@pytest.mark.subprocess
@pytest.mark.slow
def test_an_unknown_model_or_input_is_refused_before_its_tensor_is_read(server):
    # First of the memory tests: nothing another request left in the heap can hide a rise.
    proto = tensor(DT.DT_FLOAT, [1, 25_000_000], float_val=[1.0])
    for request, code, fragment in [
        (server.predict("wide", "x", proto, model="nope"), "NOT_FOUND", "No model named 'nope'"),
        (server.predict("wide", "other", proto), "INVALID_ARGUMENT", "unknown ['other']"),
    ]:

        def call(request=request, code=code, fragment=fragment) -> None:
            with pytest.raises(grpc.RpcError) as caught:
                server.stub.Predict(request, timeout=TIMEOUT)
            assert caught.value.code() is grpc.StatusCode[code]
            assert fragment in caught.value.details()

        server.assert_bounded(peak_rise(server.pid, call), request.ByteSize())


LYING = [
    # (signature, input, tensor, why): a few dozen bytes that asked for up to gigabytes.
    (
        "wide",
        "x",
        tensor(DT.DT_FLOAT, [1, 25_000_000], float_val=[1.0]),
        "Input 'x': tensor_shape [1, 25000000] holds 25000000 values, but the request sends 1",
    ),
    (
        "text",
        "s",
        tensor(DT.DT_STRING, [25_000_000], string_val=[b"a"]),
        "Input 's' has shape (25000000,), but the model takes (-1, -1)",
    ),
    (
        "text",
        "s",
        tensor(DT.DT_STRING, [1, 25_000_000], string_val=[b"a"]),
        "Input 's': tensor_shape [1, 25000000] holds 25000000 values, but the request sends 1",
    ),
    ("wide", "x", tensor(DT.DT_FLOAT, [2**40]), "Input 'x' has shape (1099511627776,), but"),
    ("wide", "x", tensor(DT.DT_FLOAT, [2**40, 1]), "has 1099511627776 rows (its first dimension)"),
    (
        "",
        "x",
        tensor(DT.DT_FLOAT, [50_000, 4]),
        "tensor_shape [50000, 4] holds 200000 values, but the request sends none",
    ),
]


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize(("signature", "name", "proto", "fragment"), LYING)
def test_grpc_predict_of_a_lying_tensor_is_refused_within_its_bytes(
    server, signature, name, proto, fragment
):
    request = server.predict(signature, name, proto)
    assert request.ByteSize() < 64  # what the client sends

    def call() -> None:
        with pytest.raises(grpc.RpcError) as caught:
            server.stub.Predict(request, timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in caught.value.details()

    server.assert_bounded(peak_rise(server.pid, call), request.ByteSize())


def big_context() -> input_pb2.Input:
    """1,000 empty examples and a 100 KB context: 101 KB sent, 100 MB once expanded."""
    return with_context(example(pad=b"x" * 100_000), 1000)


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("method", ["Classify", "Regress"])
def test_grpc_examples_whose_context_would_expand_past_the_limit_are_resource_exhausted(
    server, method
):
    messages = {
        "Classify": classification_pb2.ClassificationRequest,
        "Regress": regression_pb2.RegressionRequest,
    }
    request = messages[method]()
    request.model_spec.name = "m"
    request.model_spec.signature_name = method.lower()
    request.input.CopyFrom(big_context())

    def call() -> None:
        with pytest.raises(grpc.RpcError) as caught:
            getattr(server.stub, method)(request, timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "The request's 1000 examples, each with the context's" in caught.value.details()
        assert "(--max_request_bytes)" in caught.value.details()

    server.assert_bounded(peak_rise(server.pid, call), request.ByteSize())


@pytest.mark.subprocess
@pytest.mark.slow
def test_grpc_multi_inference_is_unimplemented_without_expanding_its_examples(server):
    request = inference_pb2.MultiInferenceRequest()
    task = request.tasks.add()
    task.model_spec.name = "m"
    task.model_spec.signature_name = "regress"
    task.method_name = REGRESS_METHOD
    request.input.CopyFrom(big_context())

    def call() -> None:
        with pytest.raises(grpc.RpcError) as caught:
            server.stub.MultiInference(request, timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED

    server.assert_bounded(peak_rise(server.pid, call), request.ByteSize())


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("verb", ["classify", "regress"])
def test_rest_examples_whose_context_would_expand_past_the_limit_are_413(server, verb):
    body = {"signature_name": verb, "context": {"pad": "x" * 100_000}, "examples": [{}] * 1000}
    answers: list[httpx.Response] = []
    rise = peak_rise(server.pid, lambda: answers.append(server.rest(verb, body)))
    assert answers[0].status_code == 413, answers[0].text
    assert "The request's 1000 examples, each with the context's" in answers[0].json()["error"]
    server.assert_bounded(rise, len(json.dumps(body)))


@pytest.mark.subprocess
@pytest.mark.slow
def test_honest_requests_are_still_answered(server):
    wide = server.predict("wide", "x", tf.make_tensor_proto(np.ones((2, 3), np.float32)))
    answer = server.stub.Predict(wide, timeout=TIMEOUT)
    assert tf.make_ndarray(answer.outputs["y"]).tolist() == [[2.0] * 3] * 2
    text = server.predict("text", "s", tf.make_tensor_proto(np.array([[b"ab", b""]], object)))
    assert tf.make_ndarray(server.stub.Predict(text, timeout=TIMEOUT).outputs["n"]).tolist() == [
        [2, 0]
    ]
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "m"
    request.model_spec.signature_name = "regress"
    request.input.CopyFrom(with_context(example(f=2.0), 0))
    request.input.example_list_with_context.examples.extend([example(), example(f=4.0)])
    response = server.stub.Regress(request, timeout=TIMEOUT)
    assert [r.value for r in response.result.regressions] == [6.0, 12.0]
    body = {"signature_name": "classify", "examples": [{"f": 2.0}]}
    answer = server.rest("classify", body)
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose([s for _, s in answer.json()["result"][0]], [0.8, 0.2])
