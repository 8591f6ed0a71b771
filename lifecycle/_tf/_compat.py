"""Compatibility self-check of the TensorFlow/Keras internals keras-lifecycle uses.

Each check exercises one internal the way the library uses it. If TensorFlow or
Keras moves it, the check fails with a ``CompatibilityError`` that names the
installed versions and the internal, instead of the library silently leaking.
"""

from __future__ import annotations

import pickle
import random
import threading
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy, ps_values
from tensorflow.python.eager import context
from tensorflow.python.framework import func_graph as func_graph_lib

from ..errors import CompatibilityError
from . import (
    _checkpoint,
    _checkpoint_retention,
    _functions,
    _keras,
    _ledger,
    _memory,
    _naming,
    _purge,
    _recording,
    _release,
    _resources,
    _saved_model,
    _strategies,
    _threads,
)
from ._internal import incompatible, internal


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
    # Its release kernel, built beforehand on a handle that holds no buffer.
    keys = _release.release_kernel_keys([variable])
    assert _release.warm_release(keys) == len(keys) <= 1, keys
    assert _release.release_kernel_keys([variable]) == set()
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
    variable = tf.Variable([1.0])
    graph = tf.function(lambda: variable + 1.0).get_concrete_function().graph
    captures = _resources.external_captures(graph)
    assert any(capture is variable.handle for capture in captures), "handle not captured"
    assert hasattr(func_graph_lib.FuncGraph, "outer_graph"), "outer_graph"


def _check_functional_construction() -> None:
    assert _keras.is_functional_call((1, 2), {}) and not _keras.is_functional_call((), {})
    assert issubclass(_keras.Functional, keras.Model)


def _check_distribute() -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        variable = keras.Variable([1.0, 2.0])
    assert _strategies.strategy_of(_Holder(variable)) is strategy
    assert not _strategies.needs_barrier(strategy)
    assert not _strategies.is_sharded(variable)
    assert hasattr(_strategies.collective_all_reduce_strategy, "CollectiveAllReduceStrategy")
    assert hasattr(_strategies.sharded_variable, "ShardedVariableMixin")


def _check_kernel_cache() -> None:
    _memory.clear_kernel_cache()
    assert float(tf.reduce_sum(tf.ones([2]))) == 2.0  # ops run after the clear


def _check_cpu_allocator() -> None:
    assert _memory.cpu_allocator() in _memory.CPU_ALLOCATORS
    tf.ones([1])  # the context is initialized by now
    assert _memory.tensorflow_allocated()
    if _memory.cpu_allocator() == "onednn-pool":
        # The pool reports its use: a 1 MiB tensor shows in the peak.
        tensor = tf.ones([1 << 18])
        info = tf.config.experimental.get_memory_info("CPU:0")
        assert int(info["peak"]) >= tensor.shape[0] * 4, info
        del tensor
        pooled = _memory.cpu_pooled_bytes()
        assert pooled is not None and pooled >= 0


def _check_retracing_warning() -> None:
    function = tf.function(lambda x: x + 1)
    _functions.omit_retracing_warning(function)
    assert function._omit_frequent_tracing_warning is True
    assert float(function(tf.constant(1.0))) == 2.0


def _check_flat_call() -> None:
    # Two inputs of different dtypes, so a change of the flat order fails the call.
    variable = tf.Variable(2.0)
    specs = {"b": tf.TensorSpec([None, 2], tf.float32), "a": tf.TensorSpec([None, 3], tf.int32)}

    def body(x: dict[str, Any]) -> dict[str, Any]:
        return {"sum": tf.reduce_sum(x["b"], 1) * variable, "count": tf.reduce_sum(x["a"], 1)}

    concrete = tf.function(body, input_signature=[specs]).get_concrete_function()
    inputs = {"b": tf.ones([2, 2]), "a": tf.constant([[1, 2, 3], [4, 5, 6]])}
    call = _functions.flat_call(concrete)
    with tf.GradientTape() as tape:
        flat = call(tf.nest.flatten(inputs))
    expected = concrete(inputs)
    assert flat.keys() == expected.keys(), (flat.keys(), expected.keys())
    for key in expected:
        assert np.array_equal(flat[key], expected[key]), (key, flat[key], expected[key])
    assert tape.gradient(flat["sum"], variable) is not None, "no gradient recorded"


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


