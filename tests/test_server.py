"""lifecycle.server: the real server on 127.0.0.1, spoken to by real clients.

TensorFlow Serving's REST API is exercised with plain HTTP shaped as its
``api_rest.md`` shows; KServe's v2 protocol with tritonclient's HTTP client.
The served models are those of ``support.servers.write_models`` (fixture
``models_root``).
"""

from __future__ import annotations

import base64
import inspect
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
import tritonclient.http as triton
from support.models import constant_model, save
from support.servers import (
    MAX_REQUEST_BYTES,
    SERVE,
    free_port,
    lifecycle_serve,
    rest_answer,
    running,
    stop,
)
from support.waits import wait_for_scans, wait_until
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tritonclient.utils import InferenceServerException

import lifecycle as lc
from lifecycle.server import ServedModel, ServerConfig, _flags


@pytest.fixture(scope="module")
def server(models_root: Path) -> Iterator[str]:
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_config_file=str(models_root / "models.config"),
        max_request_bytes=MAX_REQUEST_BYTES,
    )
    with lc.ModelRegistry(name="test-server") as registry, running(registry, config) as url:
        yield url


@pytest.fixture
def http(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=30) as client:
        yield client


@pytest.fixture
def v2(server: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.removeprefix("http://"), network_timeout=30)
    yield client
    client.close()


# -- TensorFlow Serving REST: status and metadata --------------------------------


def test_model_status_lists_the_versions_the_policy_serves(http):
    body = http.get("/v1/models/risk").json()
    assert sorted(body["model_version_status"], key=lambda s: s["version"]) == [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
        {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
    ]


def test_model_status_of_a_version_and_of_a_label(http):
    one = http.get("/v1/models/risk/versions/1").json()
    assert [s["version"] for s in one["model_version_status"]] == ["1"]
    canary = http.get("/v1/models/risk/labels/canary").json()
    assert [s["version"] for s in canary["model_version_status"]] == ["2"]


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/v1/models/nope", "No model named 'nope'"),
        ("/v1/models/risk/versions/3", "has no version 3"),
        ("/v1/models/risk/labels/beta", "no version labelled 'beta'"),
        ("/v1/models/risk/labels/beta/metadata", "no label 'beta'"),
        ("/v1/models/risk/versions/7/metadata", "no version 7"),
    ],
)
def test_unknown_model_version_or_label_is_404_with_an_error(http, path, fragment):
    response = http.get(path)
    assert response.status_code == 404
    assert fragment in response.json()["error"]


