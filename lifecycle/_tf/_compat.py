"""Compatibility self-check of the TensorFlow/Keras internals keras-lifecycle uses.

Each check exercises one internal the way the library uses it. If TensorFlow or
Keras moves it, the check fails with a ``CompatibilityError`` that names the
installed versions and the internal, instead of the library silently leaking.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable

import attrs
import keras
import tensorflow as tf
from keras.src.backend.tensorflow import core as keras_tf_core
from tensorflow.python.checkpoint import async_checkpoint_helper
from tensorflow.python.eager import context
from tensorflow.python.framework import func_graph as func_graph_lib

from ..errors import CompatibilityError
from . import (
    _checkpoint,
    _distribute,
    _functions,
    _keras,
    _memory,
    _purge,
    _release,
    _resources,
    _threads,
)


@attrs.frozen
class CompatibilityReport:
    """The outcome of a successful self-check.

    Attributes:
        tensorflow: Installed TensorFlow version.
        keras: Installed Keras version.
        checks: Names of the internals that were exercised, in order.
    """

    tensorflow: str
    keras: str
    checks: tuple[str, ...]


def _check_keras_variable_value() -> None:
    variable = keras.Variable([1.0, 2.0])
    leaves = list(_resources.leaves(variable))
    assert len(leaves) == 1 and isinstance(leaves[0], tf.Variable), leaves


def _check_release() -> None:
    variable = tf.Variable(tf.ones([4]))
    assert _release.release([variable]) == (16, 1)
    assert _release.is_released(variable), variable.read_value().shape


def _check_gradient_registry() -> None:
    registry = _purge.registry()
    assert isinstance(registry, dict), type(registry)
    variable = tf.Variable(tf.ones([3]))

    @tf.custom_gradient
    def scaled(x):
        return x * variable, lambda dy, variables=None: (dy, [dy])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(scaled(tf.ones([3])))
        return tape.gradient(y, variable)

    before = _purge.custom_gradient_entries()
    step.get_concrete_function()
    assert _purge.custom_gradient_entries() > before, "no CustomGradient entry registered"
    assert _purge.purge_gradient_registry([variable.handle]) >= 1, (
        "entry not matched to its variable"
    )


def _check_func_graph() -> None:
    for name in ("external_captures", "outer_graph"):
        assert hasattr(func_graph_lib.FuncGraph, name), name


def _check_functional_construction() -> None:
    assert _keras.is_functional_call((1, 2), {}) and not _keras.is_functional_call((), {})
    assert issubclass(_keras.Functional, keras.Model)


def _check_checkpoint_graph() -> None:
    variable = tf.Variable([1.0, 2.0])
    with tempfile.TemporaryDirectory() as directory:
        prefix = tf.train.Checkpoint(kept=variable).write(os.path.join(directory, "c"))
        graph = _checkpoint.object_graph(_checkpoint.verify(prefix))
    root = tf.train.Checkpoint(kept=variable)
    matched = _checkpoint.match(root, graph)
    assert any(obj is variable for obj in matched.values()), matched
    assert _checkpoint.node_paths(graph)[max(matched)] == "kept", _checkpoint.node_paths(graph)


def _check_async_checkpoint() -> None:
    assert "_copy_trackable_to_cpu" in vars(keras_tf_core.Variable)
    helper = async_checkpoint_helper.AsyncCheckpointHelper
    for name in ("_join_async_save_thread", "_ensure_initialized", "sync"):
        assert callable(getattr(helper, name, None)), name
    assert hasattr(tf.train.Checkpoint(), "_async_checkpointer_impl")


def _check_distribute() -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        variable = keras.Variable([1.0, 2.0])
    assert _distribute.strategy_of(_Holder(variable)) is strategy
    assert not _distribute.needs_barrier(strategy)
    assert not _distribute.is_sharded(variable)
    assert hasattr(_distribute.collective_all_reduce_strategy, "CollectiveAllReduceStrategy")
    assert hasattr(_distribute.sharded_variable, "ShardedVariableMixin")


def _check_kernel_cache() -> None:
    _memory.clear_kernel_cache()
    assert float(tf.reduce_sum(tf.ones([2]))) == 2.0  # ops run after the clear


def _check_retracing_warning() -> None:
    function = tf.function(lambda x: x + 1)
    _functions.omit_retracing_warning(function)
    assert function._omit_frequent_tracing_warning is True
    assert float(function(tf.constant(1.0))) == 2.0


def _check_build_scope() -> None:
    seen: list[tuple[str, str]] = []
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        with tf.device("/CPU:0"):
            scope = _threads.capture_build_scope()
    finally:
        keras.config.set_dtype_policy(previous)

    def elsewhere() -> None:
        with scope():
            seen.append((keras.config.dtype_policy().name, context.context().device_name))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen and seen[0][0] == "mixed_float16", seen
    assert seen[0][1].endswith("device:CPU:0"), seen


class _Holder(keras.Model):
    """Just enough of a model for strategy_of()."""

    def __init__(self, variable: keras.Variable) -> None:
        super().__init__()
        self.held = variable


_CHECKS: tuple[tuple[str, Callable[[], None]], ...] = (
    ("keras.Variable._value holds the tf.Variable", _check_keras_variable_value),
    ("AssignVariableOp releases a buffer", _check_release),
    ("FuncGraph.external_captures/outer_graph", _check_func_graph),
    ("ops._gradient_registry CustomGradient closures", _check_gradient_registry),
    ("keras functional construction", _check_functional_construction),
    ("checkpoint object graph and matching", _check_checkpoint_graph),
    ("async checkpoint helper and Keras variable copy", _check_async_checkpoint),
    ("checkpoint internals: async save, host copies, object graph", _checkpoint.self_check),
    ("tf.distribute strategies, collectives and shards", _check_distribute),
    ("eager kernel cache can be cleared", _check_kernel_cache),
    ("dtype policy and device scope carried to another thread", _check_build_scope),
    ("tf.function frequent-retracing warning can be omitted", _check_retracing_warning),
)

_lock = threading.Lock()
_report: CompatibilityReport | None = None


def check_compatibility() -> CompatibilityReport:
    """Exercise every TensorFlow/Keras internal keras-lifecycle relies on.

    The result is cached: later calls return it at once. Managed models run
    this check once, on first use.

    Returns:
        A :class:`CompatibilityReport` naming the versions and the checks.

    Raises:
        CompatibilityError: An internal has moved; the message names the
            installed TensorFlow and Keras versions and the failed check.

    Example:
        >>> import lifecycle as lc
        >>> lc.check_compatibility().keras.startswith("3.")
        True
    """
    global _report
    with _lock:
        if _report is None:
            failure = _run_checks_in_clean_thread()
            if failure is not None:
                name, exc = failure
                raise incompatible(name, exc) from exc
            _report = CompatibilityReport(
                tensorflow=tf.__version__,
                keras=keras.__version__,
                checks=tuple(name for name, _ in _CHECKS),
            )
        return _report


def _run_checks_in_clean_thread() -> tuple[str, BaseException] | None:
    # Strategy scopes, name scopes and Keras's name counters are thread-local:
    # a thread of its own keeps the caller's context out of the checks and the
    # checks out of the caller's context.
    failure: list[tuple[str, BaseException]] = []

    def run() -> None:
        for name, check in _CHECKS:
            try:
                check()
            except Exception as exc:  # any failure means the internal moved
                failure.append((name, exc))
                return

    thread = threading.Thread(target=run, name="lifecycle-self-check")
    thread.start()
    thread.join()
    return failure[0] if failure else None


def incompatible(what: str, exc: BaseException) -> CompatibilityError:
    """A CompatibilityError naming the installed versions and what failed."""
    return CompatibilityError(
        f"keras-lifecycle cannot work with TensorFlow {tf.__version__} and Keras "
        f"{keras.__version__}: the internal check {what!r} failed "
        f"({type(exc).__name__}: {exc}). Install the versions pinned by "
        "keras-lifecycle (pip install keras-lifecycle) or upgrade keras-lifecycle."
    )
