"""Find the TensorFlow resource variables a Keras model owns.

A Keras 3 variable wraps a ``tf.Variable`` (``keras_variable._value``); under
``tf.distribute`` that ``tf.Variable`` is itself a container of per-device or
per-shard components. Release must reach every component, so this module walks
down to the leaves: plain ``BaseResourceVariable`` objects that own one buffer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import keras
from tensorflow.python.distribute import ps_values, sharded_variable
from tensorflow.python.distribute import values as distribute_values
from tensorflow.python.ops import resource_variable_ops

BaseResourceVariable = resource_variable_ops.BaseResourceVariable


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
    if isinstance(variable, keras.Variable):
        variable = getattr(variable, "_value", None)
        if variable is None:  # never initialized: owns no buffer
            return
    if isinstance(variable, sharded_variable.ShardedVariableMixin):
        for shard in variable.variables:
            yield from leaves(shard)
    elif isinstance(variable, distribute_values.DistributedValues):
        for component in variable.values:
            yield from leaves(component)
    elif isinstance(variable, (ps_values.CachingVariable, ps_values.AggregatingVariable)):
        yield from leaves(variable._v)
    elif isinstance(variable, BaseResourceVariable):
        yield variable


def model_leaves(model: keras.Model) -> list[BaseResourceVariable]:
    """Every leaf resource variable of the model, each once."""
    seen: set[int] = set()
    found = []
    for variable in keras_variables(model):
        for leaf in leaves(variable):
            if id(leaf) not in seen:
                seen.add(id(leaf))
                found.append(leaf)
    return found


def leaf_nbytes(leaf: BaseResourceVariable) -> int:
    """Bytes of the buffer as declared by the variable's static shape."""
    elements = leaf.shape.num_elements()
    if elements is None:
        return 0
    return elements * leaf.dtype.size