def test_metadata_is_the_serving_default_signature_def(http):
    body = http.get("/v1/models/risk/labels/stable/metadata").json()
    assert body["model_spec"] == {"name": "risk", "version": "1", "signature_name": ""}
    signature = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["method_name"] == "tensorflow/serving/predict"
    features = signature["inputs"]["features"]
    assert features["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in features["tensor_shape"]["dim"]] == ["-1", "3"]
    assert list(signature["outputs"]) == ["output_0"]
    pair = http.get("/v1/models/pair/metadata").json()
    inputs = pair["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert {name: spec["dtype"] for name, spec in inputs.items()} == {
        "a": "DT_FLOAT",
        "b": "DT_INT64",
    }


# -- TensorFlow Serving REST: predict --------------------------------------------


def test_predict_row_and_columnar_formats_named_and_unnamed(http):
    rows = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert http.post("/v1/models/risk:predict", json={"instances": rows}).json() == {
        "predictions": [[2.0, 2.0], [2.0, 2.0]]
    }
    named = [{"features": row} for row in rows]
    assert http.post("/v1/models/risk:predict", json={"instances": named}).json() == {
        "predictions": [[2.0, 2.0], [2.0, 2.0]]
    }
    assert http.post("/v1/models/risk:predict", json={"inputs": rows}).json() == {
        "outputs": [[2.0, 2.0], [2.0, 2.0]]
    }
    assert http.post(
        "/v1/models/risk:predict",
        json={"signature_name": "serving_default", "inputs": {"features": rows[:1]}},
    ).json() == {"outputs": [[2.0, 2.0]]}


def test_predict_goes_to_the_version_or_label_asked_for(http):
    body = {"instances": [[0.0, 0.0, 0.0]]}
    assert http.post("/v1/models/risk/versions/1:predict", json=body).json()["predictions"] == [
        [1.0, 1.0]
    ]
    assert http.post("/v1/models/risk/labels/stable:predict", json=body).json()["predictions"] == [
        [1.0, 1.0]
    ]
    assert http.post("/v1/models/risk/labels/canary:predict", json=body).json()["predictions"] == [
        [2.0, 2.0]
    ]


def test_predict_with_two_inputs_and_dict_outputs(http):
    rows = {"instances": [{"a": [1.0, 2.0], "b": [3]}, {"a": [0.0, 0.0], "b": [1]}]}
    predictions = http.post("/v1/models/pair:predict", json=rows).json()["predictions"]
    assert predictions == [
        {"score": [12.0], "logits": [6.0, 6.0, 6.0]},
        {"score": [2.0], "logits": [1.0, 1.0, 1.0]},
    ]
    columns = {"inputs": {"a": [[1.0, 2.0]], "b": [[3]]}}
    assert http.post("/v1/models/pair:predict", json=columns).json() == {
        "outputs": {"score": [[12.0]], "logits": [[6.0, 6.0, 6.0]]}
    }


def test_predict_decodes_b64_string_inputs(http):
    def b64(word: bytes) -> dict[str, str]:
        return {"b64": base64.b64encode(word).decode()}

    body = {"instances": [[b64(b"dog")], [b64(b"cat")], [b64(b"\xff-unknown")]]}
    assert http.post("/v1/models/words:predict", json=body).json() == {
        "predictions": [[2], [1], [0]]
    }
    assert http.post("/v1/models/words:predict", json={"inputs": [["dog"]]}).json() == {
        "outputs": [[2]]
    }


@pytest.mark.parametrize(
    ("content", "status", "fragment"),
    [
        (b'{"instances": [[1, 2, 3]', 400, "not valid JSON"),
        (b'["not an object"]', 400, "must be a JSON object"),
        (b'{"instances": [[1.0, 2.0]]}', 400, "has shape (1, 2), but the model takes (-1, 3)"),
        (b'{"instances": [["a", "b", "c"]]}', 400, "must hold float32 values"),
        (b'{"inputs": {"nope": [[1, 2, 3]]}}', 400, "missing ['features'], unknown ['nope']"),
        (b'{"instances": [], "inputs": []}', 400, "exactly one of 'instances'"),
        (b'{"instances": []}', 400, "non-empty list"),
        (b'{"signature_name": "other", "inputs": []}', 400, "'other' not found"),
        (b'{"instances": [[1, 2, 3], {"features": [1, 2, 3]}]}', 400, "mixes named objects"),
        (b'{"instances": [{"b64": "@@@"}]}', 400, "not valid base64"),
    ],
)
def test_bad_predict_requests_are_400_with_a_message(http, content, status, fragment):
    response = http.post("/v1/models/risk:predict", content=content)
    assert response.status_code == status
    assert fragment in response.json()["error"]


def test_values_the_model_itself_refuses_are_400_and_it_keeps_serving(http):
    response = http.post("/v1/models/embed:predict", json={"instances": [[7]]})
    assert response.status_code == 400
    assert "7 is not in [0, 5)" in response.json()["error"]
    ok = http.post("/v1/models/embed:predict", json={"instances": [[4]]})
    assert ok.status_code == 200
    assert len(ok.json()["predictions"][0][0]) == 2


def test_a_repository_load_serves_a_new_version_and_retires_the_old(tmp_path):
    save(constant_model(1.0), tmp_path / "m", 1)
    config = ServerConfig.from_flags(
        rest_api_port=free_port(), model_name="m", model_base_path=str(tmp_path / "m")
    )
    body = {"instances": [[0.0, 0.0, 0.0]]}
    with lc.ModelRegistry(name="repository") as registry, running(registry, config) as url:
        assert httpx.post(f"{url}/v1/models/m:predict", json=body).json() == {
            "predictions": [[1.0, 1.0]]
        }
        save(constant_model(5.0), tmp_path / "m", 2)
        assert httpx.post(f"{url}/v2/repository/models/m/load", json={}).status_code == 200
        assert httpx.post(f"{url}/v1/models/m:predict", json=body).json() == {
            "predictions": [[5.0, 5.0]]
        }
        wait_until(lambda: [s.version for s in registry.status("m")] == [2], "1 retired")
        one = httpx.get(f"{url}/v1/models/m/versions/1")
        assert one.status_code == 404


def polled(base: Path) -> ServerConfig:
    """A server of model ``m`` under ``base``, polled every 0.1 s."""
    return ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_name="m",
        model_base_path=str(base),
        file_system_poll_wait_seconds=0.1,
    )


