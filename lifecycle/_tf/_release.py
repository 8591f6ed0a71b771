"""Mechanism A: release a variable's buffer whatever still references it.

Assigning an empty tensor with ``validate_shape=False`` swaps the buffer behind
the resource handle for a zero-element one, so the old buffer is freed as soon
as TensorFlow drops it, even while Python objects (a stray reference, a traced
graph's capture) still point at the variable. Reading the variable afterwards
returns shape ``(0,)``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import context, execute

from ._internal import internal
from ._resources import BaseResourceVariable, leaf_nbytes

_LOCAL_JOB = "/job:localhost/"

#: A release kernel's key: the variable's dtype (as its enum) and shape.
KernelKey = tuple[int, tuple[int | None, ...]]

# Release kernels in TensorFlow's eager kernel cache, as far as this module
# knows: built by warm_release(), forgotten when the cache is cleared.
_warm: set[KernelKey] = set()
_warm_lock = threading.Lock()


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
    release reuses the kernels an earlier release or :func:`warm_release`
    built for the same dtype and shape; creating the variables does not build
    them, so a process's first release builds one per distinct shape.
    """
    return release_handles(
        (leaf.handle, leaf.dtype, leaf.device, leaf_nbytes(leaf)) for leaf in variables
    )


#: A buffer to release by its handle: ``(handle tensor, dtype, device, bytes)``.
Buffer = tuple[Any, tf.DType, str, int]


def release_handles(buffers: Iterable[Buffer]) -> dict[str, tuple[int, int]]:
    """Release buffers by their resource handles: ``{device: (bytes, buffers)}``.

    The variable objects need not exist any more: a handle that a traced
    graph captured keeps its buffer alive after the variable is gone, and
    assigning through that handle frees the buffer all the same.

    Args:
        buffers: ``(handle, dtype, device, nbytes)`` for each buffer.
    """
    by_device: dict[str, list[Buffer]] = {}
    for buffer in buffers:
        by_device.setdefault(buffer[2], []).append(buffer)
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
                for handle, dtype, _, size in group:
                    call = calls.get(dtype)
                    if call is None:
                        call = calls[dtype] = _assign_call(dtype)
                    empty, attrs = call
                    run("AssignVariableOp", 0, [handle, empty], attrs, ctx)
                    nbytes += size
            per_device[device] = (nbytes, len(group))
    return per_device


def _quick_execute() -> Any:
    """TensorFlow's op call with its attributes given, no inference, no dispatch.

    ``tf.raw_ops.AssignVariableOp`` infers the ``dtype`` attribute from its
    inputs and goes through the API's dispatch wrappers on every call: Python
    work per buffer on top of the op, a large share of a large model's release
    (``benchmarks/dispose.py``). ``execute.quick_execute`` takes the
    attributes as they are.

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


def release_kernel_keys(variables: Iterable[BaseResourceVariable]) -> set[KernelKey]:
    """The release kernels the local ``variables`` need that are not known built.

    Args:
        variables: Leaf resource variables, as yielded by ``leaves()``.
    """
    keys = {
        (leaf.dtype.as_datatype_enum, tuple(leaf.shape.as_list()))
        for leaf in variables
        if _is_local(leaf.device) and leaf.shape.is_fully_defined()
    }
    with _warm_lock:
        return keys - _warm


def warm_release(keys: Iterable[KernelKey]) -> int:
    """Build the eager kernels a later release of buffers of these kinds runs.

    TensorFlow caches an ``AssignVariableOp`` kernel per dtype and shape of
    the variable, and building one takes time: a model's first ``dispose()``
    in a process would build one per distinct variable shape (30 for
    ResNet50), and pay for them on the caller's thread. This builds
    them beforehand on a handle of that dtype and shape that holds no buffer
    (``VarHandleOp``, assigned the empty value and destroyed at once), so it
    allocates nothing. It runs on the cleaner's thread.

    Args:
        keys: As returned by :func:`release_kernel_keys`.

    Returns:
        How many kernels were built.
    """
    run = _quick_execute()
    built = 0
    calls: dict[int, tuple[tf.Tensor, tuple[Any, ...]]] = {}
    with tf.init_scope():
        ctx = context.context()
        for key in keys:
            with _warm_lock:
                if key in _warm:
                    continue
            dtype, shape = tf.as_dtype(key[0]), key[1]
            call = calls.get(key[0])
            if call is None:
                call = calls[key[0]] = _assign_call(dtype)
            empty, attrs = call
            # shared_name="": an anonymous resource, this handle's alone.
            handle = tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape, shared_name="")
            try:
                run("AssignVariableOp", 0, [handle, empty], attrs, ctx)
            finally:
                tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)
            with _warm_lock:
                _warm.add(key)
            built += 1
    return built


def forget_release_kernels() -> None:
    """The kernel cache was cleared: every release kernel must be built again."""
    with _warm_lock:
        _warm.clear()
