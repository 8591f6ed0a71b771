"""A version's serving signature: its named inputs and outputs, and calls by name.

The names are the ones Keras 3's ``model.export()`` gives a SavedModel's
``serving_default`` signature: inputs by their ``keras.Input(name=...)``,
outputs by a dict-output model's keys, else ``output_0``, ``output_1``, ...
The signature is read once per version, from its traced serving function, after
its build; a request by name is checked against it before anything runs.
"""

from __future__ import annotations

import reprlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import tensorflow as tf

from .._serving import ServingFunction
from .._tf import PREDICT_METHOD

__all__ = [
    "Inference",
    "NamedTensorSpec",
    "ServingSignature",
    "signature_of",
    "signature_of_function",
]


@attrs.frozen
class NamedTensorSpec:
    """One named input or output of a serving signature.

    Attributes:
        name: The tensor's name in the signature.
        dtype: The dtype's name, as TensorFlow spells it (``"float32"``,
            ``"int64"``, ``"string"``).
        shape: The dimensions, ``None`` where unknown (the batch dimension).
    """

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def check_shape(self, shape: Sequence[int], name: str | None = None) -> None:
        """Check that a value of ``shape`` fits this tensor: its rank, and each known dimension.

        A server checks the shape a request declares before it reads any value.

        Args:
            shape: The value's dimensions.
            name: What the message calls the value; ``None``: this tensor's name.

        Raises:
            ValueError: The rank differs, or a known dimension does; the message
                shows both shapes.

        Example:
            >>> import lifecycle as lc
            >>> spec = lc.NamedTensorSpec("x", "float32", (None, 4))
            >>> spec.check_shape((2, 4))
            >>> spec.check_shape((2, 3))
            Traceback (most recent call last):
            ...
            ValueError: Input 'x' has shape (2, 3), but the model takes (-1, 4) (-1: any size).
        """
        fits = len(shape) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, shape, strict=False)
        )
        if not fits:
            called = self.name if name is None else name
            wanted = tuple(-1 if d is None else d for d in self.shape)
            raise ValueError(
                f"Input {called!r} has shape {tuple(shape)}, but the model takes {wanted} "
                "(-1: any size)."
            )


@attrs.frozen
class ServingSignature:
    """A version's serving signature: what a request by name feeds and gets back.

    Attributes:
        inputs: The inputs, in the order the model takes them.
        outputs: The outputs, in the order the model returns them.
        method_name: What TensorFlow Serving answers with it:
            ``tensorflow/serving/predict`` (``:predict``, every Keras model's),
            ``.../classify`` (``:classify``) or ``.../regress`` (``:regress``),
            as a SavedModel's ``saved_model.pb`` names it.

    Example:
        >>> import keras, lifecycle as lc
        >>> def factory():
        ...     x = keras.Input((4,), name="features")
        ...     return keras.Model(x, keras.layers.Dense(1)(x))
        >>> with lc.ModelRegistry() as registry:
        ...     _ = registry.load("risk", 1, factory)
        ...     registry.signature("risk").inputs[0].name
        'features'
    """

    inputs: tuple[NamedTensorSpec, ...]
    outputs: tuple[NamedTensorSpec, ...]
    method_name: str = PREDICT_METHOD
    # How the named inputs nest into the model's call, and outputs out of it:
    # "single", "list" or "dict" (outputs: "list" or "dict").
    input_form: str = attrs.field(default="single", repr=False, eq=False)
    output_form: str = attrs.field(default="list", repr=False, eq=False)

    def input(self, name: str) -> NamedTensorSpec:
        """The input called ``name``.

        Raises:
            ValueError: There is no such input.
        """
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise ValueError(
            f"The model has no input named {name!r}. Inputs: {[s.name for s in self.inputs]}"
        )

    def check_names(self, names: Collection[str]) -> None:
        """Check that ``names`` are exactly the inputs: none missing, none unknown.

        A server checks the names a request gives before it reads any value.
        The request's names are shown shortened (``reprlib``): it may send
        many, or long ones.

        Args:
            names: The inputs a request names.

        Raises:
            ValueError: An input is missing or unknown; the message lists both.

        Example:
            >>> import lifecycle as lc
            >>> spec = lc.NamedTensorSpec("x", "float32", (None, 4))
            >>> signature = lc.ServingSignature(inputs=(spec,), outputs=())
            >>> signature.check_names(["x"])
            >>> signature.check_names(["y"])  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: The request's inputs ['y'] do not match ...: missing ['x'], unknown ['y'].
        """
        inputs = [spec.name for spec in self.inputs]
        unknown = sorted(set(names) - set(inputs))
        missing = [name for name in inputs if name not in names]
        if unknown or missing:
            raise ValueError(
                f"The request's inputs {reprlib.repr(sorted(names))} do not match the model's "
                f"inputs {inputs}: missing {missing}, unknown {reprlib.repr(unknown)}."
            )

    def feed(self, inputs: Mapping[str, Any]) -> Any:
        """The model's input nest for named ``inputs``, each checked and converted.

        Raises:
            ValueError: An input is missing or unknown (:meth:`check_names`), or its
                shape does not fit (:meth:`NamedTensorSpec.check_shape`).
            TypeError: A value cannot be converted to its input's dtype.
        """
        self.check_names(inputs)
        values = [_value(spec, inputs[spec.name]) for spec in self.inputs]
        if self.input_form == "dict":
            return dict(zip([spec.name for spec in self.inputs], values, strict=True))
        if self.input_form == "list":
            return values
        return values[0]

    def name_outputs(self, outputs: Any) -> dict[str, Any]:
        """The model's output nest as ``{output name: tensor}``."""
        if self.output_form == "dict":
            return {spec.name: outputs[spec.name] for spec in self.outputs}
        flat = tf.nest.flatten(outputs)
        return {spec.name: tensor for spec, tensor in zip(self.outputs, flat, strict=True)}