def test_polling_serves_new_versions_skips_broken_ones_and_respects_unload(tmp_path, caplog):
    save(constant_model(1.0), tmp_path / "m", 1)
    config = polled(tmp_path / "m")
    with lc.ModelRegistry(name="polling") as registry, running(registry, config) as url:
        save(constant_model(5.0), tmp_path / "m", 2)
        wait_until(lambda: rest_answer(url) == {"predictions": [[5.0, 5.0]]}, "version 2 served")
        wait_until(lambda: [s.version for s in registry.status("m")] == [2], "1 retired")

        (tmp_path / "m" / "3").mkdir()
        with zipfile.ZipFile(tmp_path / "m" / "3" / "model.keras", "w") as archive:
            archive.writestr("config.json", "not a keras model")  # complete, but broken
        wait_until(lambda: "version 3 failed" in caplog.text, "the failed load logged")
        wait_for_scans(registry, "m")  # polls ran: the broken version is not retried
        assert caplog.text.count("'m' version 3 failed to load") == 1
        assert rest_answer(url) == {"predictions": [[5.0, 5.0]]}

        unload = httpx.post(f"{url}/v2/repository/models/m/unload", json={})
        assert unload.status_code == 200
        wait_until(lambda: not registry.status(), "m unloaded")
        # An explicit unload stays unloaded: no poll of m is left to load it again.
        with pytest.raises(lc.UnknownModelError, match="'m' is not watched"):
            registry.last_scan("m")
        assert httpx.get(f"{url}/v2/models/m/ready").status_code == 400
        # An explicit load tries the newest version again, and says why it fails.
        broken = httpx.post(f"{url}/v2/repository/models/m/load", json={})
        assert broken.status_code == 500
        assert "Loading 'm' version 3 failed" in broken.json()["error"]
        (tmp_path / "m" / "3" / "model.keras").unlink()
        assert httpx.post(f"{url}/v2/repository/models/m/load", json={}).status_code == 200
        assert rest_answer(url) == {"predictions": [[5.0, 5.0]]}


def test_savedmodel_versions_are_served_and_swapped_by_polling(tmp_path):
    """What TF Serving users deploy: ``model.export()`` directories, renamed into place."""

    def publish(value: float, version: int) -> None:
        aside = tmp_path / "m" / f".tmp-{version}"
        constant_model(value).export(str(aside), verbose=False)
        aside.rename(tmp_path / "m" / str(version))

    publish(1.0, 1)
    config = polled(tmp_path / "m")
    with lc.ModelRegistry(name="saved-models") as registry, running(registry, config) as url:
        assert rest_answer(url) == {"predictions": [[1.0, 1.0]]}
        metadata = httpx.get(f"{url}/v1/models/m/metadata", timeout=30).json()
        inputs = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert list(inputs["inputs"]) == ["features"]
        publish(4.0, 2)
        wait_until(lambda: rest_answer(url) == {"predictions": [[4.0, 4.0]]}, "version 2 served")
        wait_until(lambda: [s.version for s in registry.status("m")] == [2], "1 retired")


