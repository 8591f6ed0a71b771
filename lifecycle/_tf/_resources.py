"""Find the TensorFlow resource variables a Keras model owns.

A Keras 3 variable wraps a ``tf.Variable`` (``keras_variable._value``); under
``tf.distribute`` that ``tf.Variable`` is itself a container of per-device or
per-shard components. Release must reach every component, so this module walks
down to the leaves: plain ``BaseResourceVariable`` objects that own one buffer.
It also reads what a traced graph captured, which is how a graph pins buffers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.distribute import ps_values, sharded_variable
from tensorflow.python.distribute import values as distribute_values
from tensorflow.python.framework import func_graph as func_graph_lib
from tensorflow.python.ops import resource_variable_ops

from ._internal import internal

BaseResourceVariable = resource_variable_ops.BaseResourceVariable
# The variables that hold one buffer and contain nothing: most of any model's.
_PLAIN_LEAVES = frozenset(
    {resource_variable_ops.ResourceVariable, resource_variable_ops.UninitializedVariable}
)


def keras_variables(model: keras.Model) -> list[Any]:
    """Every Keras variable the model owns, deduplicated, in a stable order.

    Covers layer weights and non-trainable state (including ``SeedGenerator``
    state), the variables of compiled metrics and loss trackers, and the
    optimizer's variables (``iterations``, learning rate, slots), also for a
    wrapped inner optimizer.
    """
    groups: list[Iterable[Any]] = [model.variables, model.metrics_variables]
    optimizer = getattr(model, "optimizer", None)
    while optimizer is not None:
        groups.append(optimizer.variables)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    seen: set[int] = set()
    found = []
    for group in groups:
        for variable in group:
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
    return found


def leaves(variable: Any) -> Iterator[BaseResourceVariable]:
    """The resource variables that hold the buffers behind one variable.

    Args:
        variable: A ``keras.Variable``, a ``tf.Variable`` or a ``tf.distribute``
            container of them (mirrored, sharded, parameter-server variables).

    Yields:
        One ``BaseResourceVariable`` per buffer (per replica, per shard).
    """
    variable = tf_variable(variable)
    if isinstance(variable, sharded_variable.ShardedVariableMixin):
        for shard in variable.variables:
            yield from leaves(shard)
    elif isinstance(variable, distribute_values.DistributedValues):
        for component in variable.values:
            yield from leaves(component)
    elif isinstance(variable, (ps_values.CachingVariable, ps_values.AggregatingVariable)):
        yield from leaves(internal(variable, "_v", f"{type(variable).__name__}._v"))
    elif isinstance(variable, BaseResourceVariable):
        yield variable


def tf_variable(variable: Any) -> Any:
    """The TensorFlow variable behind a Keras variable; any other variable as is.

    Returns:
        A ``tf.Variable`` or a ``tf.distribute`` container of them; ``None`` for
        a Keras variable never initialized (it owns no buffer).

    Raises:
        CompatibilityError: Keras no longer keeps it in ``keras.Variable._value``.
    """
    if isinstance(variable, keras.Variable):
        return internal(variable, "_value", "keras.Variable._value")
    return variable


def model_leaves(model: keras.Model) -> list[BaseResourceVariable]:
    """Every leaf resource variable of the model, each once."""
    return variable_leaves(keras_variables(model))


def variable_leaves(variables: Iterable[Any]) -> list[BaseResourceVariable]:
    """Every leaf resource variable behind ``variables``, each once, in order."""
    seen: set[int] = set()
    found = []
    for variable in variables:
        variable = tf_variable(variable)
        # A plain variable is its own leaf: skip the walk (a large model has
        # hundreds of them, and dispose() reads them all).
        for leaf in (variable,) if type(variable) in _PLAIN_LEAVES else leaves(variable):
            if id(leaf) not in seen:
                seen.add(id(leaf))
                found.append(leaf)
    return found


def _is_keras_owner(obj: Any) -> bool:
    return isinstance(obj, (keras.Layer, keras.optimizers.Optimizer, keras.Variable))


def object_variables(obj: Any) -> list[Any]:
    """The variables a Keras model or layer, an optimizer, a ``tf.Module`` or a variable owns.

    A model's are those of :func:`keras_variables` (weights, metric state, its
    optimizer's); an optimizer's include a wrapped inner optimizer's; a
    ``tf.Module``'s are every ``tf.Variable`` it holds, with the variables of the
    Keras layers, models, optimizers and variables among its attributes (in
    lists and dicts too). A variable is its own.

    Raises:
        TypeError: ``obj`` is none of these.
        CompatibilityError: ``tf.Module._flatten`` has moved.
    """
    if isinstance(obj, keras.Model):
        return keras_variables(obj)
    if isinstance(obj, keras.Layer):
        return list(obj.variables)
    if isinstance(obj, keras.optimizers.Optimizer):
        found: list[Any] = []
        optimizer: Any = obj
        while optimizer is not None:
            found.extend(optimizer.variables)
            optimizer = getattr(optimizer, "inner_optimizer", None)
        return found
    if isinstance(obj, (keras.Variable, tf.Variable)):
        return [obj]
    if isinstance(obj, tf.Module):
        flatten = internal(obj, "_flatten", "tf.Module._flatten")
        found = list(obj.variables)
        for owner in flatten(predicate=_is_keras_owner):
            found.extend(object_variables(owner))
        return found
    raise TypeError(
        "Expected a keras.Model, a Keras layer, a Keras optimizer, a tf.Module or a variable. "
        f"Received: {type(obj).__module__}.{type(obj).__qualname__} object {obj!r:.80}"
    )


def leaf_nbytes(leaf: BaseResourceVariable) -> int:
    """Bytes of the buffer as declared by the variable's static shape."""
    elements = leaf.shape.num_elements()
    if elements is None:
        return 0
    return elements * leaf.dtype.size


def external_captures(graph: func_graph_lib.FuncGraph) -> tuple[Any, ...]:
    """Tensors a traced graph captured from outside, among them its variables' handles.

    Raises:
        CompatibilityError: ``FuncGraph.external_captures`` has moved.
    """
    return tuple(internal(graph, "external_captures", "FuncGraph.external_captures"))
