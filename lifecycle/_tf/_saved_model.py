"""A SavedModel's serving signature as a Keras functional model.

``keras.layers.TFSMLayer`` wraps a SavedModel as a layer, but calls its
endpoint with one positional argument, while a signature (``serving_default``)
takes its inputs as keyword arguments only. :class:`SignatureLayer` calls the
signature with the inputs dict as keywords. The layer tracks the SavedModel's
restored variables as Keras variables around the very same ``tf.Variable``
objects, so a managed model finds and releases them like any other weights.
The internals read here are the signature function ``TFSMLayer`` keeps in
``call_endpoint_fn``, and the gradient-registry entries ``tf.saved_model.load``
adds for a SavedModel's custom gradients (checked by :func:`self_check`).

Those entries (``CustomGradient-N``, one per custom gradient, new names at every
load) hold the restored gradient functions and are never unregistered by
TensorFlow. They match none of the model's handles, so the purge of a dispose
cannot find them: the layer that loaded them deletes them when it is collected,
when nothing can differentiate through it any more.
"""

from __future__ import annotations

import gc
import os
import tempfile
import weakref
from collections.abc import Iterable
from typing import Any

import attrs
import keras
import numpy as np
import tensorflow as tf

from ._internal import incompatible, internal
from ._purge import purge_gradient_registry, registry

# The registry entries `tf.saved_model.load` adds for restored custom gradients are
# closures of this function (tensorflow/python/saved_model/function_deserialization.py).
_RESTORED_GRADIENT = "_gen_gradient_func.<locals>.gradient_func"

__all__ = [
    "CLASSIFY_METHOD",
    "PREDICT_METHOD",
    "REGRESS_METHOD",
    "SERVING_SIGNATURE",
    "SavedSignature",
    "SignatureLayer",
    "method_names",
    "saved_model_to_keras",
    "saved_signatures",
    "self_check",
]

# The signature TensorFlow Serving answers when a request names none.
SERVING_SIGNATURE = "serving_default"


#: The method name of a signature that TensorFlow Serving answers with ``:predict``
#: (``:classify`` and ``:regress`` answer the other two).
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"


@attrs.frozen
class SavedSignature:
    """One signature of a SavedModel: its function, and the method TensorFlow Serving gives it.

    Attributes:
        name: The signature's key (``serving_default``, ``classify``...).
        function: The signature's concrete function; it takes its inputs as
            keyword tensors and returns a dict of output tensors.
        method_name: ``tensorflow/serving/predict``, ``.../classify`` or
            ``.../regress``, from ``saved_model.pb``.
    """

    name: str
    function: Any = attrs.field(repr=False)
    method_name: str = PREDICT_METHOD


class SignatureLayer(keras.layers.TFSMLayer):
    """A ``TFSMLayer`` that calls a SavedModel signature with a dict of named inputs.

    It tracks the variables of *every* signature of its SavedModel, not only of
    the one it calls, so that a dispose releases what the other signatures use
    too. It also owns the gradient-registry entries its SavedModel's load
    added, and deletes them when it is collected.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        before = set(registry())
        super().__init__(*args, **kwargs)
        self.restored_gradients = restored_gradients(before)
        if self.restored_gradients:
            weakref.finalize(self, unregister, self.restored_gradients)

    def _build_at_init(self) -> None:
        # TFSMLayer tracks the variables of the endpoint it calls, then builds
        # (after which a layer takes no new state): the other signatures'
        # variables are added just before.
        tracked = {id(internal(w, "_value", "keras.Variable._value")) for w in self.weights}
        for function in self.reloaded.signatures.values():
            for variable in function.variables:
                if id(variable) not in tracked:
                    tracked.add(id(variable))
                    self._add_existing_weight(variable)
        super()._build_at_init()

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        """Run the signature on ``inputs``, keyed by the signature's input names."""
        del training  # a serving signature has one behaviour
        return self.signature(**inputs)

    @property
    def signature(self) -> Any:
        """The signature's concrete function, as ``TFSMLayer`` loaded it."""
        return internal(self, "call_endpoint_fn", "TFSMLayer.call_endpoint_fn")

    @property
    def reloaded(self) -> Any:
        """The object ``tf.saved_model.load`` returned, with every signature."""
        return internal(self, "_reloaded_obj", "TFSMLayer._reloaded_obj")


def saved_signatures(model: keras.Model) -> dict[str, SavedSignature]:
    """Every signature of the SavedModel a model of :func:`saved_model_to_keras` wraps.

    ``{}`` for any other model (built by a factory, read from a ``.keras`` file).
    """
    layer = next((lay for lay in model.layers if isinstance(lay, SignatureLayer)), None)
    if layer is None:
        return {}
    methods = method_names(layer.filepath)
    return {
        name: SavedSignature(name, function, methods.get(name, PREDICT_METHOD))
        for name, function in layer.reloaded.signatures.items()
    }