def test_bad_paths_and_verbs(http):
    classify = http.post("/v1/models/risk:classify", json={"examples": [{"x": 1.0}]})
    assert classify.status_code == 400
    assert "Expected classify signature method_name" in classify.json()["error"]
    explain = http.post("/v1/models/risk:explain", json={"instances": [[1, 2, 3]]})
    assert explain.status_code == 400
    assert "The verbs served are :predict, :classify and :regress" in explain.json()["error"]
    assert http.get("/v1/models/risk:predict").status_code == 400
    assert http.get("/v1/models/risk/versions/x").status_code == 400
    assert http.post("/v1/models/nope:predict", json={"instances": [1]}).status_code == 404


def test_a_body_over_the_limit_is_413(http):
    rows = [[1.0, 2.0, 3.0]] * (MAX_REQUEST_BYTES // 10)
    response = http.post("/v1/models/risk:predict", json={"instances": rows})
    assert response.status_code == 413
    assert f"at most {MAX_REQUEST_BYTES}" in response.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        yield b'{"instances": ['
        for _ in range(MAX_REQUEST_BYTES // 10):
            yield b"[1, 2, 3],"
        yield b"[1, 2, 3]]}"

    response = http.post("/v1/models/risk:predict", content=chunks())
    assert response.status_code == 413
    assert f"over {MAX_REQUEST_BYTES} bytes" in response.json()["error"]


def test_bad_requests_do_not_disturb_good_ones(http, server):
    errors: list[object] = []
    good = {"instances": [[1.0, 2.0, 3.0]]}
    bad = [b"{", b'{"instances": [[1]]}', b'{"instances": [["x", "y", "z"]]}']

    def client(n: int) -> None:
        with httpx.Client(base_url=server, timeout=30) as own:
            for i in range(15):
                if n % 2:
                    response = own.post("/v1/models/risk:predict", content=bad[i % 3])
                    ok = response.status_code == 400
                else:
                    response = own.post("/v1/models/risk:predict", json=good)
                    ok = response.json() == {"predictions": [[2.0, 2.0]]}
                if not ok:
                    errors.append((n, response.status_code, response.text))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert http.get("/v1/models/risk").json()["model_version_status"][0]["state"] == "AVAILABLE"


# -- KServe v2 with tritonclient ------------------------------------------------------


def test_v2_health_and_server_metadata(v2):
    assert v2.is_server_live()
    assert v2.is_server_ready()
    metadata = v2.get_server_metadata()
    assert metadata["name"] == "keras-lifecycle"
    assert "model_repository" in metadata["extensions"]


def test_v2_model_metadata_and_readiness(v2):
    metadata = v2.get_model_metadata("pair")
    assert metadata["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": [-1, 2]},
        {"name": "b", "datatype": "INT64", "shape": [-1, 1]},
    ]
    assert sorted(o["name"] for o in metadata["outputs"]) == ["logits", "score"]
    assert v2.get_model_metadata("risk", model_version="1")["versions"] == ["1", "2"]
    assert v2.is_model_ready("risk")
    assert v2.is_model_ready("risk", model_version="2")
    assert not v2.is_model_ready("risk", model_version="3")
    assert not v2.is_model_ready("nope")


def test_v2_infer(v2):
    a = triton.InferInput("a", [2, 2], "FP32")
    a.set_data_from_numpy(np.array([[1, 2], [0, 0]], "float32"), binary_data=False)
    b = triton.InferInput("b", [2, 1], "INT64")
    b.set_data_from_numpy(np.array([[3], [1]], "int64"), binary_data=False)
    result = v2.infer(
        "pair",
        [a, b],
        outputs=[triton.InferRequestedOutput("score", binary_data=False)],
        request_id="r-1",
    )
    np.testing.assert_allclose(result.as_numpy("score"), [[12.0], [2.0]])
    assert result.as_numpy("logits") is None
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == (
        "pair",
        "4",
        "r-1",
    )
    x = triton.InferInput("features", [1, 3], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3), "float32"), binary_data=False)
    pinned = v2.infer("risk", [x], model_version="1")
    np.testing.assert_allclose(pinned.as_numpy("output_0"), [[1.0, 1.0]])


