"""ModelRegistry.signature() and infer(): named inputs and outputs of a version."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from support.models import constant_model

import lifecycle as lc


def two_inputs_dict_outputs():
    a = keras.Input((2,), name="a")
    b = keras.Input((1,), name="b", dtype="int64")
    joined = keras.layers.Concatenate()([a, keras.ops.cast(b, "float32")])
    ones = keras.initializers.Ones()
    return keras.Model(
        [a, b],
        {
            "score": keras.layers.Dense(1, kernel_initializer=ones)(joined),
            "logits": keras.layers.Dense(3, kernel_initializer=ones)(joined),
        },
    )


def two_outputs():
    x = keras.Input((2,))
    return keras.Model(x, [keras.layers.Dense(1)(x), keras.layers.Dense(4)(x)])


def test_signature_names_inputs_by_keras_input_and_a_single_output_output_0(registry):
    registry.load("risk", 1, lambda: constant_model(1.0))
    signature = registry.signature("risk")
    assert signature == lc.ServingSignature(
        inputs=(lc.NamedTensorSpec("features", "float32", (None, 3)),),
        outputs=(lc.NamedTensorSpec("output_0", "float32", (None, 2)),),
    )


def test_signature_of_dict_outputs_uses_their_keys_and_list_outputs_are_numbered(registry):
    registry.load("multi", 1, two_inputs_dict_outputs)
    registry.load("pair", 1, two_outputs)
    multi = registry.signature("multi")
    assert [(s.name, s.dtype, s.shape) for s in multi.inputs] == [
        ("a", "float32", (None, 2)),
        ("b", "int64", (None, 1)),
    ]
    assert sorted(s.name for s in multi.outputs) == ["logits", "score"]
    pair = registry.signature("pair")
    assert [(s.name, s.shape) for s in pair.outputs] == [
        ("output_0", (None, 1)),
        ("output_1", (None, 4)),
    ]


def test_signature_follows_version_and_label_and_is_frozen(registry):
    registry.load("risk", 1, lambda: constant_model(1.0))
    registry.load("risk", 2, two_outputs, labels=["canary"])
    assert registry.signature("risk").inputs[0].name == "features"
    assert registry.signature("risk", version=2).outputs[1].name == "output_1"
    assert registry.signature("risk", label="canary").inputs[0].shape == (None, 2)
    with pytest.raises(AttributeError):
        registry.signature("risk").inputs = ()  # type: ignore[misc]


def test_signature_of_unknown_model_version_or_label(registry):
    registry.load("risk", 1, lambda: constant_model(1.0))
    with pytest.raises(lc.UnknownModelError, match="No model named 'nope'"):
        registry.signature("nope")
    with pytest.raises(lc.UnknownModelError, match="no version 9"):
        registry.signature("risk", version=9)
    with pytest.raises(lc.UnknownModelError, match="no label 'stable'"):
        registry.signature("risk", label="stable")


def test_signature_read_does_not_count_as_a_request(registry):
    registry.load("risk", 1, lambda: constant_model(1.0))
    registry.signature("risk")
    assert registry.status("risk")[0].requests == 0


def test_infer_runs_named_inputs_and_returns_named_numpy_outputs(registry):
    registry.load("risk", 1, lambda: constant_model(0.5))
    registry.load("risk", 2, lambda: constant_model(2.0))
    result = registry.infer("risk", {"features": [[1, 2, 3], [4, 5, 6]]}, version=2)
    assert isinstance(result, lc.Inference)
    assert (result.name, result.version) == ("risk", 2)
    np.testing.assert_allclose(result.outputs["output_0"], np.full((2, 2), 2.0))
    assert registry.infer("risk", {"features": np.zeros((1, 3))}).version == 1
    assert registry.status("risk")[1].requests == 1


def test_infer_with_two_inputs_and_dict_outputs(registry):
    registry.load("multi", 1, two_inputs_dict_outputs)
    result = registry.infer("multi", {"b": [[3]], "a": [[1.0, 2.0]]})
    np.testing.assert_allclose(result.outputs["score"], [[6.0]])
    np.testing.assert_allclose(result.outputs["logits"], [[6.0, 6.0, 6.0]])


def test_infer_refuses_bad_inputs_with_messages_and_keeps_serving(registry):
    registry.load("multi", 1, two_inputs_dict_outputs)
    with pytest.raises(ValueError, match=r"missing \['b'\], unknown \['c'\]"):
        registry.infer("multi", {"a": [[1.0, 2.0]], "c": [[1]]})
    with pytest.raises(ValueError, match=r"Input 'a' has shape \(1, 3\).*\(-1, 2\)"):
        registry.infer("multi", {"a": [[1.0, 2.0, 3.0]], "b": [[1]]})
    with pytest.raises(TypeError, match="Input 'b' must hold int64 values"):
        registry.infer("multi", {"a": [[1.0, 2.0]], "b": [[1.5]]})
    with pytest.raises(TypeError, match="Input 'a' must hold float32 values"):
        registry.infer("multi", {"a": [["x", "y"]], "b": [[1]]})
    with pytest.raises(TypeError, match="must be a mapping"):
        registry.infer("multi", [[1.0, 2.0]])  # type: ignore[arg-type]
    assert registry.status("multi")[0].leases == 0
    assert registry.infer("multi", {"a": [[0.0, 0.0]], "b": [[1]]}).outputs["score"].shape == (
        1,
        1,
    )


def test_signature_of_a_keras_file(registry, tmp_path):
    path = tmp_path / "model.keras"
    constant_model(1.0).save(path)
    registry.load("file", 1, path)
    assert registry.signature("file").inputs[0].name == "features"
    assert registry.infer("file", {"features": [[0, 0, 0]]}).outputs["output_0"].shape == (1, 2)


def test_check_names_and_check_shape_refuse_what_infer_refuses_before_any_value():
    spec = lc.NamedTensorSpec("a", "float32", (None, 2))
    signature = lc.ServingSignature(
        inputs=(spec, lc.NamedTensorSpec("b", "int64", (None,))), outputs=()
    )
    signature.check_names({"b": None, "a": None})
    with pytest.raises(
        ValueError, match=r"inputs \['a', 'c'\] .* missing \['b'\], unknown \['c'\]\."
    ):
        signature.check_names(["a", "c"])
    # A request may send any number of names, of any length: the message shows a few, cut short.
    many = [f"x{i:03d}" + "y" * 200 for i in range(1000)]
    with pytest.raises(
        ValueError, match=r"missing \['a', 'b'\], unknown \['x000y+\.\.\.y+', "
    ) as caught:
        signature.check_names(many)
    assert len(str(caught.value)) < 500
    spec.check_shape((7, 2))
    spec.check_shape([0, 2])
    with pytest.raises(
        ValueError, match=r"Input 'a' has shape \(1, 3\), but the model takes \(-1, 2\)"
    ):
        spec.check_shape([1, 3])
    with pytest.raises(ValueError, match=r"has shape \(2,\), but the model takes \(-1, 2\)"):
        spec.check_shape((2,))
    with pytest.raises(ValueError, match=r"Input 'request_key' has shape \(2,\)"):
        spec.check_shape((2,), name="request_key")
