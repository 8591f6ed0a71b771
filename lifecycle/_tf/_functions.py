"""Traced functions: TensorFlow's retracing warning, and calls on flat tensors.

TensorFlow warns when calls to functions sharing one Python body trace often
("5 out of the last 5 calls to <function ...> triggered tf.function
retracing"). Every serving function of a registry shares one body, and each
version traces it once by design: after five swaps every load would log the
warning. ``Function._omit_frequent_tracing_warning`` turns it off per function.

Calling a ``ConcreteFunction`` binds its arguments to the traced signature in
Python on every call (``_call_with_structured_signature``), which costs about
as much again as running a small model's graph. A caller that has already
checked its tensors against the signature can skip it: ``_call_flat`` takes
the flat input tensors, in ``tf.nest.flatten`` order of the signature, and
still records gradients when a tape watches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._internal import internal

__all__ = ["flat_call", "omit_retracing_warning"]


def omit_retracing_warning(function: Any) -> None:
    """Stop TensorFlow's frequent-retracing warning for one ``tf.function``."""
    if not hasattr(function, "_omit_frequent_tracing_warning"):
        raise AttributeError("tf.function no longer has _omit_frequent_tracing_warning")
    function._omit_frequent_tracing_warning = True


def flat_call(concrete: Any) -> Callable[[Sequence[Any]], Any]:
    """A call of ``concrete`` on its flat input tensors, without argument binding.

    Args:
        concrete: A ``ConcreteFunction`` traced with an input signature.

    Returns:
        ``call(tensors)``: the function's structured outputs for ``tensors``,
        eager tensors of the signature's dtypes and compatible shapes, in
        ``tf.nest.flatten`` order of the signature. Nothing checks them: the
        caller must.

    Raises:
        CompatibilityError: ``ConcreteFunction`` no longer has ``_call_flat``.
    """
    call_flat = internal(concrete, "_call_flat", "ConcreteFunction._call_flat")

    def call(tensors: Sequence[Any]) -> Any:
        return call_flat(list(tensors), concrete.captured_inputs)

    return call