@pytest.mark.parametrize(
    ("inputs", "model", "fragment"),
    [
        ([("features", [1, 3], "INT64")], "risk", "datatype 'INT64'; the model takes 'FP32'"),
        ([("features", [1, 2], "FP32")], "risk", "has shape (1, 2)"),
        ([("other", [1, 3], "FP32")], "risk", "no input named 'other'"),
    ],
)
def test_v2_bad_infer_is_400_with_a_message(v2, inputs, model, fragment):
    request = []
    for name, shape, datatype in inputs:
        item = triton.InferInput(name, shape, datatype)
        dtype = "int64" if datatype == "INT64" else "float32"
        item.set_data_from_numpy(np.zeros(shape, dtype), binary_data=False)
        request.append(item)
    with pytest.raises(InferenceServerException, match=r"\[400\]") as caught:
        v2.infer(model, request)
    assert fragment in caught.value.message()


def test_v2_unknown_model_and_binary_data(v2, http):
    x = triton.InferInput("features", [1, 3], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3), "float32"), binary_data=False)
    with pytest.raises(InferenceServerException, match=r"\[404\]"):
        v2.infer("nope", [x])
    binary = triton.InferInput("features", [1, 3], "FP32")
    binary.set_data_from_numpy(np.zeros((1, 3), "float32"))  # binary_data=True by default
    answer = v2.infer("risk", [binary])  # and binary outputs asked for by default
    np.testing.assert_allclose(answer.as_numpy("output_0"), [[2.0, 2.0]])
    assert answer.get_output("output_0")["parameters"] == {"binary_data_size": 8}
    flat = {"inputs": [{"name": "features", "shape": [1, 3], "datatype": "FP32", "data": [1, 2]}]}
    response = http.post("/v2/models/risk/infer", json=flat)
    assert response.status_code == 400
    assert "has 2 values, but its shape [1, 3] holds 3" in response.json()["error"]


def test_v2_repository_index_unload_and_load(v2, server):
    index = {(m["name"], m["version"]): m["state"] for m in v2.get_model_repository_index()}
    assert index == {
        ("risk", "1"): "READY",
        ("risk", "2"): "READY",
        ("pair", "4"): "READY",
        ("words", "1"): "READY",
        ("embed", "1"): "READY",
    }
    ready_only = httpx.post(f"{server}/v2/repository/index", json={"ready": True})
    assert len(ready_only.json()) == 5
    too_big = httpx.post(f"{server}/v2/repository/index", content=b" " * (MAX_REQUEST_BYTES + 1))
    assert too_big.status_code == 413
    v2.unload_model("words")
    wait_until(lambda: not v2.is_model_ready("words"), "words unloaded")
    v2.load_model("words")
    assert v2.is_model_ready("words")
    with pytest.raises(InferenceServerException, match="not in the server's configuration"):
        v2.load_model("nope")
    v2.unload_model("risk")  # labelled: the labels go with its versions
    wait_until(lambda: not v2.is_model_ready("risk"), "risk unloaded")
    v2.load_model("risk")  # the configured labels come back
    assert v2.is_model_ready("risk", model_version="1")
    canary = httpx.get(f"{server}/v1/models/risk/labels/canary").json()
    assert canary["model_version_status"][0]["version"] == "2"