def _in_fresh_thread(function: Callable[[], Any]) -> Any:
    """``function()`` on a new thread: Keras's per-thread state starts empty there."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, function()))
        except Exception as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


def _check_model_methods() -> None:
    # Looked up in the classes, as super() does (getattr on a class also finds
    # its metaclass's __call__).
    classes = keras.Model.__mro__[:-1]  # not object
    missing = [
        name
        for name in _keras.ENTRY_POINTS
        if not any(callable(vars(cls).get(name)) for cls in classes)
    ]
    assert not missing, f"keras.Model has no {', '.join(missing)}"


def _check_compiled_state() -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    for make in (model.make_train_function, model.make_test_function, model.make_predict_function):
        make()
    _keras.drop_compiled_state(model)
    # Whatever Keras calls them, compiled losses, metrics, the optimizer and
    # step functions must be gone.
    kinds = (keras.optimizers.Optimizer, keras.losses.Loss, keras.metrics.Metric)
    left = [
        name
        for name, value in vars(model).items()
        if isinstance(value, kinds) or (name.endswith("_function") and value is not None)
    ]
    assert not left and not model.compiled, f"still held after dropping: {left}"


class _NameProbe(keras.layers.Layer):
    """A layer whose auto-names only the name checks create."""


def _check_name_counters() -> None:
    first = _NameProbe().name
    with _naming.isolated_names("lifecycle_check"):
        isolated = _NameProbe().name
    assert isolated == first, f"fresh counters not used: {isolated!r} after {first!r}"
    saved = _keras.caller_names()

    def elsewhere() -> str:
        _keras.restore_caller_names(saved)
        return _NameProbe().name

    carried = _in_fresh_thread(elsewhere)
    assert carried == f"{first}_1", f"counters not restored: {carried!r} after {first!r}"


def _check_name_scopes() -> None:
    with keras.name_scope("lifecycle_check"):
        saved = _keras.caller_names()

        def elsewhere() -> str:
            _keras.restore_caller_names(saved)
            return keras.Variable([1.0], name="probe").path

        path = _in_fresh_thread(elsewhere)
    assert path == "lifecycle_check/probe", f"name scope not restored: {path!r}"


class _Mixin(keras.Model):
    """Stands in for ManagedModel: a mixin put in front of a model's class."""

    def __reduce__(self) -> Any:
        return _keras.reduce_as_declared(super().__reduce__(), type(self))


def _check_registered_names() -> None:
    # A class of its own each time (variants are cached), registered for the
    # duration of the check only.
    probe = type("RegisteredProbe", (keras.Model,), {"__module__": __name__})
    names = _keras.registered_names()
    names[probe] = "lifecycle_check>RegisteredProbe"
    variant = None
    try:
        variant = _keras.subclass_variant(_Mixin, probe)
        registered = keras.saving.get_registered_name(variant)
    finally:
        names.pop(probe, None)
        names.pop(variant, None)
    assert registered == "lifecycle_check>RegisteredProbe", f"variant registered as {registered!r}"


def _check_class_swap_and_pickling() -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    _keras.set_class(model, _keras.subclass_variant(_Mixin, keras.Sequential))
    assert isinstance(model, _Mixin) and type(model).__name__ == "Sequential", type(model)
    assert _keras.declared_class(type(model)) is keras.Sequential
    copy = pickle.loads(pickle.dumps(model))
    assert type(copy) is keras.Sequential, type(copy)
    assert np.array_equal(copy.get_weights()[0], model.get_weights()[0]), "weights differ"


def _check_worker_count() -> None:
    # Creating a MultiWorkerMirroredStrategy configures the process's collective
    # ops, so the check reads the code that sets the count instead.
    extended = collective_all_reduce_strategy.CollectiveAllReduceExtended
    for initializer in ("_initialize_local", "_initialize_multi_worker"):
        method = internal(extended, initializer, f"CollectiveAllReduceExtended.{initializer}")
        assert _strategies.NUM_WORKERS in method.__code__.co_names, (
            f"CollectiveAllReduceExtended.{initializer} no longer sets {_strategies.NUM_WORKERS}"
        )


def _check_parameter_server_variables() -> None:
    variable = tf.Variable([1.0, 2.0])
    strategy = tf.distribute.get_strategy()
    for wrapper in (
        ps_values.CachingVariable(variable),
        ps_values.AggregatingVariable(strategy, variable, tf.VariableAggregation.SUM),
    ):
        found = list(_resources.leaves(wrapper))
        assert len(found) == 1 and found[0] is variable, (type(wrapper).__name__, found)


