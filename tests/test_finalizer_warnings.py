"""A model dropped without dispose() warns like an unclosed file, even under -W error."""

from __future__ import annotations

import logging
import sys
import warnings
import weakref

from support.models import trained
from support.waits import collect_until

import lifecycle as lc
from lifecycle import _tf


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
        collect_until(lambda: model_ref() is None, "the dropped model collected")
        assert handle_ref() is not None  # pinned by the traced gradient functions
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            session.close()
    stats = session.statistics()
    # The clean-up ran to the end: registry entries purged, buffers freed.
    assert stats.models_cleaned == 1
    # Two tasks: the model's clean-up and the session's sweep of its dead variables.
    assert stats.cleaner.task_errors == 0 and stats.cleaner.tasks_run == 2
    assert _tf.custom_gradient_entries() < entries
    collect_until(lambda: handle_ref() is None, "its buffer freed")
    # The warning turned error went where Python sends a finalizer's errors.
    assert [type(r.exc_value) for r in reported] == [ResourceWarning]
    assert "'forgotten_model' was garbage-collected without dispose()" in str(reported[0].exc_value)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
