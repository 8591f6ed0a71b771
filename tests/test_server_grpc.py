"""lifecycle.server's gRPC API, spoken to with tensorflow-serving-api's own stubs.

The server runs on 127.0.0.1 and a free port, over the models of
``support.servers.write_models``; every call has a deadline and every server is stopped.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from support import ROOT
from support.models import constant_model, save
from support.servers import MAX_REQUEST_BYTES, SERVE, free_port, grpc_running
from support.waits import wait_for_scans, wait_until
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

import lifecycle as lc
from lifecycle.server import ModelService, ServerConfig, build_app, build_grpc_server

TIMEOUT = 30  # seconds, every call's deadline


@pytest.fixture(scope="module")
def channel(models_root: Path) -> Iterator[grpc.Channel]:
    config = ServerConfig.from_flags(
        port=free_port(),
        model_config_file=str(models_root / "models.config"),
        max_request_bytes=MAX_REQUEST_BYTES,
    )
    with lc.ModelRegistry(name="test-grpc") as registry, grpc_running(registry, config) as chan:
        yield chan


@pytest.fixture
def predictions(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture
def models(channel: grpc.Channel) -> model_service_pb2_grpc.ModelServiceStub:
    return model_service_pb2_grpc.ModelServiceStub(channel)


def predict_request(
    name: str, inputs: dict[str, object], *, version: int | None = None, label: str | None = None
) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    return request


def outputs(response: predict_pb2.PredictResponse) -> dict[str, list]:
    return {key: tf.make_ndarray(proto).tolist() for key, proto in response.outputs.items()}


ZEROS = {"features": np.zeros((1, 3), "float32")}


# -- Predict ----------------------------------------------------------------------------


def test_predict_one_input_answers_by_output_name_and_names_the_version(predictions):
    response = predictions.Predict(
        predict_request("risk", {"features": np.ones((2, 3), "float32")}), timeout=TIMEOUT
    )
    assert outputs(response) == {"output_0": [[2.0, 2.0], [2.0, 2.0]]}
    assert response.outputs["output_0"].dtype == tf.float32.as_datatype_enum
    spec = response.model_spec
    assert (spec.name, spec.version.value, spec.signature_name) == ("risk", 2, "serving_default")


def test_predict_goes_to_the_version_or_label_asked_for(predictions):
    one = predictions.Predict(predict_request("risk", ZEROS, version=1), timeout=TIMEOUT)
    assert outputs(one) == {"output_0": [[1.0, 1.0]]}
    assert one.model_spec.version.value == 1
    stable = predictions.Predict(predict_request("risk", ZEROS, label="stable"), timeout=TIMEOUT)
    assert (outputs(stable), stable.model_spec.version.value) == ({"output_0": [[1.0, 1.0]]}, 1)
    canary = predictions.Predict(predict_request("risk", ZEROS, label="canary"), timeout=TIMEOUT)
    assert (outputs(canary), canary.model_spec.version.value) == ({"output_0": [[2.0, 2.0]]}, 2)


def test_predict_two_inputs_and_output_filter(predictions):
    inputs = {"a": np.array([[1.0, 2.0], [0.0, 0.0]], "float32"), "b": np.array([[3], [1]])}
    response = predictions.Predict(predict_request("pair", inputs), timeout=TIMEOUT)
    assert outputs(response) == {
        "score": [[12.0], [2.0]],
        "logits": [[6.0, 6.0, 6.0], [1.0, 1.0, 1.0]],
    }
    request = predict_request("pair", inputs)
    request.output_filter.append("score")
    assert outputs(predictions.Predict(request, timeout=TIMEOUT)) == {"score": [[12.0], [2.0]]}


def test_predict_string_inputs(predictions):
    words = np.array([[b"dog"], [b"cat"], [b"\xff-unknown"]], dtype=object)
    response = predictions.Predict(predict_request("words", {"word": words}), timeout=TIMEOUT)
    assert list(outputs(response).values()) == [[[2], [1], [0]]]


# -- metadata and status ----------------------------------------------------------------


def test_metadata_is_the_signature_def_map_packed_in_an_any(predictions):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "risk"
    request.model_spec.version_label = "stable"
    response = predictions.GetModelMetadata(request, timeout=TIMEOUT)
    assert (response.model_spec.name, response.model_spec.version.value) == ("risk", 1)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict"
    features = signature.inputs["features"]
    assert features.dtype == tf.float32.as_datatype_enum
    assert [d.size for d in features.tensor_shape.dim] == [-1, 3]
    assert list(signature.outputs) == ["output_0"]


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [([], "at least one metadata_field"), (["signature_def", "other"], "['other'] are not")],
)
def test_metadata_fields_other_than_signature_def_are_invalid(predictions, fields, fragment):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=fields)
    request.model_spec.name = "risk"
    with pytest.raises(grpc.RpcError) as caught:
        predictions.GetModelMetadata(request, timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in caught.value.details()


def test_model_status_of_every_version_and_of_a_label(models):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "risk"
    response = models.GetModelStatus(request, timeout=TIMEOUT)
    available = get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert sorted((s.version, s.state) for s in response.model_version_status) == [
        (1, available),
        (2, available),
    ]
    assert all(s.status.error_code == 0 for s in response.model_version_status)
    request.model_spec.version_label = "canary"
    response = models.GetModelStatus(request, timeout=TIMEOUT)
    assert [s.version for s in response.model_version_status] == [2]


# -- errors -----------------------------------------------------------------------------


def status_request(name: str, version: int | None = None):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    return request


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (predict_request("nope", ZEROS), "No model named 'nope'"),
        (predict_request("risk", ZEROS, version=3), "no version 3"),
        (predict_request("risk", ZEROS, label="beta"), "no label 'beta'"),
    ],
)
def test_unknown_model_version_or_label_is_not_found(predictions, request_, fragment):
    with pytest.raises(grpc.RpcError) as caught:
        predictions.Predict(request_, timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert fragment in caught.value.details()


def test_status_of_an_unknown_model_or_version_is_not_found(models):
    for request, fragment in [
        (status_request("nope"), "No model named 'nope'"),
        (status_request("risk", 3), "has no version 3"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            models.GetModelStatus(request, timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND
        assert fragment in caught.value.details()


def with_signature(request: predict_pb2.PredictRequest, name: str) -> predict_pb2.PredictRequest:
    request.model_spec.signature_name = name
    return request


def with_filter(request: predict_pb2.PredictRequest, name: str) -> predict_pb2.PredictRequest:
    request.output_filter.append(name)
    return request


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (predict_request("risk", {"features": np.zeros((1, 2))}), "has shape (1, 2)"),
        (
            predict_request("risk", {"features": np.array([[b"a", b"b", b"c"]], object)}),
            "must hold float32 values",
        ),
        (predict_request("risk", {"nope": np.zeros((1, 3))}), "missing ['features']"),
        (predict_request("risk", {}), "missing ['features']"),
        (with_signature(predict_request("risk", ZEROS), "other"), "'other' not found"),
        (with_filter(predict_request("risk", ZEROS), "nope"), "output_filter names ['nope']"),
        (predict_request("", ZEROS), "model_spec has no name"),
        # Values the model's own ops refuse: an id out of the embedding's range.
        (predict_request("embed", {"ids": np.array([[7]])}), "7 is not in [0, 5)"),
    ],
)
def test_bad_predict_requests_are_invalid_argument_with_a_message(predictions, request_, fragment):
    with pytest.raises(grpc.RpcError) as caught:
        predictions.Predict(request_, timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in caught.value.details()


def lying(name: str, shape: list[int], **values: object) -> predict_pb2.PredictRequest:
    """A request whose float32 ``features`` declare ``shape`` but hold only ``values``."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    tensor = request.inputs["features"]
    tensor.dtype = tf.float32.as_datatype_enum
    for size in shape:
        tensor.tensor_shape.dim.add(size=size)
    for field, value in values.items():
        if field == "tensor_content":
            tensor.tensor_content = value
        else:
            getattr(tensor, field).extend(value)
    return request


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (
            lying("risk", [1, 3], tensor_content=b"\x00" * 5),
            "tensor_shape [1, 3] of float32 takes 12 bytes of tensor_content (4 a value), but "
            "the request sends 5",
        ),
        (
            lying("risk", [2, 3], float_val=[1.0]),
            "tensor_shape [2, 3] holds 6 values, but the request sends 1 in float_val",
        ),
        (lying("risk", [4, 3]), "holds 12 values, but the request sends none"),
        (lying("risk", [1, 25_000_000], float_val=[1.0]), "has shape (1, 25000000), but the"),
        (lying("risk", [2**40]), "Input 'features' has shape (1099511627776,), but the model"),
        (lying("risk", [65_537, 3]), "has 65537 rows (its first dimension); a request may hold"),
        (lying("risk", [1, 3], int_val=[1, 2, 3]), "its values go in tensor_content or float_val"),
    ],
)
def test_a_tensor_proto_whose_values_do_not_fill_its_shape_is_invalid_argument(
    predictions, request_, fragment
):
    with pytest.raises(grpc.RpcError) as caught:
        predictions.Predict(request_, timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in caught.value.details()


def test_the_model_and_input_names_are_checked_before_any_tensor_is_read(predictions):
    # A shape no array can have: reading it first would be a 500, or worse.
    with pytest.raises(grpc.RpcError) as caught:
        predictions.Predict(lying("nope", [2**40, 2**40]), timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert "No model named 'nope'" in caught.value.details()
    request = lying("risk", [2**40, 2**40])
    request.inputs["other"].CopyFrom(request.inputs.pop("features"))
    with pytest.raises(grpc.RpcError) as caught:
        predictions.Predict(request, timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "missing ['features'], unknown ['other']" in caught.value.details()


def test_a_message_over_the_limit_is_resource_exhausted(predictions):
    rows = np.zeros((MAX_REQUEST_BYTES // 12 + 1, 3), "float32")
    with pytest.raises(grpc.RpcError) as caught:
        predictions.Predict(predict_request("risk", {"features": rows}), timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_classify_of_a_keras_model_says_its_signature_is_a_predict_one(predictions):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "risk"
    request.input.example_list.examples.add()
    with pytest.raises(grpc.RpcError) as caught:
        predictions.Classify(request, timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "Expected classify signature method_name to be tensorflow/serving/classify. Was: "
        "tensorflow/serving/predict" in caught.value.details()
    )
    # The method is checked before the input is read: an empty one gets the same answer.
    empty = classification_pb2.ClassificationRequest()
    empty.model_spec.name = "risk"
    with pytest.raises(grpc.RpcError) as caught:
        predictions.Classify(empty, timeout=TIMEOUT)
    assert "Expected classify signature method_name" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        predictions.MultiInference(inference_pb2.MultiInferenceRequest(), timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_bad_requests_do_not_disturb_good_ones(channel, models):
    errors: list[object] = []
    good = predict_request("risk", {"features": np.ones((1, 3), "float32")})
    bad = [
        predict_request("risk", {"features": np.zeros((1, 2), "float32")}),
        predict_request("nope", ZEROS),
        predict_request("embed", {"ids": np.array([[9]])}),
    ]

    def client(n: int) -> None:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for i in range(15):
            try:
                response = stub.Predict(bad[i % 3] if n % 2 else good, timeout=TIMEOUT)
            except grpc.RpcError as error:
                if not n % 2 or error.code() not in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.NOT_FOUND,
                ):
                    errors.append((n, error.code(), error.details()))
            else:
                if n % 2 or outputs(response) != {"output_0": [[2.0, 2.0]]}:
                    errors.append((n, outputs(response)))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    status = models.GetModelStatus(status_request("risk", 2), timeout=TIMEOUT)
    assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE


# -- HandleReloadConfigRequest ----------------------------------------------------------


def reload_request(text: str) -> model_management_pb2.ReloadConfigRequest:
    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(text, request.config)
    return request


def test_reload_config_adds_and_drops_models_and_polling_follows(tmp_path):
    save(constant_model(1.0), tmp_path / "a", 1)
    save(constant_model(2.0), tmp_path / "b", 1)
    save(constant_model(3.0), tmp_path / "c", 1)
    config = ServerConfig.from_flags(
        port=free_port(),
        model_name="a",
        model_base_path=str(tmp_path / "a"),
        file_system_poll_wait_seconds=0.1,
    )
    a = f'config {{ name: "a" base_path: "{tmp_path / "a"}" }}'
    b = f'config {{ name: "b" base_path: "{tmp_path / "b"}" }}'
    c = (
        f'config {{ name: "c" base_path: "{tmp_path / "c"}" '
        'version_labels { key: "stable" value: 1 } }'
    )
    with lc.ModelRegistry(name="reload") as registry, grpc_running(registry, config) as channel:
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        predictions = prediction_service_pb2_grpc.PredictionServiceStub(channel)

        def answer(name: str) -> object:
            response = predictions.Predict(predict_request(name, ZEROS), timeout=TIMEOUT)
            return outputs(response)["output_0"]

        added = models.HandleReloadConfigRequest(
            reload_request(f"model_config_list {{ {a} {b} {c} }}"), timeout=TIMEOUT
        )
        assert added.status.error_code == 0
        assert (answer("a"), answer("b"), answer("c")) == ([[1.0, 1.0]], [[2.0, 2.0]], [[3.0, 3.0]])
        stable = predictions.Predict(predict_request("c", ZEROS, label="stable"), timeout=TIMEOUT)
        assert stable.model_spec.version.value == 1

        models.HandleReloadConfigRequest(
            reload_request(f"model_config_list {{ {b} {c} }}"), timeout=TIMEOUT
        )
        assert answer("b") == [[2.0, 2.0]]
        with pytest.raises(grpc.RpcError) as caught:
            models.GetModelStatus(status_request("a"), timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND
        assert {s.name for s in registry.status()} == {"b", "c"}  # a's version retired
        save(constant_model(5.0), tmp_path / "b", 2)  # polling serves added models' versions
        wait_until(lambda: answer("b") == [[5.0, 5.0]], "b's version 2 served")
        wait_for_scans(registry, "b")  # polls ran: the dropped model stays dropped
        assert {s.name for s in registry.status()} == {"b", "c"}

        # A labelled model is dropped with its labels, as TensorFlow Serving does.
        models.HandleReloadConfigRequest(
            reload_request(f"model_config_list {{ {b} }}"), timeout=TIMEOUT
        )
        wait_until(lambda: {s.name for s in registry.status()} == {"b"}, "c retired")
        with pytest.raises(grpc.RpcError) as caught:
            predictions.Predict(predict_request("c", ZEROS, label="stable"), timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        (
            'model_config_list { config { name: "x" base_path: "/no/such/models" } }',
            grpc.StatusCode.INVALID_ARGUMENT,
            "ReloadConfigRequest, model 'x': base path '/no/such/models' is not a directory",
        ),
        (
            'model_config_list { config { name: "x" } }',
            grpc.StatusCode.INVALID_ARGUMENT,
            "every config needs a name and a base_path",
        ),
        ("", grpc.StatusCode.INVALID_ARGUMENT, "ReloadConfigRequest has no model_config_list"),
    ],
)
def test_bad_reload_configs_are_refused_with_a_message(models, text, code, fragment):
    with pytest.raises(grpc.RpcError) as caught:
        models.HandleReloadConfigRequest(reload_request(text), timeout=TIMEOUT)
    assert caught.value.code() is code
    assert fragment in caught.value.details()


# -- admin calls over gRPC: the one authorization -------------------------------------

TOKEN = "s3cret-token-of-the-admin"  # 16 characters or more: the server's minimum


def test_reload_config_takes_the_admin_token(tmp_path):
    save(constant_model(1.0), tmp_path / "a", 1)
    save(constant_model(2.0), tmp_path / "b", 1)
    config = ServerConfig.from_flags(
        port=free_port(), model_name="a", model_base_path=str(tmp_path / "a"), admin_token=TOKEN
    )
    only_b = reload_request(
        f'model_config_list {{ config {{ name: "b" base_path: "{tmp_path / "b"}" }} }}'
    )
    with lc.ModelRegistry(name="reload-token") as registry, grpc_running(registry, config) as chan:
        models = model_service_pb2_grpc.ModelServiceStub(chan)
        for metadata, fragment in [
            ((), "needs 'Authorization: Bearer <token>'"),
            ((("authorization", "Basic czNjcmV0"),), "needs 'Authorization: Bearer <token>'"),
            ((("authorization", "Bearer wrong"),), "not the server's --admin_token"),
        ]:
            with pytest.raises(grpc.RpcError) as caught:
                models.HandleReloadConfigRequest(only_b, metadata=metadata, timeout=TIMEOUT)
            assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert fragment in caught.value.details()
            assert {s.name for s in registry.status()} == {"a"}  # nothing changed
        # Reading needs no token.
        status = models.GetModelStatus(status_request("a"), timeout=TIMEOUT)
        assert status.model_version_status[0].version == 1
        models.HandleReloadConfigRequest(
            only_b, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=TIMEOUT
        )
        assert {s.name for s in registry.status()} == {"b"}


def test_with_the_admin_api_turned_off_reload_config_is_permission_denied(tmp_path):
    save(constant_model(1.0), tmp_path / "a", 1)
    config = ServerConfig.from_flags(
        port=free_port(), model_name="a", model_base_path=str(tmp_path / "a"), admin_api=False
    )
    nothing = reload_request("model_config_list { }")
    with lc.ModelRegistry(name="reload-off") as registry, grpc_running(registry, config) as chan:
        models = model_service_pb2_grpc.ModelServiceStub(chan)
        with pytest.raises(grpc.RpcError) as caught:
            models.HandleReloadConfigRequest(nothing, timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "turned off on this server (--no_admin_api)" in caught.value.details()
        assert {s.name for s in registry.status()} == {"a"}  # not unloaded
        predictions = prediction_service_pb2_grpc.PredictionServiceStub(chan)
        answer = predictions.Predict(predict_request("a", ZEROS), timeout=TIMEOUT)
        assert outputs(answer) == {"output_0": [[1.0, 1.0]]}  # requests are served


def test_a_sticky_key_in_grpc_metadata_keeps_its_version(tmp_path):
    config = ServerConfig.from_flags(port=free_port())
    with lc.ModelRegistry(name="grpc-sticky") as registry:
        registry.load("m", 1, lambda: constant_model(1.0))
        registry.load("m", 2, lambda: constant_model(2.0))
        registry.route("m", {1: 1.0, 2: 1.0})
        with grpc_running(registry, config) as chan:
            predictions = prediction_service_pb2_grpc.PredictionServiceStub(chan)
            chosen = {}
            for i in range(30):
                metadata = (("x-lifecycle-key", f"user-{i}"),)
                answers = {
                    predictions.Predict(
                        predict_request("m", ZEROS), metadata=metadata, timeout=TIMEOUT
                    ).model_spec.version.value
                    for _ in range(3)
                }
                assert len(answers) == 1, f"key user-{i} was answered by versions {answers}"
                chosen[i] = answers.pop()
    assert set(chosen.values()) == {1, 2}


# -- configuration ----------------------------------------------------------------------


def test_grpc_port_defaults_to_tensorflow_servings_and_flags_are_checked():
    config = ServerConfig.from_flags()
    assert (config.grpc_port, config.rest_api_port, config.grpc_max_threads) == (8500, 8501, 16)
    with pytest.raises(ValueError, match=r"--port must be a port number, 0-65535\. Received: -1"):
        ServerConfig.from_flags(port=-1)
    with pytest.raises(ValueError, match="--grpc_max_threads must be an integer >= 1"):
        ServerConfig.from_flags(grpc_max_threads=0)


def test_build_grpc_server_refuses_port_0_and_a_port_in_use():
    with lc.ModelRegistry(name="ports") as registry:
        off = ServerConfig.from_flags(port=0)
        with pytest.raises(ValueError, match="--port is 0: the gRPC server is off"):
            build_grpc_server(ModelService(registry, off), off)
        port = free_port()
        taken = ServerConfig.from_flags(port=port)
        first = build_grpc_server(ModelService(registry, taken), taken)
        first.start()
        try:
            with pytest.raises(OSError, match=f"--port {port}: cannot listen on 127.0.0.1:{port}"):
                build_grpc_server(ModelService(registry, taken), taken)
        finally:
            first.stop(grace=None).wait(30)


@pytest.mark.subprocess
@pytest.mark.slow
def test_lifecycle_serve_exits_1_when_the_grpc_port_is_taken():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ["--port", str(port), "--rest_api_port", str(free_port())]
        result = subprocess.run(
            [*SERVE, *flags], cwd=ROOT, capture_output=True, text=True, timeout=180
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"gRPC: --port {port}: cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Registry closed: 0 version(s)" in result.stderr


def test_build_app_shares_a_service_only_over_its_own_registry():
    config = ServerConfig.from_flags(port=0)
    with lc.ModelRegistry(name="one") as one, lc.ModelRegistry(name="other") as other:
        service = ModelService(one, config)
        assert build_app(one, config, service=service) is not None
        with pytest.raises(ValueError, match="`service` must serve `registry`"):
            build_app(other, config, service=service)
