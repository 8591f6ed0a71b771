"""Leak reports name who holds a disposed model (a module's chain, a running function's
local); the pytest plugin fails leaking tests."""

from __future__ import annotations

import gc
import sys
import types

import keras
import pytest

import lifecycle as lc
from lifecycle.testing import LeakCheck, assert_no_leaks, no_leaks

pytest_plugins = ["pytester"]


def make(name):
    inputs = keras.Input((4,))
    return lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name=name)


@pytest.fixture
def app_cache():
    module = types.ModuleType("app.cache")
    module.CACHE = {}
    sys.modules["app.cache"] = module
    yield module
    module.CACHE.clear()
    del sys.modules["app.cache"]
    gc.collect()


def test_a_planted_leak_is_reported_with_its_holder_chain(app_cache):
    model = make("risk_v3")
    model.dispose()
    app_cache.CACHE["last"] = [0, 1, 2, model]
    del model
    report = lc.find_leaks()
    assert report and len(report) == 1
    leak = report.leaks[0]
    assert leak.kind == "model"
    assert str(leak) == (
        "module app.cache → .CACHE → dict['last'] → list[3] → ManagedModel 'risk_v3' (disposed)"
    )
    assert "1 leak(s): 1 model" in str(report)


def test_nothing_planted_nothing_reported(app_cache):
    model = make("dropped")
    model.dispose()
    del model
    assert not lc.find_leaks()
    assert "no leaks" in str(lc.find_leaks())


@pytest.mark.slow  # other leak reports stay in the fast lane
def test_a_report_iterates_over_its_leaks(app_cache):
    for name in ("first", "second"):
        model = make(name)
        model.dispose()
        app_cache.CACHE[name] = model
    del model
    report = lc.find_leaks()
    assert sorted(leak.description for leak in report) == [
        "ManagedModel 'first' (disposed)",
        "ManagedModel 'second' (disposed)",
    ]
    assert list(report) == list(report.leaks) and len(report) == 2
    assert list(lc.LeakReport()) == []


def trace(model):
    """A concrete function of ``model``: its graph captures the model's variables."""
    import tensorflow as tf

    function = tf.function(lambda x: model(x))
    return function.get_concrete_function(tf.TensorSpec([None, 4]))


@pytest.mark.slow  # other leak reports stay in the fast lane
def test_graphs_that_captured_a_disposed_model_are_reported(app_cache):
    model = make("traced")
    app_cache.CACHE["fn"] = trace(model)
    model.dispose()
    del model
    report = lc.find_leaks()
    graphs = [leak for leak in report.leaks if leak.kind == "graph"]
    assert len(graphs) == 1, report
    assert str(graphs[0]) == "module app.cache → .CACHE → dict['fn'] → FuncGraph '<lambda>'"


@pytest.mark.slow  # other leak reports stay in the fast lane
def test_check_disposed_counts_module_holders_only(app_cache):
    model = make("held")
    model.dispose()
    assert not lc.check_disposed(model)  # only this frame holds it
    app_cache.CACHE["held"] = model
    assert "dict['held']" in str(lc.check_disposed(model))
    with pytest.raises(ValueError, match="managed model"):
        lc.check_disposed(keras.Sequential())


def test_live_models_and_the_context_manager(app_cache):
    with pytest.raises(AssertionError, match=r"\[live\].*'forgotten' \(live\)"), no_leaks():
        app_cache.CACHE["forgotten"] = make("forgotten")
    assert app_cache.CACHE["forgotten"].state is lc.ModelState.DISPOSED  # disposed after
    check = LeakCheck().start()
    model = make("fine")
    model.dispose()
    assert not check.report()
    with pytest.raises(AssertionError, match="forgotten"):
        assert_no_leaks()  # process-wide: the disposed 'forgotten' is in the cache


def test_missing_objgraph_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "objgraph", None)
    with pytest.raises(ImportError, match=r'pip install "keras-lifecycle\[leaks\]"'):
        lc.find_leaks()


PLUGIN_TESTS = """
import keras, pytest
import lifecycle as lc

KEPT = []

def make():
    inputs = keras.Input((4,))
    return lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name="leaky")

@pytest.mark.no_leaks
def test_marked_and_left_live():
    model = make()

def test_fixture_and_kept_in_a_module(no_leaks):
    model = make()
    model.dispose()
    KEPT.append(model)

@pytest.mark.no_leaks
def test_marked_and_clean():
    model = make()
    model.dispose()

def test_unmarked_is_not_checked():
    make()
"""


@pytest.mark.subprocess
@pytest.mark.slow  # tests/test_testing_plugin.py runs the plugin in the fast lane
def test_the_pytest_plugin_fails_leaking_tests_with_the_report(pytester):
    pytester.makepyfile(test_user=PLUGIN_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=240)
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "keras-lifecycle found leaks" in out
    assert "[live] " in out and "'leaky' (live)" in out
    assert "module test_user → .KEPT → list[0] → ManagedModel 'leaky' (disposed)" in out


# --- holders no module reaches: a running function's locals -------------------------


def test_a_model_held_by_a_local_names_the_frame_and_the_local():
    model = make("local_model")
    model.dispose()
    report = lc.find_leaks()
    assert len(report) == 1, report
    leak = report.leaks[0]
    assert leak.kind == "model" and leak.chain == ()
    assert leak.held_by == (
        "frame of test_a_model_held_by_a_local_names_the_frame_and_the_local() → local 'model'",
    )
    assert str(leak) == (
        "ManagedModel 'local_model' (disposed): no chain from a module (held by: frame of "
        "test_a_model_held_by_a_local_names_the_frame_and_the_local() → local 'model')"
    )


def test_a_deleted_local_is_not_reported_after_a_report_read_the_frame():
    model = make("deleted_local")
    model.dispose()
    assert lc.find_leaks()  # reads this frame's locals while `model` is set
    del model
    report = lc.find_leaks()
    assert not report, report
