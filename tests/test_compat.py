"""The compatibility self-check exercises each internal and fails loudly."""

from __future__ import annotations

import collections
import re
import types
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.common import global_state
from keras.src.models import model as keras_model_module
from keras.src.saving.keras_saveable import KerasSaveable
from keras.src.utils import naming
from tensorflow.python.distribute import collective_all_reduce_strategy, ps_values
from tensorflow.python.distribute import values as distribute_values
from tensorflow.python.eager import context
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.ops import resource_variable_ops

import lifecycle as lc
from lifecycle import _tf
from lifecycle._tf import _compat, _purge
from lifecycle._tf import _keras as _tf_keras
from lifecycle._tf._keras import COMPILED_STATE


def test_self_check_passes_on_the_pinned_versions():
    report = lc.introspection.check_compatibility()
    assert (report.tensorflow, report.keras) == (tf.__version__, keras.__version__)
    assert len(report.checks) == len(_compat._CHECKS)
    assert lc.introspection.check_compatibility() is report


@pytest.fixture
def fresh_check(monkeypatch):
    monkeypatch.setattr(_compat, "_report", None)


def test_a_moved_registry_fails_loudly_naming_versions(fresh_check, monkeypatch):
    monkeypatch.setattr(_purge, "registry", lambda: [])
    with pytest.raises(lc.CompatibilityError) as info:
        lc.introspection.check_compatibility()
    message = str(info.value)
    assert f"TensorFlow {tf.__version__} and Keras {keras.__version__}" in message
    assert "ops._gradient_registry" in message


def test_a_changed_closure_layout_fails_loudly(fresh_check, monkeypatch):
    # If TF stopped keeping graph tensors in the custom-gradient closure, the
    # purge would silently match nothing: the check must catch it.
    monkeypatch.setattr(_purge, "_MAX_DEPTH", 0)
    with pytest.raises(lc.CompatibilityError, match="entry not matched to its variable"):
        lc.introspection.check_compatibility()


def test_a_release_that_no_longer_frees_fails_loudly(fresh_check, monkeypatch):
    from lifecycle._tf import _release

    monkeypatch.setattr(_release, "is_released", lambda variable: False)
    with pytest.raises(lc.CompatibilityError, match="AssignVariableOp releases a buffer"):
        lc.introspection.check_compatibility()


# --- each internal, taken away, fails loudly ----------------------------------
#
# Each test below changes one TensorFlow/Keras internal the way a new release
# could (a renamed attribute, a moved table, a new format) and expects the
# self-check, or the code that reads the internal, to raise CompatibilityError
# naming it and the installed versions, rather than to leak or hang silently.

VERSIONS = f"TensorFlow {tf.__version__} and Keras {keras.__version__}"


def fails_loudly(*fragments):
    with pytest.raises(lc.CompatibilityError) as info:
        lc.introspection.check_compatibility()
    message = str(info.value)
    assert VERSIONS in message
    for fragment in fragments:
        assert fragment in message
    return message


def rename_after_init(monkeypatch, cls, old, new):
    """Instances of ``cls`` keep attribute ``old`` under ``new``, as if TF had renamed it."""
    original = cls.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        vars(self)[new] = vars(self).pop(old)

    monkeypatch.setattr(cls, "__init__", init)


def delete_method(monkeypatch, name):
    """Take ``name`` away from ``keras.Model`` and every base that defines it."""
    for cls in keras.Model.__mro__:
        if name in vars(cls):
            monkeypatch.delattr(cls, name)


def defining_class(cls, name):
    return next(c for c in cls.__mro__ if name in vars(c))


def test_every_check_has_a_distinct_name():
    names = [name for name, _ in _compat._CHECKS]
    assert len(names) == len(set(names))


def test_a_renamed_keras_variable_value_fails_loudly(fresh_check, monkeypatch):
    rename_after_init(monkeypatch, keras.Variable, "_value", "_tensorflow_variable")
    fails_loudly("keras.Variable._value")


def test_moved_external_captures_fail_loudly(fresh_check, monkeypatch):
    monkeypatch.delattr(FuncGraph, "external_captures")
    fails_loudly("FuncGraph.external_captures")


