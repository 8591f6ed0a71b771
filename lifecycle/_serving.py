"""A traced serving path that stays guarded by the model's lifecycle.

A ``tf.function`` that a user traces around a model runs its graph without
passing through Python, so nothing can stop it from running while the model is
disposed — and freeing buffers under a running graph can crash the process.
``serving_function`` traces the same graph but enters the model's call gate on
every call, so ``dispose()`` waits for it and later calls raise ``DisposedError``.
"""

from __future__ import annotations

from typing import Any

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
        # With a signature, calls go to its one concrete function: cheaper than
        # the tf.function's dispatch, and safe from its lock, which a call with
        # inputs that do not fit the signature leaves held (TensorFlow 2.21:
        # every later call from another thread then waits forever).
        self._call: Any = (
            self._function if signature is None else self._function.get_concrete_function()
        )
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
            return self._call(inputs)
        finally:
            gate.exit()

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
        self._function = self._call = None


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