def method_names(path: str) -> dict[str, str]:
    """``{signature: method_name}`` of a SavedModel, read from its ``saved_model.pb``.

    ``tf.saved_model.load`` drops the method names; TensorFlow Serving answers
    ``:classify`` and ``:regress`` by them.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as file:
        saved.ParseFromString(file.read())
    return {
        name: definition.method_name or PREDICT_METHOD
        for graph in saved.meta_graphs
        for name, definition in graph.signature_def.items()
    }


def restored_gradients(before: Iterable[str]) -> tuple[str, ...]:
    """Registry entries of restored custom gradients added since the names ``before``."""
    known = set(before)
    return tuple(
        name
        for name, entry in list(registry().items())
        if name not in known
        and getattr(entry.get("type"), "__qualname__", None) == _RESTORED_GRADIENT
    )


def unregister(names: Iterable[str]) -> None:
    """Delete gradient-registry entries by name (those already gone are skipped)."""
    entries = registry()
    for name in names:
        entries.pop(name, None)


def saved_model_to_keras(path: str, signature: str = SERVING_SIGNATURE) -> keras.Model:
    """A functional model whose inputs and outputs are a SavedModel signature's.

    One ``keras.Input`` per input of the signature, named as in the signature,
    unknown dimensions kept unknown; the outputs are a dict keyed by the
    signature's output names. The SavedModel is loaded once, by the layer.

    Args:
        path: A SavedModel directory.
        signature: The signature to serve.

    Raises:
        ValueError: The SavedModel has no such signature, or it takes positional
            inputs.
    """
    layer = SignatureLayer(path, call_endpoint=signature)
    function = layer.signature
    args, kwargs = function.structured_input_signature
    if args or not kwargs:
        raise ValueError(
            f"the signature {signature!r} of {path!r} must take named tensor inputs. "
            f"Received: args={args!r}, kwargs={kwargs!r}"
        )
    inputs = {
        key: keras.Input(shape=spec.shape[1:], batch_size=None, dtype=spec.dtype.name, name=key)
        for key, spec in sorted(kwargs.items())
    }
    outputs = layer(inputs)
    if not isinstance(outputs, dict):
        outputs = {"output_0": outputs}
    return keras.Model(inputs, dict(outputs))


def self_check() -> None:
    """Save a tiny SavedModel, wrap its signature, and check one call and its variables.

    The SavedModel has a custom gradient: its restored registry entry must be
    found, used by ``tape.gradient``, and deleted once the model is collected.
    Only the probe's garbage needs finding: with the process's heap frozen,
    that collection scans what the probe created instead of all of
    TensorFlow, a pause during which no other thread runs. Not when the heap
    is frozen already: unfreezing would also release what the user froze.
    """
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        _probe_saved_model()
    finally:
        if freeze:
            gc.unfreeze()


def _probe_saved_model() -> None:
    @tf.custom_gradient
    def doubled_gradient(x: tf.Tensor) -> Any:
        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            return upstream * 2.0

        return tf.identity(x), gradient

    class Probe(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = tf.Variable([2.0])
            self.offset = tf.Variable([1.0])  # used by the second signature only

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": doubled_gradient(x) * self.scale}

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def shift(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"z": x + self.offset}

    with tempfile.TemporaryDirectory(prefix="lifecycle-self-check-") as directory:
        path = os.path.join(directory, "probe")
        probe = Probe()
        tf.saved_model.save(
            probe, path, signatures={SERVING_SIGNATURE: probe.serve, "shift": probe.shift}
        )
        model = saved_model_to_keras(path)
        signatures = saved_signatures(model)
        x = tf.ones((1, 1))
        with tf.GradientTape() as tape:
            tape.watch(x)
            answer = model({"x": x})["y"]
        slope = tape.gradient(answer, x)
        layer = model.layers[-1]
        restored = internal(layer, "_reloaded_obj", "TFSMLayer._reloaded_obj")
        wrapped = [internal(v, "_value", "keras.Variable._value") for v in model.weights]
        names = layer.restored_gradients
        shifted = signatures["shift"].function(x=x)["z"] if "shift" in signatures else None
        methods = {name: signature.method_name for name, signature in signatures.items()}
    if float(np.asarray(answer)[0, 0]) != 2.0:
        raise incompatible("TFSMLayer signature call", ValueError(f"answer {answer!r}"))
    if shifted is None or float(np.asarray(shifted)[0, 0]) != 2.0:
        raise incompatible(
            "every signature of a reloaded SavedModel (_reloaded_obj.signatures)",
            ValueError(f"signatures {sorted(signatures)}, 'shift' answered {shifted!r}"),
        )
    if methods != {SERVING_SIGNATURE: PREDICT_METHOD, "shift": PREDICT_METHOD}:
        raise incompatible(
            "signature method names in saved_model.pb", ValueError(f"read {methods!r}")
        )
    if len(names) != 1 or float(np.asarray(slope)[0, 0]) != 4.0:
        raise incompatible(
            "restored custom gradients in ops._gradient_registry",
            ValueError(f"found {names!r}, gradient {slope!r} (expected 4.0)"),
        )
    if [id(v) for v in wrapped] != [id(restored.scale), id(restored.offset)]:
        raise incompatible(
            "TFSMLayer weights wrap the SavedModel's own variables, of every signature "
            "(TFSMLayer._add_existing_weight, Layer._build_at_init)",
            ValueError(
                "the layer's Keras variables hold copies, or miss another signature's: "
                "release would miss them"
            ),
        )
    # Tracing the probe's own signature for the save registered its custom
    # gradient too, pinning the probe: that entry is this check's, not the user's.
    purge_gradient_registry([probe.scale.handle, probe.offset.handle])
    del model, layer, restored, wrapped, answer, tape, signatures, shifted, probe
    gc.collect()
    if any(name in registry() for name in names):
        raise incompatible(
            "restored custom gradients in ops._gradient_registry",
            ValueError(f"{names!r} are still registered after the model was collected"),
        )