def test_leak_reports_read_captures_loudly():
    with pytest.raises(lc.CompatibilityError, match=r"FuncGraph\.external_captures"):
        _tf.external_captures(object())


def test_a_moved_functional_construction_fails_loudly(fresh_check, monkeypatch):
    monkeypatch.delattr(keras_model_module, "functional_init_arguments")
    fails_loudly("keras functional construction", "attribute 'functional_init_arguments'")


def test_a_renamed_distribute_strategy_attribute_fails_loudly(fresh_check, monkeypatch):
    # Distributed variables forward unknown attributes to their first component.
    for cls in (distribute_values.DistributedVariable, resource_variable_ops.BaseResourceVariable):
        rename_after_init(monkeypatch, cls, "_distribute_strategy", "_strategy")
    fails_loudly("attribute '_distribute_strategy'")


def test_a_moved_collective_strategy_class_fails_loudly(fresh_check, monkeypatch):
    monkeypatch.delattr(collective_all_reduce_strategy, "CollectiveAllReduceStrategy")
    fails_loudly("tf.distribute strategies, collectives and shards", "CollectiveAllReduceStrategy")


def test_a_renamed_worker_count_fails_the_check(fresh_check, monkeypatch):
    extended = collective_all_reduce_strategy.CollectiveAllReduceExtended

    def _initialize_local(self, cluster_resolver, devices=None):
        self._worker_count = 1

    monkeypatch.setattr(extended, "_initialize_local", _initialize_local)
    fails_loudly("CollectiveAllReduceExtended._num_workers", "_initialize_local no longer sets")


def test_a_missing_worker_count_fails_dispose_loudly_instead_of_skipping_the_barrier():
    # Defaulting to one worker would skip the barrier: peers would hang.
    strategy = object.__new__(collective_all_reduce_strategy.CollectiveAllReduceStrategy)
    strategy._extended = types.SimpleNamespace()
    with pytest.raises(lc.CompatibilityError, match=r"CollectiveAllReduceExtended\._num_workers"):
        _tf.strategies.needs_barrier(strategy)
    strategy._extended = types.SimpleNamespace(_num_workers=2)
    assert _tf.strategies.needs_barrier(strategy)


@pytest.mark.parametrize("cls", [ps_values.CachingVariable, ps_values.AggregatingVariable])
def test_a_renamed_parameter_server_wrapped_variable_fails_loudly(fresh_check, monkeypatch, cls):
    rename_after_init(monkeypatch, cls, "_v", "_wrapped")
    monkeypatch.setattr(cls, "__getattr__", lambda self, name: getattr(self._wrapped, name))
    fails_loudly("parameter-server variables (CachingVariable._v", "attribute '_v'")


def test_a_kernel_cache_that_cannot_be_cleared_fails_loudly(fresh_check, monkeypatch):
    monkeypatch.delattr(context.Context, "clear_kernel_cache")
    fails_loudly("eager kernel cache can be cleared", "clear_kernel_cache")


def test_a_device_scope_no_longer_reported_fails_loudly(fresh_check, monkeypatch):
    monkeypatch.setattr(context.Context, "device_name", property(lambda self: ""))
    fails_loudly("dtype policy and device scope carried to another thread")


def test_a_renamed_retracing_switch_fails_loudly(fresh_check, monkeypatch):
    rename_after_init(
        monkeypatch,
        polymorphic_function.Function,
        "_omit_frequent_tracing_warning",
        "_omit_tracing_warning",
    )
    fails_loudly("tf.function frequent-retracing warning", "_omit_frequent_tracing_warning")


def test_serving_functions_read_the_flat_call_loudly():
    # (Taking _call_flat away fails an earlier check: every tf.function call uses it.)
    with pytest.raises(lc.CompatibilityError, match=r"ConcreteFunction\._call_flat"):
        _tf.flat_call(object())