@attrs.frozen
class Inference:
    """The result of :meth:`ModelRegistry.infer`: named outputs, and who computed them.

    Attributes:
        name: The model.
        version: The version that served the request.
        outputs: The outputs by signature name, as NumPy arrays (``bytes``
            objects for strings).
    """

    name: str
    version: int
    outputs: dict[str, np.ndarray]


def signature_of(serve: ServingFunction, input_names: list[str]) -> ServingSignature:
    """The signature of a traced serving function.

    Args:
        serve: The version's serving function, traced with an input signature.
        input_names: The names of the model's inputs (``model.inputs``), in
            order; ``input_0``, ... stand in where they are missing.
    """
    specs, outputs = serve.structure()
    if isinstance(specs, Mapping):
        form = "dict"
        named = [(str(key), spec) for key, spec in specs.items()]
    else:
        flat = tf.nest.flatten(specs)
        form = "single" if len(flat) == 1 and not isinstance(specs, (list, tuple)) else "list"
        names = input_names if len(input_names) == len(flat) else []
        named = [(names[i] if names else f"input_{i}", spec) for i, spec in enumerate(flat)]
    if isinstance(outputs, Mapping):
        out_form = "dict"
        out_named = [(str(key), spec) for key, spec in outputs.items()]
    else:
        out_form = "list"
        out_named = [(f"output_{i}", spec) for i, spec in enumerate(tf.nest.flatten(outputs))]
    return ServingSignature(
        inputs=tuple(_named(name, spec) for name, spec in named),
        outputs=tuple(_named(name, spec) for name, spec in out_named),
        input_form=form,
        output_form=out_form,
    )


def signature_of_function(function: Any, method_name: str = PREDICT_METHOD) -> ServingSignature:
    """The signature of a SavedModel signature's concrete function (named inputs and outputs).

    Raises:
        ValueError: The function takes positional inputs (a signature never does).
    """
    args, kwargs = function.structured_input_signature
    if args:
        raise ValueError(f"a signature takes named inputs only. Received: args={args!r}")
    outputs = function.structured_outputs
    if not isinstance(outputs, Mapping):
        outputs = {"output_0": outputs}
    return ServingSignature(
        inputs=tuple(_named(key, spec) for key, spec in sorted(kwargs.items())),
        outputs=tuple(_named(str(key), spec) for key, spec in outputs.items()),
        method_name=method_name,
        input_form="dict",
        output_form="dict",
    )


def _named(name: str, spec: Any) -> NamedTensorSpec:
    shape = tuple(spec.shape.as_list()) if spec.shape.rank is not None else ()
    return NamedTensorSpec(name=name, dtype=spec.dtype.name, shape=shape)


def _value(spec: NamedTensorSpec, value: Any) -> np.ndarray | tf.Tensor:
    """``value`` as an array of ``spec``'s dtype (a tensor for strings) whose shape fits ``spec``.

    An array rather than a tensor: the serving function makes the tensor from
    it, and a batched version merges arrays (from a tensor it would take the
    array back first).
    """
    dtype = tf.as_dtype(spec.dtype)
    try:
        if dtype == tf.string:
            fed = tf.convert_to_tensor(value, tf.string)
            shape = tuple(fed.shape.as_list())
        else:
            array = np.asarray(value)
            if array.dtype.kind not in "biuf" or (array.dtype.kind == "f" and dtype.is_integer):
                raise TypeError(f"got {array.dtype.name} values")
            fed = array.astype(dtype.as_numpy_dtype, copy=False)
            shape = fed.shape
    except (TypeError, ValueError) as error:
        raise TypeError(f"Input {spec.name!r} must hold {spec.dtype} values: {error}") from None
    spec.check_shape(shape)
    return fed
