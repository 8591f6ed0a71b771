"""Mechanism A: release a variable's buffer whatever still references it.

Assigning an empty tensor with ``validate_shape=False`` swaps the buffer behind
the resource handle for a zero-element one, so the old buffer is freed as soon
as TensorFlow drops it, even while Python objects (a stray reference, a traced
graph's capture) still point at the variable. Reading the variable afterwards
returns shape ``(0,)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import context, execute

from ._internal import internal
from ._resources import BaseResourceVariable, leaf_nbytes

_LOCAL_JOB = "/job:localhost/"


def release(variables: Iterable[BaseResourceVariable]) -> tuple[int, int]:
    """Release the buffer of every leaf resource variable, each on its own device.

    Args:
        variables: Leaf resource variables, as yielded by ``leaves()``.

    Returns:
        ``(bytes_released, variables_released)``, bytes by static shape.
    """
    per_device = release_by_device(variables)
    return (
        sum(nbytes for nbytes, _ in per_device.values()),
        sum(count for _, count in per_device.values()),
    )


def release_by_device(variables: Iterable[BaseResourceVariable]) -> dict[str, tuple[int, int]]:
    """Like ``release()``, counted per device: ``{device: (bytes, buffers)}``.

    A leaf on a parameter server (``/job:ps/...``) or another worker is
    released there: the assignment runs on the leaf's own device. Leaves are
    grouped by device first, so that each device scope is entered once and
    the loop over a device's leaves is one eager op per buffer, nothing more
    (entering a device scope costs as much as the op itself).

    A leaf of this process is released with no device asked for: TensorFlow
    places an op on the device of its resource input anyway, and the eager
    kernel cache keys a kernel by the device the op asked for. Unscoped, the
    release reuses the kernels that creating the variables built (one per
    distinct variable shape, about 1 ms each to build); scoped, it built its
    own for every shape at its first dispose.
    """
    by_device: dict[str, list[BaseResourceVariable]] = {}
    for leaf in variables:
        by_device.setdefault(leaf.device, []).append(leaf)
    per_device: dict[str, tuple[int, int]] = {}
    run = _quick_execute()
    # Release is an eager operation even when dispose() is reached from inside
    # a function being traced.
    with tf.init_scope():
        ctx = context.context()
        for device, group in by_device.items():
            # Per dtype: the empty value and the op's attributes, built once.
            calls: dict[tf.DType, tuple[tf.Tensor, tuple[Any, ...]]] = {}
            nbytes = 0
            # None: no device asked for, whatever scope the caller is in.
            with tf.device(None if _is_local(device) else device):
                for leaf in group:
                    dtype = leaf.dtype
                    call = calls.get(dtype)
                    if call is None:
                        call = calls[dtype] = _assign_call(dtype)
                    empty, attrs = call
                    run("AssignVariableOp", 0, [leaf.handle, empty], attrs, ctx)
                    nbytes += leaf_nbytes(leaf)
            per_device[device] = (nbytes, len(group))
    return per_device


def _quick_execute() -> Any:
    """TensorFlow's op call with its attributes given, no inference, no dispatch.

    ``tf.raw_ops.AssignVariableOp`` infers the ``dtype`` attribute from its
    inputs and goes through the API's dispatch wrappers on every call: about
    10 µs of Python per buffer on top of the op, a third of a large model's
    release. ``execute.quick_execute`` takes the attributes as they are.

    Raises:
        CompatibilityError: TensorFlow no longer has it.
    """
    return internal(execute, "quick_execute", "tensorflow.python.eager.execute.quick_execute")


def _assign_call(dtype: tf.DType) -> tuple[tf.Tensor, tuple[Any, ...]]:
    """The empty value and the ``AssignVariableOp`` attributes for one dtype."""
    # tf.constant([]) makes the tensor directly; tf.zeros would run an op.
    empty = tf.constant([], dtype=dtype)
    return empty, ("dtype", dtype.as_datatype_enum, "validate_shape", False)


def _is_local(device: str) -> bool:
    """Whether ``device`` belongs to this process (``/job:localhost/...``)."""
    return device.startswith(_LOCAL_JOB)


def is_released(variable: BaseResourceVariable) -> bool:
    """Whether the variable's buffer reads back empty (released)."""
    with tf.init_scope(), tf.device(variable.device):
        value = tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=variable.dtype)
    return value.shape.num_elements() == 0 and variable.shape.num_elements() != 0
