"""The cleaner on its own: pure Python, with an injected collector."""

from __future__ import annotations

import sys
import threading
import warnings

import pytest

from lifecycle._core import Cleaner, CleanupStrategy
from lifecycle._core._cleaner import warn_from_finalizer


def make(strategy, threshold=None):
    calls = []
    cleaner = Cleaner(
        strategy=strategy,
        name="t",
        pressure_threshold=threshold,
        collector=lambda: calls.append(threading.current_thread().name),
    )
    return cleaner, calls


def test_background_runs_queued_work_on_its_own_thread():
    cleaner, _ = make(CleanupStrategy.IN_BACKGROUND)
    ran = []
    cleaner.enqueue(lambda: ran.append(threading.current_thread().name))
    assert cleaner.wait_idle(10)
    assert ran == ["lifecycle-cleaner-t"]
    cleaner.close()
    assert cleaner.statistics().tasks_run == 1


@pytest.mark.parametrize(
    "strategy", [CleanupStrategy.ON_SAFE_POINTS, CleanupStrategy.ON_SESSION_CLOSE]
)
def test_other_strategies_run_work_only_when_told(strategy):
    cleaner, calls = make(strategy, threshold=10)
    ran = []
    cleaner.enqueue(lambda: ran.append(1))
    cleaner.note_allocated(10)
    assert cleaner.wait_idle(0) is False and ran == [] and calls == []
    cleaner.safe_point()
    expected = 1 if strategy is CleanupStrategy.ON_SAFE_POINTS else 0
    assert (len(ran), len(calls)) == (expected, expected)
    cleaner.close()
    assert len(ran) == 1 and len(calls) == expected + 1


def test_a_failing_task_is_counted_and_does_not_stop_the_cleaner(caplog):
    cleaner, _ = make(CleanupStrategy.ON_SAFE_POINTS)
    ran = []
    cleaner.enqueue(lambda: 1 / 0)
    cleaner.enqueue(lambda: ran.append(1))
    cleaner.run_pending()
    stats = cleaner.statistics()
    assert ran == [1] and (stats.tasks_run, stats.task_errors) == (2, 1)
    assert "cleanup task of cleaner 't' failed" in caplog.text


def test_work_after_close_goes_to_the_successor():
    successor, _ = make(CleanupStrategy.ON_SAFE_POINTS)
    cleaner, _ = make(CleanupStrategy.ON_SESSION_CLOSE)
    cleaner.close(successor)
    ran = []
    cleaner.enqueue(lambda: ran.append(1))
    assert ran == [] and successor.statistics().queued == 1
    successor.run_pending()
    assert ran == [1]


def test_pressure_counts_bytes_both_ways_and_resets_on_collection():
    cleaner, calls = make(CleanupStrategy.ON_SAFE_POINTS, threshold=100)
    cleaner.note_allocated(60)
    cleaner.note_released(30)
    cleaner.note_released(-5)  # ignored
    cleaner.safe_point()
    assert calls == [] and cleaner.statistics().pressure_bytes == 90
    cleaner.note_released(10)
    cleaner.safe_point()
    stats = cleaner.statistics()
    assert len(calls) == 1 and stats.pressure_bytes == 0
    assert (stats.bytes_allocated, stats.bytes_released, stats.collections) == (60, 40, 1)


def test_a_warning_turned_error_in_a_task_goes_to_the_unraisable_hook(monkeypatch, caplog):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    cleaner, _ = make(CleanupStrategy.ON_SAFE_POINTS)
    ran = []

    def task():
        warn_from_finalizer("model 'm' was garbage-collected without dispose()")
        ran.append(1)

    cleaner.enqueue(task)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cleaner.run_pending()
    stats = cleaner.statistics()
    assert ran == [1] and (stats.tasks_run, stats.task_errors) == (1, 0)
    assert [type(r.exc_value) for r in reported] == [ResourceWarning]
    assert "'m' was garbage-collected" in str(reported[0].exc_value)
    assert "failed" not in caplog.text


def test_a_finalizer_warning_is_an_ordinary_warning_otherwise():
    with pytest.warns(ResourceWarning, match="without dispose"):
        warn_from_finalizer("without dispose")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warn_from_finalizer("without dispose")  # filtered out: nothing raised, nothing shown
