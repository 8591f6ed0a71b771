"""The pytest plugin: the fixture form, and the marker under a session fixture.

Run in a child interpreter: models an inner run leaves in its modules would
otherwise stay in this process and slow every later leak search.
"""

from __future__ import annotations

import keras
import pytest

import lifecycle as lc

pytest_plugins = ["pytester"]

# Like ours: every test runs in a session that disposes leftovers on teardown,
# which must not hide a model the test body left live.
INNER_CONFTEST = """
import pytest
import lifecycle as lc

@pytest.fixture(autouse=True)
def session():
    with lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SESSION_CLOSE) as s:
        yield s
"""

INNER_TESTS = """
import keras
import pytest
import lifecycle as lc

LEFT = []

def make(name):
    inputs = keras.Input((4,))
    return lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name=name)

def test_fixture_and_disposed(no_leaks):
    make("tidy").dispose()

def test_fixture_and_left_live(no_leaks):
    LEFT.append(make("forgotten"))

@pytest.mark.no_leaks
def test_marked_and_left_to_the_session():
    model = make("left_to_session")

def test_unchecked():
    LEFT.append(make("unchecked"))

def test_reported_models_were_disposed():
    # Reported, then disposed: a leak does not spread into later tests.
    assert LEFT[0].name == "forgotten"
    assert LEFT[0].state is lc.ModelState.DISPOSED
"""


@pytest.mark.subprocess
def test_the_plugin_fails_leaking_tests_and_disposes_what_they_left(pytester):
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=300)
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "keras-lifecycle found leaks" in out
    assert "[live] module test_inner → .LEFT → list[0] → ManagedModel 'forgotten' (live)" in out
    assert "ManagedModel 'left_to_session' (live)" in out
    assert "FAILED test_inner.py::test_marked_and_left_to_the_session" in out
    assert "unchecked" not in out and "tidy" not in out


# Every pytest run of a project that installed keras-lifecycle loads the plugin.
LOAD_CHILD = """
import sys
from importlib.metadata import entry_points

(plugin,) = [e for e in entry_points(group="pytest11") if e.name == "lifecycle"]
plugin.load()
heavy = ("tensorflow", "keras", "numpy", "lifecycle._tf", "lifecycle._model", "lifecycle.testing")
print("RESULT", plugin.value, sorted(m for m in sys.modules if m.startswith(heavy)))
"""


@pytest.mark.subprocess
def test_the_plugin_is_inside_the_package_and_loading_it_imports_no_tensorflow(run_child):
    output = run_child(LOAD_CHILD, python_options=("-W", "error"))
    assert output.split("RESULT", 1)[1].split() == ["lifecycle.pytest_plugin", "[]"]


@pytest.mark.no_leaks
def test_the_marker_in_this_suite_passes_a_test_that_disposes():
    inputs = keras.Input((4,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name="disposed_in_body")
    model.dispose()
    assert model.state is lc.ModelState.DISPOSED
