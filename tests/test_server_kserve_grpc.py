"""KServe v2's gRPC API (``inference.GRPCInferenceService``), spoken by tritonclient.grpc.

tritonclient.grpc with its defaults (raw tensor contents both ways) against the
server of ``build_grpc_server``, over the models of fixture ``kserve_root``;
typed ``contents`` through tritonclient's generated stub. Servers run on
127.0.0.1 and a free port, every call has a deadline, and every server is stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as triton
from google.protobuf import descriptor_pb2
from support.servers import MAX_REQUEST_BYTES, free_port, grpc_running
from support.waits import wait_until
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import lifecycle as lc
from lifecycle.server import ServerConfig
from lifecycle.server.kserve._open_inference import SERVICE, methods

TIMEOUT = 30  # seconds, every call's deadline
TOKEN = "s3cret-token-of-the-admin"  # 16 characters or more: the server's minimum


def serve(root: Path, **flags: object) -> ServerConfig:
    return ServerConfig.from_flags(
        port=free_port(),
        model_config_file=str(root / "models.config"),
        max_request_bytes=MAX_REQUEST_BYTES,
        **flags,
    )


@pytest.fixture(scope="module")
def address(kserve_root: Path) -> Iterator[str]:
    config = serve(kserve_root)
    with lc.ModelRegistry(name="test-kserve-grpc") as registry, grpc_running(registry, config):
        yield f"127.0.0.1:{config.grpc_port}"


@pytest.fixture
def client(address: str) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(address) as each:
        yield each


@pytest.fixture
def stub(address: str) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(address) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def tensor(name: str, array: np.ndarray, datatype: str) -> triton.InferInput:
    item = triton.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)  # raw_input_contents: tritonclient's only way
    return item


def refused(call, code: grpc.StatusCode) -> str:
    """The message of ``call()``'s error, which must carry ``code``."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    assert caught.value.status() == str(code), caught.value
    return caught.value.message()


# -- the wire: our messages are Triton's ------------------------------------------------


def fields(descriptor) -> list[tuple]:
    proto = descriptor_pb2.DescriptorProto()
    descriptor.CopyToProto(proto)
    return [(f.name, f.number, f.type, f.label, f.type_name) for f in proto.field]


def test_every_message_served_has_the_field_numbers_of_triton_s():
    triton_service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert triton_service.full_name == SERVICE
    for name, (request, response) in methods().items():
        theirs = triton_service.methods_by_name[name]
        assert fields(request.DESCRIPTOR) == fields(theirs.input_type), name
        assert fields(response.DESCRIPTOR) == fields(theirs.output_type), name
        for nested in (*request.DESCRIPTOR.nested_types, *response.DESCRIPTOR.nested_types):
            ours = fields(nested)
            assert ours == fields(
                service_pb2.DESCRIPTOR.pool.FindMessageTypeByName(nested.full_name)
            ), nested.full_name


# -- the server and its models --------------------------------------------------------------


def test_live_ready_and_server_metadata(client):
    assert client.is_server_live(client_timeout=TIMEOUT)
    assert client.is_server_ready(client_timeout=TIMEOUT)
    metadata = client.get_server_metadata(as_json=True, client_timeout=TIMEOUT)
    assert metadata["name"] == "keras-lifecycle"
    assert {"model_repository", "binary_tensor_data"} <= set(metadata["extensions"])


