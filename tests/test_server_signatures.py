"""Every signature of a SavedModel, served as TensorFlow Serving serves them.

One SavedModel with four signatures: ``serving_default`` (two inputs, two
outputs), ``double`` (a predict signature over a variable of its own),
``classify`` and ``regress`` (``tf.Example`` inputs, the methods TensorFlow
Serving's ``:classify`` and ``:regress`` answer). Spoken to over REST with plain
HTTP in TensorFlow Serving's shapes, and over gRPC with tensorflow-serving-api's
stubs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.servers import free_port, running
from tensorflow.core.example import example_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

import lifecycle as lc
from lifecycle.server import ModelService, ServerConfig, build_grpc_server

TIMEOUT = 30
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
PREDICT = "tensorflow/serving/predict"


class Scorer(tf.Module):
    """sum = a0 + a1 + b, product = (a0 + a1) * b; double: x * factor (2);
    classify: scores [1 - p, p] with p = f / 10, classes ["neg", "pos"];
    regress: outputs = 3 * f."""

    def __init__(self) -> None:
        super().__init__()
        self.factor = tf.Variable(2.0)  # used by `double` only

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 2], tf.float32, name="a"),
            tf.TensorSpec([None, 1], tf.float32, name="b"),
        ]
    )
    def serve(self, a: tf.Tensor, b: tf.Tensor) -> dict[str, tf.Tensor]:
        total = tf.reduce_sum(a, axis=1, keepdims=True)
        return {"sum": total + b, "product": total * b}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def double(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": x * self.factor}

    @staticmethod
    def _feature(serialized: tf.Tensor) -> tf.Tensor:
        spec = {"f": tf.io.FixedLenFeature([1], tf.float32)}
        return tf.io.parse_example(serialized, spec)["f"]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        p = self._feature(inputs) / 10.0
        rows = tf.shape(inputs)[0]
        return {
            "classes": tf.tile(tf.constant([["neg", "pos"]]), [rows, 1]),
            "scores": tf.concat([1.0 - p, p], axis=1),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"outputs": 3.0 * self._feature(inputs)}


def export(path: Path) -> None:
    """Save the SavedModel, then give two signatures the methods of classify and regress.

    ``tf.saved_model.save`` writes every signature as a predict one; TensorFlow 1's
    builders, and exporters such as TFX's, write the other two methods.
    """
    scorer = Scorer()
    tf.saved_model.save(
        scorer,
        str(path),
        signatures={
            "serving_default": scorer.serve,
            "double": scorer.double,
            "classify": scorer.classify,
            "regress": scorer.regress,
        },
    )
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    definitions = saved.meta_graphs[0].signature_def
    definitions["classify"].method_name = CLASSIFY
    definitions["regress"].method_name = REGRESS
    (path / "saved_model.pb").write_bytes(saved.SerializeToString())


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("signatures")
    export(root / "scorer" / "1")
    return root / "scorer"


@pytest.fixture(scope="module")
def served(base: Path) -> Iterator[tuple[httpx.Client, grpc.Channel]]:
    config = ServerConfig.from_flags(
        rest_api_port=free_port(), port=free_port(), model_name="scorer", model_base_path=str(base)
    )
    with lc.ModelRegistry(name="signatures") as registry:
        service = ModelService(registry, config)
        with running(registry, config) as url:
            server = build_grpc_server(service, config)
            server.start()
            try:
                with (
                    httpx.Client(base_url=url, timeout=TIMEOUT) as client,
                    grpc.insecure_channel(f"127.0.0.1:{config.grpc_port}") as channel,
                ):
                    yield client, channel
            finally:
                server.stop(5).wait(30)


@pytest.fixture
def http(served: tuple[httpx.Client, grpc.Channel]) -> httpx.Client:
    return served[0]


@pytest.fixture
def stub(
    served: tuple[httpx.Client, grpc.Channel],
) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(served[1])


# -- REST --------------------------------------------------------------------------------


def test_metadata_lists_every_signature_with_its_method(http):
    definitions = http.get("/v1/models/scorer/metadata").json()["metadata"]["signature_def"]
    methods = {
        name: definition["method_name"] for name, definition in definitions["signature_def"].items()
    }
    assert methods == {
        "serving_default": PREDICT,
        "double": PREDICT,
        "classify": CLASSIFY,
        "regress": REGRESS,
    }
    assert sorted(definitions["signature_def"]["serving_default"]["inputs"]) == ["a", "b"]
    assert sorted(definitions["signature_def"]["serving_default"]["outputs"]) == [
        "product",
        "sum",
    ]
    assert list(definitions["signature_def"]["double"]["inputs"]) == ["x"]


def test_predict_any_signature_in_row_and_columnar_form(http):
    rows = {"instances": [{"a": [1.0, 2.0], "b": [3.0]}, {"a": [0.0, 1.0], "b": [2.0]}]}
    answer = http.post("/v1/models/scorer:predict", json=rows).json()
    assert answer == {
        "predictions": [{"sum": [6.0], "product": [9.0]}, {"sum": [3.0], "product": [2.0]}]
    }
    columns = {"inputs": {"a": [[1.0, 2.0]], "b": [[3.0]]}}
    answer = http.post("/v1/models/scorer:predict", json=columns).json()
    assert answer == {"outputs": {"sum": [[6.0]], "product": [[9.0]]}}
    double = {"signature_name": "double", "instances": [[1.0, 2.0, 3.0]]}
    answer = http.post("/v1/models/scorer/versions/1:predict", json=double).json()
    assert answer == {"predictions": [[2.0, 4.0, 6.0]]}
    double = {"signature_name": "double", "inputs": {"x": [[1.0, 1.0, 1.0]]}}
    assert http.post("/v1/models/scorer:predict", json=double).json() == {
        "outputs": [[2.0, 2.0, 2.0]]
    }


def test_classify_and_regress_take_examples_and_a_context(http):
    body = {"signature_name": "classify", "examples": [{"f": 2.0}, {"f": 5.0}]}
    answer = http.post("/v1/models/scorer:classify", json=body)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert [[label for label, _ in row] for row in result] == [["neg", "pos"], ["neg", "pos"]]
    np.testing.assert_allclose([[s for _, s in row] for row in result], [[0.8, 0.2], [0.5, 0.5]])
    body = {"signature_name": "regress", "context": {"f": 1.0}, "examples": [{}, {"f": 2.0}]}
    answer = http.post("/v1/models/scorer:regress", json=body)
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["result"], [3.0, 6.0])  # an example's own wins


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        (":predict", {"signature_name": "nope", "instances": [[1.0]]}, "'nope' not found in"),
        (":classify", {"examples": [{"f": 1.0}]}, "Expected classify signature method_name"),
        (
            ":regress",
            {"signature_name": "classify", "examples": [{"f": 1.0}]},
            "Expected regress signature method_name",
        ),
        (":classify", {"signature_name": "classify"}, "must be an object with 'examples'"),
        (":classify", {"signature_name": "classify", "examples": [{"f": True}]}, "no booleans"),
        (":regress", {"signature_name": "regress", "examples": [{"f": [1, "a"]}]}, "mixes"),
        # An integer is an int64 feature (as in TensorFlow Serving): the model's own words.
        (":regress", {"signature_name": "regress", "examples": [{"f": 5}]}, "Data types don't"),
        (":explain", {"instances": [[1.0]]}, ":predict, :classify and :regress"),
    ],
)
def test_bad_signature_requests_are_400_with_a_message(http, path, body, fragment):
    response = http.post(f"/v1/models/scorer{path}", json=body)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]


# -- gRPC --------------------------------------------------------------------------------


def spec_of(request, signature: str = "") -> None:
    request.model_spec.name = "scorer"
    request.model_spec.signature_name = signature


def test_grpc_predict_and_metadata_of_every_signature(stub):
    request = predict_pb2.PredictRequest()
    spec_of(request, "double")
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones((1, 3), "float32")))
    response = stub.Predict(request, timeout=TIMEOUT)
    assert tf.make_ndarray(response.outputs["y"]).tolist() == [[2.0, 2.0, 2.0]]
    assert response.model_spec.signature_name == "double"
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    spec_of(metadata)
    answer = stub.GetModelMetadata(metadata, timeout=TIMEOUT)
    definitions = get_model_metadata_pb2.SignatureDefMap()
    answer.metadata["signature_def"].Unpack(definitions)
    assert {k: v.method_name for k, v in definitions.signature_def.items()} == {
        "serving_default": PREDICT,
        "double": PREDICT,
        "classify": CLASSIFY,
        "regress": REGRESS,
    }
    request.model_spec.signature_name = "missing"
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(request, timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'missing' not found in signature def" in caught.value.details()


def example(**features: float) -> example_pb2.Example:
    result = example_pb2.Example()
    for name, value in features.items():
        result.features.feature[name].float_list.value.append(value)
    return result


def test_grpc_classify_and_regress(stub):
    request = classification_pb2.ClassificationRequest()
    spec_of(request, "classify")
    request.input.example_list.examples.extend([example(f=1.0), example(f=9.0)])
    response = stub.Classify(request, timeout=TIMEOUT)
    rows = [
        [(c.label, round(c.score, 5)) for c in r.classes] for r in response.result.classifications
    ]
    assert rows == [[("neg", 0.9), ("pos", 0.1)], [("neg", 0.1), ("pos", 0.9)]]
    assert (response.model_spec.version.value, response.model_spec.signature_name) == (
        1,
        "classify",
    )

    request = regression_pb2.RegressionRequest()
    spec_of(request, "regress")
    listed = request.input.example_list_with_context
    listed.context.CopyFrom(example(f=2.0))
    listed.examples.extend([example_pb2.Example(), example(f=4.0)])
    response = stub.Regress(request, timeout=TIMEOUT)
    assert [r.value for r in response.result.regressions] == [6.0, 12.0]

    wrong = regression_pb2.RegressionRequest()
    spec_of(wrong)  # serving_default: a predict signature
    wrong.input.example_list.examples.append(example(f=1.0))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Regress(wrong, timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "Expected regress signature method_name" in caught.value.details()


# -- memory -----------------------------------------------------------------------------


def test_a_variable_only_another_signature_uses_is_released_with_the_version(base):
    with lc.ModelRegistry(name="signature-release") as registry:
        registry.load("scorer", 1, str(base / "1"))
        with registry.serving("scorer") as lease:
            assert list(lease.signatures) == ["serving_default", "double", "classify", "regress"]
            assert lease.infer({"x": np.ones((1, 3), "float32")}, "double").outputs[
                "y"
            ].tolist() == [[2.0, 2.0, 2.0]]
        with registry.lease("scorer") as model:
            layer = next(lay for lay in model.layers if hasattr(lay, "reloaded"))
            factor = layer.reloaded.factor
        registry.unload("scorer", 1, wait=True)
    assert tuple(factor.value().shape) == (0,)  # released, not only dropped
