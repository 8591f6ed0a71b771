"""KServe v2's binary tensor data extension, spoken by tritonclient.http with its defaults.

tritonclient sends inputs as raw bytes after the JSON part and asks every output
back in binary unless told otherwise; the server answers in kind. Malformed
binary bodies are written by hand. The server runs on 127.0.0.1 and a free port
and is always stopped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from support.servers import MAX_REQUEST_BYTES, free_port, running
from tritonclient.utils import InferenceServerException

import lifecycle as lc
from lifecycle.server import ServerConfig

HEADER = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def server(kserve_root: Path) -> Iterator[str]:
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_config_file=str(kserve_root / "models.config"),
        max_request_bytes=MAX_REQUEST_BYTES,
    )
    with lc.ModelRegistry(name="test-kserve-binary") as registry, running(registry, config) as url:
        yield url


@pytest.fixture
def v2(server: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.removeprefix("http://"), network_timeout=30)
    yield client
    client.close()


@pytest.fixture
def http(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=30) as client:
        yield client


def tensor(
    name: str, array: np.ndarray, datatype: str, *, binary: bool = True
) -> triton.InferInput:
    item = triton.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array, binary_data=binary)
    return item


def binary_body(header: dict, *parts: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary extension body: the JSON part, then ``parts``; and its header."""
    head = orjson.dumps(header)
    return head + b"".join(parts), {HEADER: str(len(head))}