# -- metrics ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/monitoring/prometheus/metrics", "/metrics"])
def test_prometheus_metrics_report_the_served_versions(http, path):
    """At TensorFlow Serving's path, and at the one Prometheus scrapes by default."""
    http.post("/v1/models/risk/versions/1:predict", json={"instances": [[0, 0, 0]]})
    scraped = http.get(path)
    assert scraped.headers["content-type"].startswith("text/plain")
    text = scraped.text
    assert 'lifecycle_version_bytes{model="risk",registry="test-server",version="1"}' in text
    assert "lifecycle_live_models" in text


# -- configuration ----------------------------------------------------------------------


def test_config_defaults_to_loopback_and_tensorflow_serving_ports(models_root):
    config = ServerConfig.from_flags(model_base_path=str(models_root / "risk"))
    assert (config.host, config.rest_api_port) == ("127.0.0.1", 8501)
    assert config.models == (ServedModel("default", str(models_root / "risk")),)
    assert config.freeze_heap and config.loader_gil_share < 1


def test_config_file_policies_and_labels(models_root):
    config = ServerConfig.from_flags(model_config_file=str(models_root / "models.config"))
    risk, pair, *_ = config.models
    assert risk.policy == lc.VersionPolicy.specific([1, 2])
    assert risk.labels == {"stable": 1, "canary": 2}
    assert pair.policy == lc.VersionPolicy.latest()