class _Holder(keras.Model):
    """Just enough of a model for strategy_of()."""

    def __init__(self, variable: keras.Variable) -> None:
        super().__init__()
        self.held = variable


_CHECKS: tuple[tuple[str, Callable[[], None]], ...] = (
    ("keras.Variable._value holds the tf.Variable", _check_keras_variable_value),
    ("AssignVariableOp releases a buffer; its kernel can be built beforehand", _check_release),
    ("FuncGraph.external_captures/outer_graph", _check_func_graph),
    ("ops._gradient_registry CustomGradient closures", _check_gradient_registry),
    ("keras functional construction", _check_functional_construction),
    ("checkpoint internals: async save, host copies, object graph", _checkpoint.self_check),
    (
        "tf.train.CheckpointManager._maybe_delete: the candidates of its retention",
        _checkpoint_retention.self_check,
    ),
    ("tf.distribute strategies, collectives and shards", _check_distribute),
    ("eager kernel cache can be cleared", _check_kernel_cache),
    (
        "oneDNN's state (_pywrap_util_port.IsMklEnabled), its CPU pool's use "
        "(get_memory_info('CPU:0')), an initialized eager context (Context._context_handle)",
        _check_cpu_allocator,
    ),
    ("dtype policy and device scope carried to another thread", _check_build_scope),
    ("tf.function frequent-retracing warning can be omitted", _check_retracing_warning),
    ("ConcreteFunction._call_flat on tf.nest-flattened inputs", _check_flat_call),
)

# The Keras class plumbing, and what dispose() reads under tf.distribute.
_CHECKS += (
    ("keras.Model methods that ManagedModel guards", _check_model_methods),
    (
        "keras.Model compiled state (_compile_loss, _compile_metrics, _loss_tracker, "
        "_compile_config) can be dropped",
        _check_compiled_state,
    ),
    ("Keras layer-name counters (global_state object_name_uids)", _check_name_counters),
    ("Keras name-scope stack (global_state name_scope_stack)", _check_name_scopes),
    (
        "Keras registered names of variant classes (object_registration.GLOBAL_CUSTOM_NAMES)",
        _check_registered_names,
    ),
    (
        "model class swap and pickling (KerasSaveable.__reduce__, _unpickle_model)",
        _check_class_swap_and_pickling,
    ),
    (
        "MultiWorkerMirroredStrategy worker count (CollectiveAllReduceExtended._num_workers)",
        _check_worker_count,
    ),
    (
        "parameter-server variables (CachingVariable._v, AggregatingVariable._v)",
        _check_parameter_server_variables,
    ),
    (
        "SavedModel signature as a Keras model (TFSMLayer.call_endpoint_fn, _reloaded_obj, "
        "restored custom gradients)",
        _saved_model.self_check,
    ),
    (
        "every new keras.Model passes Model.__new__ (recorded models), a Sequential's own "
        "functional (Sequential.build), Keras's per-thread state (global_state trackers)",
        _recording.self_check,
    ),
    (
        "a session's ledger: tf.variable_creator_scope sees every variable, again after "
        "tf.compat.v1.reset_default_graph; tf.Module._flatten; a dead variable's pinned "
        "buffer released "
        "through its handle; the global random generators (stateful_random_ops."
        "global_generator, Keras global_state)",
        _ledger.self_check,
    ),
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
        >>> lc.introspection.check_compatibility().keras.startswith("3.")
        True
    """
    global _report
    with _lock:
        if _report is None:
            # The checks build small models, whose initializers draw seeds from
            # the global generators: a run seeded with keras.utils.set_random_seed
            # must draw the same numbers with the library as without it.
            python_state, numpy_state = random.getstate(), np.random.get_state()
            try:
                failure = _run_checks_in_clean_thread()
            finally:
                random.setstate(python_state)
                np.random.set_state(numpy_state)
            if failure is not None:
                name, exc = failure
                # A strict read (_internal.internal) failed: report what it read.
                cause = exc.__cause__ if isinstance(exc, CompatibilityError) else None
                raise incompatible(name, cause or exc) from exc
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
        # The probes' own warnings are not the user's: under `-W error` (or
        # pytest's `filterwarnings = error`) a deprecation that Keras or NumPy
        # raises inside a probe (NumPy 2's `__array__` without `copy` while
        # Keras pickles) would read as a moved internal. Before Python 3.14 the
        # filters are process-wide, so other threads' warnings are ignored too
        # while the checks run: once per process, while the caller waits.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
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
