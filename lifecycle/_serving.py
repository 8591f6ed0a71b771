"""A traced serving path that stays guarded by the model's lifecycle.

A ``tf.function`` that a user traces around a model runs its graph without
passing through Python, so nothing can stop it from running while the model is
disposed — and freeing buffers under a running graph can crash the process.
``serving_function`` traces the same graph but enters the model's call gate on
every call, so ``dispose()`` waits for it and later calls raise ``DisposedError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from . import _tf
from ._disposal import disposed_error
from ._model import ManagedModel


class ServingFunction:
    """A traced ``model(x, training=False)``, guarded like the model's entry points.

    Create it with :func:`serving_function`. Calls are thread-safe. After the
    model is disposed the traced graph is dropped and calls raise
    :class:`~lifecycle.DisposedError`.
    """

    def __init__(
        self,
        model: ManagedModel,
        input_signature: Any | None,
        jit_compile: bool | None,
    ) -> None:
        self._model = model
        self._gate = model._lifecycle.gate

        def serve(inputs: Any) -> Any:
            return model(inputs, training=False)

        signature = None if input_signature is None else [input_signature]
        self._function: Any = tf.function(
            serve, input_signature=signature, jit_compile=jit_compile, reduce_retracing=True
        )
        # Every serving function shares `serve`'s body; one trace per model is expected.
        _tf.omit_retracing_warning(self._function)
        self._specs = input_signature
        self._call: Any = self._function
        self._flat: Any = None
        self._leaves: list[Leaf] = []
        # Whether _call_fitting's arrays can take the flat call: not for strings.
        self._flat_arrays = False
        if signature is not None:
            # With a signature, calls go to its one concrete function: cheaper
            # than the tf.function's dispatch, and safe from its lock, which a
            # call with inputs that do not fit the signature leaves held
            # (TensorFlow 2.21: every later call from another thread then waits
            # forever).
            concrete = self._function.get_concrete_function()
            self._call = concrete
            # Inputs that already fit the signature skip TensorFlow's argument
            # binding; anything else takes the full call, and its errors. Only
            # for signatures of a form flatten_as knows (it takes their own
            # structure) and of known ranks.
            leaves = tf.nest.flatten(input_signature)
            if flatten_as(input_signature, input_signature) is not None and all(
                spec.shape.rank is not None for spec in leaves
            ):
                self._flat = _tf.flat_call(concrete)
                self._leaves = [Leaf.of(spec) for spec in leaves]
                self._flat_arrays = all(leaf.numpy_dtype is not None for leaf in self._leaves)
        model._lifecycle.dependents.add(self)

    def __call__(self, inputs: Any) -> Any:
        """Run the traced model on ``inputs``.

        Raises:
            DisposedError: The model has been disposed (or is being disposed).
        """
        gate = self._gate
        if not gate.enter():
            raise disposed_error(self._model, "its serving function")
        try:
            if self._flat is not None:
                tensors = self._fitting_tensors(inputs)
                if tensors is not None:
                    return self._flat(tensors)
            return self._call(inputs)
        finally:
            gate.exit()

    def _call_fitting(self, arrays: list[np.ndarray]) -> Any:
        """Run the traced model on flat NumPy arrays that were checked to fit the signature.

        For a caller that checked its inputs already (registry batching): one
        array per input, in ``tf.nest`` order of the signature, each of its
        input's dtype with a shape that fits it. Nothing is checked again.

        Raises:
            DisposedError: The model has been disposed (or is being disposed).
        """
        gate = self._gate
        if not gate.enter():
            raise disposed_error(self._model, "its serving function")
        try:
            if self._flat_arrays:
                return self._flat([tf.constant(array) for array in arrays])
            return self._call(tf.nest.pack_sequence_as(self._specs, arrays))
        finally:
            gate.exit()

    def _fitting_tensors(self, inputs: Any) -> list[Any] | None:
        """``inputs`` as flat tensors if each already fits its spec exactly, else None.

        Eager tensors of the spec's dtype pass as they are, NumPy arrays of its
        dtype are wrapped; anything that needs a conversion or does not fit is
        left to TensorFlow's own binding.
        """
        flat = flatten_as(self._specs, inputs)
        if flat is None:
            return None
        tensors = []
        for value, leaf in zip(flat, self._leaves, strict=True):
            is_tensor = isinstance(value, tf.Tensor)
            if is_tensor:
                if value.dtype != leaf.dtype:
                    return None
            elif type(value) is not np.ndarray or value.dtype != leaf.numpy_dtype:
                return None
            if not leaf.fits(value.shape):
                return None
            tensors.append(value if is_tensor else tf.constant(value))
        return tensors

    def structure(self) -> tuple[Any, Any]:
        """The traced input signature and the outputs' specs, as nests of ``tf.TensorSpec``.

        Raises:
            ValueError: The function was created without an input signature.
            DisposedError: The model has been disposed.
        """
        if self._function is None:
            raise disposed_error(self._model, "its serving function")
        if self._function.input_signature is None:
            raise ValueError("A serving function without an input signature has no structure.")
        concrete = self._function.get_concrete_function()
        outputs = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype), concrete.structured_outputs
        )
        return self._function.input_signature[0], outputs

    def _drop(self) -> None:
        # Called by dispose() once calls have drained: the traced graph holds
        # the model's handles.
        self._function = self._call = self._flat = None
        self._flat_arrays = False


class Leaf:
    """One input of a serving signature, as the fast path checks it."""

    __slots__ = ("dims", "dtype", "numpy_dtype", "rest")

    def __init__(self, dtype: tf.DType, numpy_dtype: Any, dims: tuple[int | None, ...]) -> None:
        self.dtype = dtype
        self.numpy_dtype = numpy_dtype
        self.dims = dims
        # The dims after the first when all are known (the usual batch signature), else None.
        rest = dims[1:]
        self.rest = rest if dims and None not in rest else None

    @classmethod
    def of(cls, spec: tf.TensorSpec) -> Leaf:
        """The leaf of a spec of known rank."""
        # Strings are never taken from NumPy here: object arrays need TensorFlow's conversion.
        numpy_dtype = None if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype)
        return cls(spec.dtype, numpy_dtype, tuple(spec.shape.as_list()))

    def fits(self, shape: tuple[int | None, ...]) -> bool:
        """Whether a value of ``shape`` fits: the same rank, each known dimension equal.

        ``TensorShape.is_compatible_with`` says the same, at several times the cost.
        """
        dims = self.dims
        if self.rest is not None and type(shape) is tuple:  # one comparison, in C
            return (
                len(shape) == len(dims)
                and shape[1:] == self.rest
                and (dims[0] is None or dims[0] == shape[0])
            )
        return len(shape) == len(dims) and all(
            want is None or want == got for want, got in zip(dims, shape, strict=True)
        )


def flatten_as(specs: Any, inputs: Any) -> list[Any] | None:
    """``inputs`` as a list in ``tf.nest`` order of ``specs``, or None if shaped otherwise.

    ``specs`` is a ``tf.TensorSpec``, a mapping of them or a list or tuple of
    them; any other signature gives None for every input.
    """
    if isinstance(specs, tf.TensorSpec):
        return [inputs]
    if isinstance(specs, Mapping):
        if not all(isinstance(spec, tf.TensorSpec) for spec in specs.values()):
            return None
        if not isinstance(inputs, Mapping) or inputs.keys() != specs.keys():
            return None
        return [inputs[key] for key in sorted(specs)]
    if isinstance(specs, (list, tuple)) and all(isinstance(spec, tf.TensorSpec) for spec in specs):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != len(specs):
            return None
        return list(inputs)
    return None


def serving_function(
    model: ManagedModel,
    input_signature: Any | None = None,
    *,
    jit_compile: bool | None = None,
) -> ServingFunction:
    """Trace a fast serving call of a managed model that ``dispose()`` can guard.

    Prefer this to wrapping the model in your own ``tf.function``: a bare
    ``tf.function`` runs the model's graph without any Python code that could
    refuse the call, so disposing the model while it runs is unsafe.

    Args:
        model: A managed model (:class:`ManagedModel` or the result of ``manage()``).
        input_signature: A ``tf.TensorSpec`` (or nest of them) for the model's
            inputs; pins one trace and avoids retracing. ``None`` traces per
            input shape.
        jit_compile: Passed to ``tf.function``.

    Returns:
        A callable :class:`ServingFunction`.

    Raises:
        TypeError: ``model`` is not managed.
        DisposedError: ``model`` has already been disposed.

    Example:
        >>> import keras, tensorflow as tf, lifecycle as lc
        >>> inputs = keras.Input((4,))
        >>> model = lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs))
        >>> serve = lc.serving_function(model, tf.TensorSpec([None, 4], tf.float32))
        >>> serve(tf.ones([3, 4])).shape
        TensorShape([3, 2])
    """
    if not isinstance(model, ManagedModel):
        raise TypeError(
            "serving_function() takes a managed model; wrap yours with lc.manage(model) "
            f"first. Received: {type(model).__qualname__}"
        )
    if not model._lifecycle.gate.enter():
        raise disposed_error(model, "serving_function()")
    try:
        return ServingFunction(model, input_signature, jit_compile)
    finally:
        model._lifecycle.gate.exit()
