"""Leak reports on holders no module reaches: a running function's locals."""

from __future__ import annotations

import keras

import lifecycle as lc
from lifecycle.monitoring._leaks import find_leaks


def make(name):
    inputs = keras.Input((4,))
    return lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name=name)


def test_a_model_held_by_a_local_names_the_frame_and_the_local():
    model = make("local_model")
    model.dispose()
    report = find_leaks()
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
    assert find_leaks()  # reads this frame's locals while `model` is set
    del model
    report = find_leaks()
    assert not report, report
