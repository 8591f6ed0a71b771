"""A model dropped without dispose() warns like an unclosed file, even under -W error."""

from __future__ import annotations

import gc
import logging
import sys
import time
import warnings
import weakref

import keras
import numpy as np
import pytest

import lifecycle as lc
from lifecycle import _tf


def collect_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not (gc.collect(), predicate())[1]:
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.005)


def trained(name):
    inputs = keras.Input((8,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(4)(inputs), name=name)
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((16, 8), "float32"), np.ones((16, 4), "float32"), verbose=0)
    return model


def test_under_filterwarnings_error_the_cleanup_completes_and_reports_unraisable(
    monkeypatch, caplog
):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    caplog.set_level(logging.DEBUG, logger="lifecycle")
    session = lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SESSION_CLOSE)
    with session:
        model = trained("forgotten_model")
        model_ref = weakref.ref(model)
        handle_ref = weakref.ref(model.layers[1].kernel.value.handle)
        entries = _tf.custom_gradient_entries()
        del model
        collect_until(lambda: model_ref() is None)
        assert handle_ref() is not None  # pinned by the traced gradient functions
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            session.close()
    stats = session.statistics()
    # The clean-up ran to the end: registry entries purged, buffers freed.
    assert stats.models_cleaned == 1
    assert stats.cleaner.task_errors == 0 and stats.cleaner.tasks_run == 1
    assert _tf.custom_gradient_entries() < entries
    collect_until(lambda: handle_ref() is None)
    # The warning turned error went where Python sends a finalizer's errors.
    assert [type(r.exc_value) for r in reported] == [ResourceWarning]
    assert "'forgotten_model' was garbage-collected without dispose()" in str(reported[0].exc_value)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