def as_bytes(*elements: bytes) -> bytes:
    """BYTES elements as the extension carries them: each after its 4-byte length."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def features(size: int) -> dict:
    return {
        "name": "features",
        "shape": [1, 3],
        "datatype": "FP32",
        "parameters": {"binary_data_size": size},
    }


# -- tritonclient's defaults: binary both ways ----------------------------------------


def test_fp32_in_and_out_in_binary_by_default(v2):
    x = tensor("features", np.ones((2, 3), "float32"), "FP32")
    result = v2.infer("risk", [x])
    np.testing.assert_array_equal(result.as_numpy("output_0"), [[2.0, 2.0], [2.0, 2.0]])
    output = result.get_output("output_0")
    assert output["datatype"] == "FP32" and output["shape"] == [2, 2]
    assert output["parameters"] == {"binary_data_size": 16} and "data" not in output
    assert result.get_response()["model_version"] == "2"
    pinned = v2.infer("risk", [x], model_version="1")
    np.testing.assert_array_equal(pinned.as_numpy("output_0"), [[1.0, 1.0], [1.0, 1.0]])


def test_two_inputs_fp32_and_int64_and_a_subset_of_outputs(v2):
    a = tensor("a", np.array([[1, 2], [0, 0]], "float32"), "FP32")
    b = tensor("b", np.array([[3], [1]], "int64"), "INT64")
    both = v2.infer("pair", [a, b], request_id="r-7")
    np.testing.assert_array_equal(both.as_numpy("score"), [[12.0], [2.0]])
    np.testing.assert_array_equal(both.as_numpy("logits"), [[6.0] * 3, [1.0] * 3])
    assert both.get_response()["id"] == "r-7"
    one = v2.infer("pair", [a, b], outputs=[triton.InferRequestedOutput("logits")])
    np.testing.assert_array_equal(one.as_numpy("logits"), [[6.0] * 3, [1.0] * 3])
    assert one.as_numpy("score") is None
    assert [o["name"] for o in one.get_response()["outputs"]] == ["logits"]


def test_mixed_binary_and_json_inputs_and_outputs(v2):
    a = tensor("a", np.array([[1, 2]], "float32"), "FP32", binary=True)
    b = tensor("b", np.array([[3]], "int64"), "INT64", binary=False)
    result = v2.infer(
        "pair",
        [a, b],
        outputs=[
            triton.InferRequestedOutput("score", binary_data=True),
            triton.InferRequestedOutput("logits", binary_data=False),
        ],
    )
    np.testing.assert_array_equal(result.as_numpy("score"), [[12.0]])
    np.testing.assert_array_equal(result.as_numpy("logits"), [[6.0] * 3])
    assert result.get_output("score")["parameters"] == {"binary_data_size": 4}
    assert result.get_output("logits")["data"] == [6.0] * 3


def test_bytes_inputs_and_outputs_are_length_prefixed(v2):
    words = tensor("word", np.array([[b"dog"], [b"cat"], [b"emu"]], object), "BYTES")
    np.testing.assert_array_equal(v2.infer("words", [words]).as_numpy("output_0"), [[2], [1], [0]])
    # Any bytes, not only UTF-8: empty, NUL, invalid UTF-8.
    values = np.array([[b"", b"a\x00b"], [b"\xff\xfe", "é".encode()]], object)
    result = v2.infer("text", [tensor("x", values, "BYTES")])
    assert result.as_numpy("output_0").tolist() == values.tolist()
    assert result.get_output("output_0")["datatype"] == "BYTES"


def test_fp16_and_bf16_travel_as_raw_bytes(v2):
    half = np.array([[0.5, -2.0]], "float16")
    result = v2.infer("half", [tensor("x", half, "FP16")])
    assert result.as_numpy("output_0").dtype == np.float16
    np.testing.assert_array_equal(result.as_numpy("output_0"), half)
    bhalf = np.array([[1.5, -3.0]], ml_dtypes.bfloat16)
    result = v2.infer("bhalf", [tensor("x", bhalf, "BF16")])
    assert result.as_numpy("output_0").dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(result.as_numpy("output_0"), bhalf)
    as_json = v2.infer(
        "bhalf",
        [tensor("x", bhalf, "BF16")],
        outputs=[triton.InferRequestedOutput("output_0", binary_data=False)],
    )
    assert as_json.get_output("output_0")["data"] == [1.5, -3.0]


def test_the_answer_is_json_unless_an_output_is_asked_in_binary(http):
    body, headers = binary_body({"inputs": [features(12)]}, np.ones(3, "<f4").tobytes())
    plain = http.post("/v2/models/risk/infer", content=body, headers=headers)
    assert plain.status_code == 200, plain.text
    assert plain.headers["content-type"] == "application/json" and HEADER not in plain.headers
    assert plain.json()["outputs"][0]["data"] == [2.0, 2.0]
    asked = {"inputs": [features(12)], "parameters": {"binary_data_output": True}}
    body, headers = binary_body(asked, np.ones(3, "<f4").tobytes())
    answer = http.post("/v2/models/risk/infer", content=body, headers=headers)
    assert answer.headers["content-type"] == "application/octet-stream"
    size = int(answer.headers[HEADER])
    head = orjson.loads(answer.content[:size])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(answer.content[size:], "<f4").tolist() == [2.0, 2.0]
    # An output's own binary_data: false wins over binary_data_output.
    asked["outputs"] = [{"name": "output_0", "parameters": {"binary_data": False}}]
    body, headers = binary_body(asked, np.ones(3, "<f4").tobytes())
    answer = http.post("/v2/models/risk/infer", content=body, headers=headers)
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["outputs"][0]["data"] == [2.0, 2.0]


# -- malformed binary bodies ------------------------------------------------------------

ONES = np.ones(3, "<f4").tobytes()


def with_header(value: str, body: bytes) -> tuple[bytes, dict[str, str]]:
    return body, {HEADER: value}


@pytest.mark.parametrize(
    ("model", "request_", "fragment"),
    [
        ("risk", with_header("twelve", b"{}"), "must be the byte length of the body's JSON part"),
        ("risk", with_header("99", b'{"inputs": []}'), "is 99, beyond the body's end"),
        ("risk", with_header("4", b"\xff\xfe{}abcd"), "is not valid UTF-8"),
        ("risk", with_header("4", b"{]}}abcd"), "is not valid JSON"),
        (
            "risk",
            binary_body({"inputs": [features(16)]}, ONES),
            "binary_data_size 16 at byte 0 of the binary data, which has only 12 bytes",
        ),
        (
            "risk",
            binary_body({"inputs": [features(12)]}, ONES + b"\x00"),
            "13 bytes of binary data after its JSON part, but the inputs' binary_data_size "
            "add up to 12",
        ),
        (
            "risk",
            binary_body({"inputs": [features(8)]}, ONES[:8]),
            "has 8 bytes of FP32 data, but its shape [1, 3] takes 12 (4 per element)",
        ),
        (
            "risk",
            binary_body({"inputs": [features(-1)]}, b""),
            "binary_data_size must be a byte count >= 0",
        ),
        (
            "risk",
            binary_body({"inputs": [{**features(12), "data": [1, 2, 3]}]}, ONES),
            "has both 'data' and 'parameters.binary_data_size'",
        ),
        (
            "risk",
            (orjson.dumps({"inputs": [features(12)]}) + ONES, {}),
            "is not valid JSON",
        ),
        (
            "risk",
            (orjson.dumps({"inputs": [features(12)]}), {}),
            "is the Inference-Header-Content-Length header missing?",
        ),
        (
            "words",
            binary_body(
                {
                    "inputs": [
                        {
                            "name": "word",
                            "shape": [1, 1],
                            "datatype": "BYTES",
                            "parameters": {"binary_data_size": 6},
                        }
                    ]
                },
                as_bytes(b"dog")[:6],
            ),
            "a BYTES element of 3 bytes at byte 4 runs past the end of its data (6 bytes)",
        ),
        (
            "words",
            binary_body(
                {
                    "inputs": [
                        {
                            "name": "word",
                            "shape": [1, 1],
                            "datatype": "BYTES",
                            "parameters": {"binary_data_size": 9},
                        }
                    ]
                },
                as_bytes(b"dog") + b"\x01\x00",
            ),
            "ends within an element's 4-byte length, at byte 7 of 9",
        ),
        (
            "words",
            binary_body(
                {
                    "inputs": [
                        {
                            "name": "word",
                            "shape": [1, 1],
                            "datatype": "BYTES",
                            "parameters": {"binary_data_size": 14},
                        }
                    ]
                },
                as_bytes(b"dog", b"cat"),
            ),
            "Input 'word' has 2 values, but its shape [1, 1] holds 1",
        ),
        (
            "risk",
            binary_body(
                {"inputs": [{**features(12), "parameters": {"shared_memory_region": "r"}}]}, b""
            ),
            "names a shared memory region, which this server does not support",
        ),
        (
            "risk",
            binary_body(
                {"inputs": [features(12)], "outputs": [{"name": "output_9"}]},
                ONES,
            ),
            "The model has no outputs ['output_9']",
        ),
    ],
)
def test_malformed_binary_bodies_are_400_with_a_message(http, model, request_, fragment):
    body, headers = request_
    response = http.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]


def test_a_compressed_body_is_refused_with_a_message(http):
    body, headers = binary_body({"inputs": [features(12)]}, ONES)
    headers["Content-Encoding"] = "gzip"
    response = http.post("/v2/models/risk/infer", content=body, headers=headers)
    assert response.status_code == 400
    assert "Content-Encoding 'gzip' is not supported" in response.json()["error"]


def test_a_binary_body_over_the_limit_is_413_and_an_unknown_model_404(v2):
    rows = MAX_REQUEST_BYTES // 12 + 1
    big = tensor("features", np.zeros((rows, 3), "float32"), "FP32")
    with pytest.raises(InferenceServerException, match=r"\[413\]") as caught:
        v2.infer("risk", [big])
    assert f"this server takes at most {MAX_REQUEST_BYTES}" in caught.value.message()
    x = tensor("features", np.zeros((1, 3), "float32"), "FP32")
    with pytest.raises(InferenceServerException, match=r"\[404\]"):
        v2.infer("nope", [x])


def test_wrong_datatypes_and_values_the_model_refuses_are_400(v2):
    with pytest.raises(InferenceServerException, match=r"\[400\]") as caught:
        v2.infer("risk", [tensor("features", np.zeros((1, 3), "float64"), "FP64")])
    assert "datatype 'FP64'; the model takes 'FP32'" in caught.value.message()
    with pytest.raises(InferenceServerException, match=r"\[400\]"):
        v2.infer("embed", [tensor("ids", np.array([[7]], "int64"), "INT64")])
    answer = v2.infer("embed", [tensor("ids", np.array([[4]], "int64"), "INT64")])
    assert answer.as_numpy("output_0").shape == (1, 1, 2)  # it keeps serving


def declared(name: str, shape: list[int], datatype: str, size: int) -> dict:
    """A binary input's JSON part: what it says it holds, and its byte count."""
    return {
        "name": name,
        "shape": shape,
        "datatype": datatype,
        "parameters": {"binary_data_size": size},
    }