def test_flat_inputs_in_another_order_fail_the_check(fresh_check, monkeypatch):
    # As if TensorFlow fed a dict's inputs in insertion order instead of sorted keys.
    original = ConcreteFunction._call_flat

    def reversed_order(self, tensors, captured_inputs):
        return original(self, list(reversed(tensors)), captured_inputs)

    monkeypatch.setattr(ConcreteFunction, "_call_flat", reversed_order)
    fails_loudly("ConcreteFunction._call_flat on tf.nest-flattened inputs")


@pytest.mark.parametrize("method", ["predict_on_batch", "save_weights", "__call__"])
def test_a_renamed_model_method_fails_the_check(fresh_check, monkeypatch, method):
    delete_method(monkeypatch, method)
    fails_loudly("keras.Model methods that ManagedModel guards", f"keras.Model has no {method}")


def test_a_renamed_model_method_fails_loudly_at_its_first_call(monkeypatch):
    inputs = keras.Input((3,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs))
    delete_method(monkeypatch, "predict_on_batch")
    with pytest.raises(lc.CompatibilityError, match=r"keras\.Model\.predict_on_batch"):
        model.predict_on_batch(np.ones((1, 3), "float32"))
    assert model.state is lc.ModelState.LIVE  # the guard let go of the model
    model.dispose()


@pytest.mark.parametrize("name", COMPILED_STATE)
def test_renamed_compiled_state_fails_loudly(fresh_check, monkeypatch, name):
    owner = defining_class(keras.Model, "compile")
    compile_ = owner.compile

    def compile_and_rename(self, *args, **kwargs):
        compile_(self, *args, **kwargs)
        vars(self)[f"{name}_v2"] = vars(self).pop(name)

    monkeypatch.setattr(owner, "compile", compile_and_rename)
    fails_loudly(f"keras.Model compiled state ({', '.join(COMPILED_STATE)})", f"'{name}'")


def test_compiled_state_that_keras_keeps_elsewhere_fails_loudly(fresh_check, monkeypatch):
    # A new attribute holding the compiled loss would stay pinned after dispose.
    owner = defining_class(keras.Model, "compile")
    compile_ = owner.compile

    def compile_and_keep(self, *args, **kwargs):
        compile_(self, *args, **kwargs)
        vars(self)["_compiled_loss_v2"] = self._compile_loss

    monkeypatch.setattr(owner, "compile", compile_and_keep)
    fails_loudly("still held after dropping: ['_compiled_loss_v2']")


def test_renamed_layer_name_counters_fail_loudly(fresh_check, monkeypatch):
    def uniquify(name):  # keras.src.utils.naming.uniquify, with another key
        counters = global_state.get_global_attribute(
            "object_name_counters", default=collections.defaultdict(int), set_to_default=True
        )
        unique = f"{name}_{counters[name]}" if name in counters else name
        counters[name] += 1
        return unique

    monkeypatch.setattr(naming, "uniquify", uniquify)
    fails_loudly("object_name_uids", "fresh counters not used")


def test_a_renamed_name_scope_stack_fails_loudly(fresh_check, monkeypatch):
    # As if Keras kept its stack under another key than the one saved and restored.
    monkeypatch.setattr(_tf_keras, "_NAME_SCOPES", "name_scopes")
    fails_loudly("name_scope_stack", "name scope not restored")


def test_a_moved_registered_names_table_fails_loudly(fresh_check, monkeypatch):
    monkeypatch.setattr(_tf_keras, "object_registration", types.SimpleNamespace())
    fails_loudly("object_registration.GLOBAL_CUSTOM_NAMES")


def test_registered_names_keras_no_longer_reads_fail_loudly(fresh_check, monkeypatch):
    stale = types.SimpleNamespace(GLOBAL_CUSTOM_NAMES={})
    monkeypatch.setattr(_tf_keras, "object_registration", stale)
    fails_loudly("GLOBAL_CUSTOM_NAMES", "variant registered as 'RegisteredProbe'")


def test_a_changed_pickle_format_fails_loudly(fresh_check, monkeypatch):
    def load(data):
        raise AssertionError("never unpickled")

    monkeypatch.setattr(KerasSaveable, "__reduce__", lambda self: (load, (b"",)))
    fails_loudly("KerasSaveable.__reduce__", "expected a class method")