@pytest.mark.parametrize(
    ("flags", "error", "fragment"),
    [
        ({"rest_api_port": 70000}, ValueError, "--rest_api_port must be a port number"),
        ({"max_request_bytes": 0}, ValueError, "--max_request_bytes must be an integer >= 1"),
        ({"memory_budget": -1}, ValueError, "--memory_budget must be an integer >= 1"),
        (
            {"file_system_poll_wait_seconds": -1},
            ValueError,
            "--file_system_poll_wait_seconds must be a number >= 0",
        ),
        ({"model_name": "risk"}, ValueError, "--model_name needs --model_base_path"),
        ({"model_base_path": "/no/such/dir"}, FileNotFoundError, "--model_base_path"),
        ({"model_config_file": "/no/such.config"}, FileNotFoundError, "--model_config_file"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(flags, error, fragment):
    with pytest.raises(error, match=fragment):
        ServerConfig.from_flags(**flags)


def test_the_checks_without_tensorflow_take_the_flags_of_from_flags():
    """``lifecycle serve`` runs them first, with the same flags (lifecycle/server/_flags.py)."""

    def defaults(function: Any) -> dict[str, Any]:
        parameters = inspect.signature(function).parameters.values()
        return {p.name: getattr(p.default, "value", p.default) for p in parameters}  # enums

    assert defaults(_flags.Flags) == defaults(ServerConfig.from_flags)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("model_config_list { config { name: ", "does not parse"),
        ('model_config_list { config { name: "m" } }', "needs a name and a base_path"),
        (
            'model_config_list { config { name: "m" base_path: "%s" model_platform: "onnx" } }',
            "model_platform 'onnx' is not served",
        ),
        (
            'model_config_list { config { name: "m" base_path: "%s" '
            'version_labels { key: "bad-label" value: 1 } } }',
            "must match [a-zA-Z0-9_]+",
        ),
    ],
)
def test_bad_model_config_files(tmp_path, text, fragment):
    path = tmp_path / "models.config"
    path.write_text(text.replace("%s", str(tmp_path)))
    with pytest.raises(ValueError, match="--model_config_file") as caught:
        ServerConfig.from_flags(model_config_file=str(path))
    assert fragment in str(caught.value)


# -- the command ------------------------------------------------------------------------


def grpc_predict(port: int) -> tuple[list, int]:
    """Predict on ``risk`` with tensorflow-serving-api's stub: outputs and the version."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "risk"
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(np.zeros((1, 3), "float32")))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout=30)
    return tf.make_ndarray(response.outputs["output_0"]).tolist(), response.model_spec.version.value


@pytest.mark.subprocess
def test_lifecycle_serve_answers_then_exits_0_on_sigterm(models_root, tmp_path):
    port, grpc_port = free_port(), free_port()
    flags = ["--rest_api_port", str(port), "--port", str(grpc_port), "--model_name", "risk"]
    flags += ["--model_base_path", str(models_root / "risk"), "--drain_seconds", "5"]
    # TensorFlow Serving's batching and thread flags, as a deployment passes them.
    (tmp_path / "batching.config").write_text("max_batch_size { value: 8 }\n")
    flags += ["--enable_batching", "--batching_parameters_file", str(tmp_path / "batching.config")]
    flags += ["--tensorflow_intra_op_parallelism", "1"]
    with lifecycle_serve(*flags) as process:
        body = {"instances": [[0.0, 0.0, 0.0]]}
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/models/risk:predict", json=body, timeout=30
        )
        assert answer.json() == {"predictions": [[3.0, 3.0]]}  # the latest version, 3
        assert grpc_predict(grpc_port) == ([[3.0, 3.0]], 3)  # the same service over gRPC
        status = httpx.get(f"http://127.0.0.1:{port}/v1/admin/models/risk", timeout=30).json()
        assert status["versions"][0]["batching"]["requests"] == 2  # both went through batching
        output = stop(process)
    assert "Shutting down" in output
    assert f"gRPC running on 127.0.0.1:{grpc_port}" in output
    assert "Registry closed: 1 version(s) drained and disposed." in output
    assert "POST /v1/models" not in output  # no line per request, as in TensorFlow Serving


@pytest.mark.subprocess
@pytest.mark.slow  # the fast lane keeps a lifecycle serve child
def test_lifecycle_serve_that_cannot_load_its_models_says_so_in_one_line(tmp_path):
    """A model the server cannot serve is one line and exit 1, not uvicorn's traceback."""
    (tmp_path / "empty").mkdir()
    variables = tmp_path / "broken" / "1" / "variables"  # a SavedModel's files, garbled
    variables.mkdir(parents=True)
    (variables / "variables.index").write_bytes(b"not an index")
    (variables.parent / "saved_model.pb").write_bytes(b"not a SavedModel")
    expected = {
        "empty": "Start-up failed: Model 'default': no version directory under",
        "broken": "Start-up failed: Loading 'default' version 1 failed",
    }
    started = {}  # both at once: each child spends seconds importing TensorFlow
    for base in expected:
        flags = ["--model_base_path", str(tmp_path / base), "--rest_api_port", str(free_port())]
        started[base] = subprocess.Popen(
            [*SERVE, *flags, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for base, process in started.items():
        try:
            stdout, stderr = process.communicate(timeout=120)
        finally:
            process.kill()  # a no-op once it exited
        assert process.returncode == 1, stderr
        assert expected[base] in stderr
        assert "Traceback" not in stderr + stdout


@pytest.mark.subprocess
@pytest.mark.slow  # the fast lane keeps a lifecycle serve child
def test_thread_counts_are_set_before_tensorflow_runs_and_refused_after(run_child):
    out = run_child(
        """
        import tensorflow as tf
        from lifecycle.server import ServerConfig
        from lifecycle.server._app import set_parallelism

        set_parallelism(ServerConfig(intra_op_parallelism=1, inter_op_parallelism=2))
        threads = tf.config.threading
        print("counts:", threads.get_intra_op_parallelism_threads(),
              threads.get_inter_op_parallelism_threads())
        print("sum:", float(tf.constant(1.0) + 1.0))  # TensorFlow runs: counts fixed
        set_parallelism(ServerConfig(intra_op_parallelism=1))  # the same: nothing to do
        try:
            set_parallelism(ServerConfig(intra_op_parallelism=3))
        except RuntimeError as error:
            print("refused:", error)
        """
    )
    assert "counts: 1 2" in out and "sum: 2.0" in out
    assert "refused: --tensorflow_intra_op_parallelism 3 cannot take effect: this process " in out
    assert "with 1 threads" in out


def test_uvicorn_runs_the_c_http_parser_and_event_loop_of_the_serve_extra():
    from lifecycle.server._app import uvicorn_config

    async def app(scope: Any, receive: Any, send: Any) -> None:  # any ASGI app
        raise AssertionError("not called")

    config = uvicorn_config(app, ServerConfig(access_log=True))
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
    assert (config.host, config.lifespan, config.access_log) == ("127.0.0.1", "on", True)
    loop = config.get_loop_factory()()
    try:
        assert type(loop).__module__.startswith("uvloop"), type(loop)
    finally:
        loop.close()


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_library_does_not_import_the_server_and_a_missing_extra_names_the_install(
    run_child,
):
    out = run_child(
        """
        import sys
        import lifecycle
        print("server imported:", [m for m in ("lifecycle.server", "starlette", "uvicorn")
                                    if m in sys.modules])
        sys.modules["uvicorn"] = None  # as if the serve extra were not installed
        try:
            import lifecycle.server
        except ImportError as error:
            print("error:", error)
        """
    )
    assert "server imported: []" in out
    assert "error: lifecycle.server needs the serve extra (uvicorn is missing): " in out
    assert 'pip install "keras-lifecycle[serve]"' in out


# A ~280 MiB SavedModel (a 8192 -> 8960 Dense layer), exported by a child process so
# that the test process does not hold its weights.
BIG_MODEL_CHILD = """
import sys, keras
inputs = keras.Input((8192,), name="features")
keras.Model(inputs, keras.layers.Dense(8960)(inputs)).export(sys.argv[1], verbose=False)
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_lifecycle_serve_gives_an_unloaded_models_memory_back_by_default(tmp_path):
    import psutil

    path = tmp_path / "repository" / "big" / "1"
    subprocess.run(
        [sys.executable, "-c", BIG_MODEL_CHILD, str(path)],
        check=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    port = free_port()
    flags = ["--rest_api_port", str(port), "--port", "0"]
    flags += ["--model_repository", str(tmp_path / "repository")]
    flags += ["--model_control_mode", "explicit"]  # nothing loaded at start
    url = f"http://127.0.0.1:{port}"
    # No allocator variables: what a deployment gets without asking.
    clean = {k: v for k, v in os.environ.items() if "ALLOCATOR" not in k and "ONEDNN" not in k}
    with mock.patch.dict(os.environ, clean, clear=True), lifecycle_serve(*flags) as process:
        server = psutil.Process(process.pid)
        idle = server.memory_info().rss
        body = {"inputs": [{"name": "features", "shape": [1, 8192], "datatype": "FP32",
                            "data": [0.0] * 8192}]}  # fmt: skip
        after_unloads = []
        for _ in range(2):
            load = httpx.post(f"{url}/v2/repository/models/big/load", json={}, timeout=120)
            assert load.is_success, load.text
            assert httpx.post(f"{url}/v2/models/big/infer", json=body, timeout=60).is_success
            loaded = server.memory_info().rss
            added = loaded - idle if not after_unloads else loaded - after_unloads[-1]
            assert added > 250 * 2**20, f"loading added only {added / 2**20:.0f} MiB"
            unload = httpx.post(f"{url}/v2/repository/models/big/unload", json={}, timeout=120)
            assert unload.is_success, unload.text
            # Measured here: 96 % of what loading added came back within a second (the
            # model and the copy its restored functions keep, freed by a collection).
            wait_until(
                lambda: loaded - server.memory_info().rss >= 0.7 * added,  # noqa: B023 (called at once)
                f"70 % of the {added / 2**20:.0f} MiB loading added came back",
                timeout=30,
            )
            after_unloads.append(server.memory_info().rss)
        # Unloaded versions do not pile up (they did by a copy of the model per cycle).
        # Each reading above is taken once 70 % came back, and the rest follows: two
        # such instants differed by 22-132 MiB, so wait for the second to settle.
        wait_until(
            lambda: server.memory_info().rss - after_unloads[0] < 50 * 2**20,
            "RSS after the second unload within 50 MiB of that after the first",
            timeout=30,
        )
        stop(process)