@pytest.mark.parametrize(
    ("model", "item", "data", "fragment"),
    [
        (
            "risk",
            declared("features", [4, 3], "FP32", 12),
            ONES,
            "has 12 bytes of FP32 data, but its shape [4, 3] takes 48 (4 per element)",
        ),
        (
            "risk",
            declared("features", [2**40, 3], "FP32", 12),
            ONES,
            "has 1099511627776 rows (its first dimension); a request may hold at most 65536 "
            "(--max_request_rows)",
        ),
        (
            "risk",
            declared("features", [1, 2**31, 2**31], "FP32", 12),
            ONES,
            "too large for any array",
        ),
        ("risk", declared("features", [1, 4], "FP32", 12), ONES, "but the model takes (-1, 3)"),
        (
            "words",
            declared("word", [60000, 1], "BYTES", 7),
            as_bytes(b"dog"),
            "Input 'word' has 1 values, but its shape [60000, 1] holds 60000",
        ),
    ],
    ids=["more-elements", "rows", "overflow", "rank", "bytes-elements"],
)
def test_a_declared_shape_must_match_the_bytes_before_anything_is_allocated(
    http, model, item, data, fragment
):
    """A shape that claims more than the bytes hold is refused before an array is made."""
    body, headers = binary_body({"inputs": [item]}, data)
    response = http.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]