def test_a_renamed_unpickling_method_still_works(fresh_check, monkeypatch):
    # Keras pickles with whatever class method it names: the name is not assumed.
    unpickle = vars(KerasSaveable)["_unpickle_model"]  # the classmethod itself
    monkeypatch.setattr(KerasSaveable, "_load_pickled", unpickle, raising=False)
    reduce = KerasSaveable.__reduce__

    def reduce_renamed(self):
        _, args = reduce(self)
        return self._load_pickled, args

    monkeypatch.setattr(KerasSaveable, "__reduce__", reduce_renamed)
    assert lc.introspection.check_compatibility().checks


def test_the_failure_of_the_first_broken_check_is_reported_alone(fresh_check, monkeypatch):
    monkeypatch.setattr(_purge, "registry", lambda: [])
    message = fails_loudly("ops._gradient_registry")
    assert message.count("keras-lifecycle cannot work") == 1


@pytest.mark.subprocess
def test_a_moved_internal_fails_import_loudly(run_child):
    out = run_child(
        """
        import keras.src.models.functional as functional
        del functional.Functional
        try:
            import lifecycle
        except Exception as exc:
            print(type(exc).__name__, "|", exc)
        """
    )
    assert out.startswith("CompatibilityError |")
    assert VERSIONS in out and "Functional" in out


@pytest.mark.subprocess
@pytest.mark.slow  # the fast lane keeps a self-check child
def test_a_renamed_model_method_does_not_break_import(run_child):
    out = run_child(
        """
        import keras
        for cls in keras.Model.__mro__:
            if "train_on_batch" in vars(cls):
                delattr(cls, "train_on_batch")
        import lifecycle as lc
        from lifecycle.introspection import check_compatibility
        print("imported")
        for attempt in (check_compatibility, lambda: lc.manage(keras.Sequential())):
            try:
                attempt()
            except lc.CompatibilityError as exc:
                print("CompatibilityError |", exc)
        """
    )
    lines = out.splitlines()
    assert lines[0] == "imported" and len(lines) == 3
    assert all("keras.Model has no train_on_batch" in line for line in lines[1:])


def test_statistics_and_distributed_training_run_the_check(fresh_check, monkeypatch):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])  # not managed
    model.compile(optimizer="sgd", loss="mse")
    monkeypatch.setattr(_purge, "registry", lambda: [])
    with pytest.raises(lc.CompatibilityError, match=r"ops\._gradient_registry"):
        lc.statistics(count_graphs=False)

    def dataset():
        return tf.data.Dataset.from_tensors((tf.ones([4, 2]), tf.ones([4, 1]))).repeat()

    with pytest.raises(lc.CompatibilityError, match=r"ops\._gradient_registry"):
        lc.distribute.train(model, dataset, steps=1)
    monkeypatch.undo()
    assert lc.statistics(count_graphs=False).live_models >= 0
    assert lc.distribute.train(model, dataset, steps=1) >= 0.0


def test_internals_are_read_only_under_lifecycle_tf():
    # keras.src / tensorflow.python modules and the private attributes the
    # self-check covers are touched only inside lifecycle/_tf/.
    names = (
        "external_captures|_distribute_strategy|_num_workers|_v|_value|_compile_loss"
        "|_compile_metrics|_loss_tracker|_compile_config|object_name_uids|name_scope_stack"
        "|GLOBAL_CUSTOM_NAMES|_unpickle_model|_gradient_registry|__class__"
    )
    pattern = re.compile(
        rf"keras\.src|tensorflow\.python|(?<!_tf)\.({names})\b|[\"']({names})[\"']"
    )
    package = Path(lc.__file__).parent
    offenders = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if "_tf" not in path.relative_to(package).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_internals_doc_lists_every_check_by_name():
    doc = (Path(lc.__file__).parent.parent / "docs" / "internals.md").read_text()
    section = doc.split("## The self-check", 1)[1]
    missing = [
        name for name in lc.introspection.check_compatibility().checks if f"`{name}`" not in section
    ]
    assert not missing, missing


