"""Mechanism A: release a variable's buffer whatever still references it.

Assigning an empty tensor with ``validate_shape=False`` swaps the buffer behind
the resource handle for a zero-element one, so the old buffer is freed as soon
as TensorFlow drops it, even while Python objects (a stray reference, a traced
graph's capture) still point at the variable. Reading the variable afterwards
returns shape ``(0,)``.
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

from ._resources import BaseResourceVariable, leaf_nbytes


def release(variables: Iterable[BaseResourceVariable]) -> tuple[int, int]:
    """Release the buffer of every leaf resource variable, each on its own device.

    Args:
        variables: Leaf resource variables, as yielded by ``leaves()``.

    Returns:
        ``(bytes_released, variables_released)``, bytes by static shape.
    """
    released_bytes = 0
    released = 0
    empties: dict[tuple[str, tf.DType], tf.Tensor] = {}
    # Release is an eager operation even when dispose() is reached from inside
    # a function being traced.
    with tf.init_scope():
        for leaf in variables:
            key = (leaf.device, leaf.dtype)
            with tf.device(leaf.device):
                empty = empties.get(key)
                if empty is None:
                    empty = empties[key] = tf.zeros([0], dtype=leaf.dtype)
                tf.raw_ops.AssignVariableOp(resource=leaf.handle, value=empty, validate_shape=False)
            released_bytes += leaf_nbytes(leaf)
            released += 1
    return released_bytes, released


def is_released(variable: BaseResourceVariable) -> bool:
    """Whether the variable's buffer reads back empty (released)."""
    with tf.init_scope(), tf.device(variable.device):
        value = tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=variable.dtype)
    return value.shape.num_elements() == 0 and variable.shape.num_elements() != 0