def test_model_metadata_and_readiness(client):
    metadata = client.get_model_metadata("pair", as_json=True, client_timeout=TIMEOUT)
    assert metadata["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": ["-1", "2"]},
        {"name": "b", "datatype": "INT64", "shape": ["-1", "1"]},
    ]
    assert sorted(o["name"] for o in metadata["outputs"]) == ["logits", "score"]
    assert metadata["versions"] == ["4"] and metadata["platform"] == "tensorflow_keras"
    risk = client.get_model_metadata("risk", model_version="1", client_timeout=TIMEOUT)
    assert list(risk.versions) == ["1", "2"]
    assert client.is_model_ready("risk", client_timeout=TIMEOUT)
    assert client.is_model_ready("risk", model_version="2", client_timeout=TIMEOUT)
    assert not client.is_model_ready("risk", model_version="3", client_timeout=TIMEOUT)
    assert not client.is_model_ready("nope", client_timeout=TIMEOUT)
    message = refused(
        lambda: client.get_model_metadata("nope", client_timeout=TIMEOUT),
        grpc.StatusCode.NOT_FOUND,
    )
    assert "nope" in message
    message = refused(
        lambda: client.is_model_ready("risk", model_version="v1", client_timeout=TIMEOUT),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "A model version must be a number. Received: 'v1'" in message


# -- ModelInfer with tritonclient's defaults (raw contents) ---------------------------------


def test_infer_fp32_on_the_default_and_on_a_pinned_version(client):
    x = tensor("features", np.ones((2, 3), "float32"), "FP32")
    result = client.infer("risk", [x], request_id="r-1", client_timeout=TIMEOUT)
    np.testing.assert_array_equal(result.as_numpy("output_0"), [[2.0, 2.0], [2.0, 2.0]])
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("risk", "2", "r-1")
    assert len(response.raw_output_contents) == 1
    pinned = client.infer("risk", [x], model_version="1", client_timeout=TIMEOUT)
    np.testing.assert_array_equal(pinned.as_numpy("output_0"), [[1.0, 1.0], [1.0, 1.0]])


def test_infer_two_inputs_and_a_subset_of_outputs(client):
    inputs = [
        tensor("a", np.array([[1, 2], [0, 0]], "float32"), "FP32"),
        tensor("b", np.array([[3], [1]], "int64"), "INT64"),
    ]
    both = client.infer("pair", inputs, client_timeout=TIMEOUT)
    np.testing.assert_array_equal(both.as_numpy("score"), [[12.0], [2.0]])
    np.testing.assert_array_equal(both.as_numpy("logits"), [[6.0] * 3, [1.0] * 3])
    one = client.infer(
        "pair", inputs, outputs=[triton.InferRequestedOutput("score")], client_timeout=TIMEOUT
    )
    np.testing.assert_array_equal(one.as_numpy("score"), [[12.0], [2.0]])
    assert one.as_numpy("logits") is None


def test_infer_bytes_fp16_and_bf16(client):
    words = tensor("word", np.array([[b"dog"], [b"cat"], [b"emu"]], object), "BYTES")
    found = client.infer("words", [words], client_timeout=TIMEOUT).as_numpy("output_0")
    np.testing.assert_array_equal(found, [[2], [1], [0]])
    values = np.array([[b"", b"a\x00b"], [b"\xff\xfe", "é".encode()]], object)
    echoed = client.infer("text", [tensor("x", values, "BYTES")], client_timeout=TIMEOUT)
    assert echoed.as_numpy("output_0").tolist() == values.tolist()
    half = np.array([[0.5, -2.0]], "float16")
    answer = client.infer("half", [tensor("x", half, "FP16")], client_timeout=TIMEOUT)
    assert answer.as_numpy("output_0").dtype == np.float16
    np.testing.assert_array_equal(answer.as_numpy("output_0"), half)
    bhalf = np.array([[1.5, -3.0]], ml_dtypes.bfloat16)
    answer = client.infer("bhalf", [tensor("x", bhalf, "BF16")], client_timeout=TIMEOUT)
    np.testing.assert_array_equal(answer.as_numpy("output_0"), bhalf)


def test_infer_with_typed_contents(stub):
    request = service_pb2.ModelInferRequest(model_name="pair")
    a = request.inputs.add(name="a", datatype="FP32", shape=[1, 2])
    a.contents.fp32_contents.extend([1.0, 2.0])
    b = request.inputs.add(name="b", datatype="INT64", shape=[1, 1])
    b.contents.int64_contents.append(3)
    response = stub.ModelInfer(request, timeout=TIMEOUT)
    result = triton.InferResult(response)
    np.testing.assert_array_equal(result.as_numpy("score"), [[12.0]])
    words = service_pb2.ModelInferRequest(model_name="words")
    word = words.inputs.add(name="word", datatype="BYTES", shape=[2, 1])
    word.contents.bytes_contents.extend([b"cat", b"dog"])
    result = triton.InferResult(stub.ModelInfer(words, timeout=TIMEOUT))
    np.testing.assert_array_equal(result.as_numpy("output_0"), [[1], [2]])


def infer_request(model: str, *inputs: tuple[str, str, list[int]], raw: list[bytes] = ()):
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.extend(raw)
    return request


ONES = np.ones(3, "<f4").tobytes()


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (
            infer_request("nope", ("features", "FP32", [1, 3]), raw=[ONES]),
            grpc.StatusCode.NOT_FOUND,
            "nope",
        ),
        (
            infer_request("risk", ("features", "FP32", [1, 2]), raw=[ONES[:8]]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "has shape (1, 2)",
        ),
        (
            infer_request("risk", ("features", "FP32", [1, 3]), raw=[ONES[:8]]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "has 8 bytes of FP32 data, but its shape [1, 3] takes 12",
        ),
        (
            infer_request("risk", ("features", "INT64", [1, 3]), raw=[ONES]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "datatype 'INT64'; the model takes 'FP32'",
        ),
        (
            infer_request("risk", ("other", "FP32", [1, 3]), raw=[ONES]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "no input named 'other'",
        ),
        (
            infer_request("pair", ("a", "FP32", [1, 2]), ("b", "INT64", [1, 1]), raw=[ONES]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "has 2 inputs but 1 raw_input_contents",
        ),
        (
            infer_request("half", ("x", "FP16", [1, 2])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "has no typed contents field: send it as raw_input_contents",
        ),
        (
            infer_request("risk", ("features", "FP32", [1, 3])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Input 'features' has 0 values, but its shape [1, 3] holds 3",
        ),
        (
            infer_request(
                "risk", ("features", "FP32", [1, 3]), ("features", "FP32", [1, 3]), raw=[ONES] * 2
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "appears twice",
        ),
        (
            infer_request("embed", ("ids", "INT64", [1, 1]), raw=[np.int64(9).tobytes()]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "",
        ),
        (
            infer_request("", ("features", "FP32", [1, 3]), raw=[ONES]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "names no model",
        ),
    ],
)
def test_bad_infer_requests_carry_their_code_and_a_message(stub, request_, code, fragment):
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request_, timeout=TIMEOUT)
    assert caught.value.code() == code, caught.value.details()
    assert fragment in caught.value.details()


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        ([1, 25_000_000], "Input 'features' has shape (1, 25000000), but the model takes (-1, 3)"),
        ([2**40, 3], "has 1099511627776 rows (its first dimension); a request may hold at most"),
        ([65_537, 3], "has 65537 rows (its first dimension)"),
        ([-1, 3], "declares shape [-1, 3]: a dimension cannot be negative"),
        ([2**62, 2**62], "too large for any array"),
    ],
)
@pytest.mark.parametrize("form", ["raw", "contents"])
def test_a_declared_shape_is_refused_before_its_values_are_read(stub, shape, fragment, form):
    # One value sent: a shape beyond it would cost the server, not the client.
    request = infer_request("risk", ("features", "FP32", shape), raw=[ONES[:4]] * (form == "raw"))
    if form == "contents":
        request.inputs[0].contents.fp32_contents.append(1.0)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert fragment in caught.value.details()


def test_an_unknown_output_and_a_message_over_the_limit(client):
    x = tensor("features", np.zeros((1, 3), "float32"), "FP32")
    message = refused(
        lambda: client.infer(
            "risk",
            [x],
            outputs=[triton.InferRequestedOutput("output_9")],
            client_timeout=TIMEOUT,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "The model has no outputs ['output_9']" in message
    big = tensor("features", np.zeros((MAX_REQUEST_BYTES // 12 + 1, 3), "float32"), "FP32")
    refused(
        lambda: client.infer("risk", [big], client_timeout=TIMEOUT),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )


def test_other_methods_of_the_service_are_unimplemented_with_a_message(client):
    message = refused(
        lambda: client.get_inference_statistics(client_timeout=TIMEOUT),
        grpc.StatusCode.UNIMPLEMENTED,
    )
    assert "inference.GRPCInferenceService/ModelStatistics is not served" in message
    assert "ModelInfer" in message
    refused(
        lambda: client.get_model_config("risk", client_timeout=TIMEOUT),
        grpc.StatusCode.UNIMPLEMENTED,
    )


# -- the model repository ------------------------------------------------------------------


def test_repository_index_unload_and_load(client, stub):
    index = client.get_model_repository_index(as_json=True, client_timeout=TIMEOUT)["models"]
    rows = {(m["name"], m["version"]): m["state"] for m in index}
    assert rows[("risk", "1")] == rows[("risk", "2")] == rows[("words", "1")] == "READY"
    client.unload_model("words", client_timeout=TIMEOUT)
    wait_until(lambda: not client.is_model_ready("words", client_timeout=TIMEOUT), "words unloaded")
    after = client.get_model_repository_index(client_timeout=TIMEOUT).models
    assert ("words", "", "UNAVAILABLE") in {(m.name, m.version, m.state) for m in after}
    ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=TIMEOUT)
    assert "words" not in {m.name for m in ready.models}
    assert all(m.state == "READY" for m in ready.models) and len(ready.models) == len(index) - 1
    client.load_model("words", client_timeout=TIMEOUT)
    assert client.is_model_ready("words", client_timeout=TIMEOUT)
    message = refused(
        lambda: client.load_model("nope", client_timeout=TIMEOUT), grpc.StatusCode.NOT_FOUND
    )
    assert "not in the server's configuration" in message
    refused(lambda: client.unload_model("nope", client_timeout=TIMEOUT), grpc.StatusCode.NOT_FOUND)


@pytest.fixture(scope="module")
def guarded(kserve_root: Path) -> Iterator[tuple[str, str]]:
    """A server with an admin token, and one with the admin API turned off."""
    with_token = serve(kserve_root, admin_token=TOKEN)
    turned_off = serve(kserve_root, admin_api=False)
    with (
        lc.ModelRegistry(name="test-kserve-grpc-token") as first,
        grpc_running(first, with_token),
        lc.ModelRegistry(name="test-kserve-grpc-off") as second,
        grpc_running(second, turned_off),
    ):
        yield f"127.0.0.1:{with_token.grpc_port}", f"127.0.0.1:{turned_off.grpc_port}"


def test_repository_load_and_unload_need_the_admin_token(guarded):
    address, _ = guarded
    with triton.InferenceServerClient(address) as client:
        for call in (client.unload_model, client.load_model):
            message = refused(
                lambda call=call: call("words", client_timeout=TIMEOUT),
                grpc.StatusCode.UNAUTHENTICATED,
            )
            assert "Bearer <token>" in message
            message = refused(
                lambda call=call: call(
                    "words", headers={"authorization": "Bearer wrong"}, client_timeout=TIMEOUT
                ),
                grpc.StatusCode.UNAUTHENTICATED,
            )
            assert "not the server's --admin_token" in message
        assert client.is_model_ready("words", client_timeout=TIMEOUT)  # untouched
        bearer = {"authorization": f"Bearer {TOKEN}"}
        client.unload_model("words", headers=bearer, client_timeout=TIMEOUT)
        wait_until(
            lambda: not client.is_model_ready("words", client_timeout=TIMEOUT), "words unloaded"
        )
        client.load_model("words", headers=bearer, client_timeout=TIMEOUT)
        assert client.is_model_ready("words", client_timeout=TIMEOUT)
        # Reading needs no token.
        assert client.get_model_repository_index(client_timeout=TIMEOUT).models


def test_repository_load_and_unload_are_refused_with_the_admin_api_off(guarded):
    _, address = guarded
    with triton.InferenceServerClient(address) as client:
        for call in (client.unload_model, client.load_model):
            message = refused(
                lambda call=call: call("words", client_timeout=TIMEOUT),
                grpc.StatusCode.PERMISSION_DENIED,
            )
            assert "--no_admin_api" in message
        assert client.is_model_ready("words", client_timeout=TIMEOUT)