@pytest.mark.slow  # the fast lane keeps a self-check child
def test_the_first_check_leaves_the_global_random_generators_as_it_found_them(run_child):
    """A seeded run draws the same numbers whether the library checked itself in between."""
    out = run_child(
        """
        import random
        import numpy as np
        import keras
        keras.utils.set_random_seed(7)
        expected = (random.random(), float(np.random.rand()))
        keras.utils.set_random_seed(7)
        import lifecycle as lc
        lc.introspection.check_compatibility()  # the first check in this process: it builds models
        print("same:", (random.random(), float(np.random.rand())) == expected)
        """
    )
    assert "same: True" in out


@pytest.mark.subprocess
def test_the_library_works_under_warnings_as_errors(run_child):
    """`python -W error`: manage, fit, dispose, a registry's load and a served request.

    The self-check's probes raise deprecations of Keras and NumPy 2 (pickling
    a model); they must not reach a user's warning filter.
    """
    out = run_child(
        """
        import threading, time, socket
        import numpy as np, keras, uvicorn, httpx, grpc, tensorflow as tf
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
        import lifecycle as lc
        from lifecycle.server import ModelService, ServerConfig, build_app, build_grpc_server

        def factory():
            x = keras.Input((3,), name="features")
            return keras.Model(x, keras.layers.Dense(2, bias_initializer="ones")(x))

        model = lc.manage(factory())
        model.compile(optimizer="adam", loss="mse")
        model.fit(np.zeros((8, 3)), np.zeros((8, 2)), epochs=1, verbose=0)
        assert model.dispose().bytes_released > 0

        def port():
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                return sock.getsockname()[1]

        config = ServerConfig.from_flags(rest_api_port=port(), port=port())
        with lc.ModelRegistry() as registry:
            registry.load("m", 1, factory)
            service = ModelService(registry, config)
            server = uvicorn.Server(uvicorn.Config(
                build_app(registry, config, service=service), host="127.0.0.1",
                port=config.rest_api_port, log_level="warning"))
            thread = threading.Thread(target=server.run, daemon=True)
            thread.start()
            deadline = time.monotonic() + 60
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline
                time.sleep(0.05)
            grpc_server = build_grpc_server(service, config)
            grpc_server.start()
            try:
                url = f"http://127.0.0.1:{config.rest_api_port}"
                rows = httpx.post(f"{url}/v1/models/m:predict", json={"instances": [[0, 0, 0]]})
                assert rows.json() == {"predictions": [[1.0, 1.0]]}, rows.text
                request = predict_pb2.PredictRequest()
                request.model_spec.name = "m"
                zeros = tf.make_tensor_proto(np.zeros((1, 3), "float32"))
                request.inputs["features"].CopyFrom(zeros)
                with grpc.insecure_channel(f"127.0.0.1:{config.grpc_port}") as channel:
                    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                    answer = stub.Predict(request, timeout=30)
                assert tf.make_ndarray(answer.outputs["output_0"]).tolist() == [[1.0, 1.0]]
            finally:
                grpc_server.stop(5).wait(30)
                server.should_exit = True
                thread.join(30)
        print("ok under -W error")
        """,
        python_options=("-W", "error"),
    )
    assert "ok under -W error" in out


@pytest.mark.subprocess
@pytest.mark.slow  # the fast lane keeps a self-check child
def test_the_checks_leave_no_graph_no_registry_entry_and_no_frozen_heap(run_child):
    # The probes' traced graphs and gradient-registry entries (the probe's own
    # signature registered one when it was traced for the save) go with the
    # check, and the heap it froze for its collection is unfrozen.
    out = run_child(
        """
        import gc
        from tensorflow.python.framework.func_graph import FuncGraph
        from lifecycle import _tf
        calls = []
        gc.callbacks.append(lambda phase, info: phase == "stop" and calls.append(info))
        _tf.check_compatibility()
        gc.callbacks.clear()
        gc.collect()
        graphs = sum(isinstance(o, FuncGraph) for o in gc.get_objects())
        full = [i["collected"] for i in calls if i["generation"] == 2]
        print(_tf.custom_gradient_entries(), graphs, gc.get_freeze_count(), len(full) >= 1)
        """
    )
    assert out.split() == ["0", "0", "0", "True"], out
