"""The cleaner on its own: pure Python, with an injected collector."""

from __future__ import annotations

import sys
import threading
import time
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


def test_pressure_counts_what_superseded_undisposed_owners_allocated():
    cleaner, calls = make(CleanupStrategy.ON_SAFE_POINTS, threshold=100)
    first, second = object(), object()
    cleaner.note_allocated(60, first)
    cleaner.note_allocated(50, first)  # still the owner in use: no pressure
    cleaner.note_released(500)  # released bytes are free: never pressure
    cleaner.safe_point()
    assert calls == [] and cleaner.statistics().pressure_bytes == 0
    cleaner.note_allocated(10, second)  # first may have been dropped now
    assert cleaner.statistics().pressure_bytes == 110
    cleaner.safe_point()
    stats = cleaner.statistics()
    assert len(calls) == 1 and stats.pressure_bytes == 0
    assert (stats.bytes_allocated, stats.bytes_released, stats.collections) == (120, 500, 1)
    cleaner.note_allocated(200, first)  # after the collection, counted afresh
    assert cleaner.statistics().pressure_bytes == 0  # first is the owner in use again


def test_a_disposed_owner_leaves_nothing_to_collect():
    cleaner, calls = make(CleanupStrategy.ON_SAFE_POINTS, threshold=100)
    first, second = object(), object()
    cleaner.note_allocated(150, first)
    cleaner.note_disposed(first)
    cleaner.note_allocated(150, second)
    cleaner.note_disposed(second)
    cleaner.note_allocated(1, object())
    cleaner.safe_point()
    assert calls == [] and cleaner.statistics().pressure_bytes == 0
    cleaner.note_allocated(100)  # bytes of no owner: pressure at once
    cleaner.safe_point()
    assert len(calls) == 1


def test_garbage_is_pressure_but_not_allocated_bytes_and_follows_the_successor():
    cleaner, calls = make(CleanupStrategy.ON_SAFE_POINTS, threshold=100)
    cleaner.note_garbage(60)  # a disposed model's step functions, say
    cleaner.note_garbage(0)
    stats = cleaner.statistics()
    assert (stats.pressure_bytes, stats.bytes_allocated) == (60, 0)
    cleaner.note_garbage(40)
    cleaner.safe_point()
    assert len(calls) == 1 and cleaner.statistics().pressure_bytes == 0
    successor, later = make(CleanupStrategy.ON_SAFE_POINTS, threshold=100)
    cleaner.close(successor)
    cleaner.note_garbage(150)  # a version's SavedModel copy, after its session closed
    assert successor.statistics().pressure_bytes == 150
    successor.safe_point()
    assert len(later) == 1


def test_background_collects_when_a_superseded_owner_passes_the_threshold():
    cleaner, calls = make(CleanupStrategy.IN_BACKGROUND, threshold=100)
    first, second = object(), object()
    cleaner.note_allocated(100, first)
    assert cleaner.wait_idle(10) and calls == []
    cleaner.note_allocated(1, second)
    assert cleaner.wait_idle(10) and calls == ["lifecycle-cleaner-t"]
    stats = cleaner.statistics()
    assert stats.blocking_seconds >= stats.collection_seconds > 0
    cleaner.close(collect=False)


def test_pending_bytes_pass_to_the_successor_at_close():
    successor, calls = make(CleanupStrategy.ON_SAFE_POINTS, threshold=100)
    cleaner, own = make(CleanupStrategy.ON_SESSION_CLOSE, threshold=100)
    first, second = object(), object()
    cleaner.note_allocated(100, first)
    cleaner.close(successor, collect=False)
    cleaner.note_allocated(1, second)  # goes to the successor, as work does
    successor.safe_point()
    assert own == [] and len(calls) == 1


def trimming(strategy, trim_threshold, pressure_threshold=None):
    trims = []
    cleaner = Cleaner(
        strategy=strategy,
        name="t",
        pressure_threshold=pressure_threshold,
        collector=lambda: trims.append("collect"),
        trim_threshold=trim_threshold,
        trimmer=lambda: trims.append(threading.current_thread().name) or True,
    )
    return cleaner, trims


def test_background_trims_on_its_thread_once_enough_bytes_were_released():
    cleaner, trims = trimming(CleanupStrategy.IN_BACKGROUND, trim_threshold=100)
    cleaner.note_released(60)
    assert cleaner.wait_idle(10) and trims == []
    cleaner.note_released(40)  # 100 since the last trim
    assert cleaner.wait_idle(10) and trims == ["lifecycle-cleaner-t"]
    cleaner.note_released(99)  # counted from the trim on
    assert cleaner.wait_idle(10) and len(trims) == 1
    stats = cleaner.statistics()
    assert (stats.trims, stats.trim_threshold, stats.collections) == (1, 100, 0)
    assert stats.trim_seconds >= stats.max_trim_seconds > 0
    cleaner.close(collect=False)


def test_no_trim_when_turned_off_and_a_collection_trims_when_on():
    off, off_calls = trimming(CleanupStrategy.ON_SAFE_POINTS, None, pressure_threshold=10)
    off.note_allocated(2**40)
    off.safe_point()
    assert off_calls == ["collect"] and off.statistics().trims == 0
    on, on_calls = trimming(CleanupStrategy.ON_SAFE_POINTS, 2**40, pressure_threshold=10)
    on.note_allocated(20)  # a collection, no trim's worth of bytes released
    on.safe_point()
    assert on_calls == ["collect", "MainThread"] and on.statistics().trims == 1


@pytest.mark.parametrize(
    "strategy", [CleanupStrategy.ON_SAFE_POINTS, CleanupStrategy.ON_SESSION_CLOSE]
)
def test_a_trim_waits_for_the_strategy(strategy):
    cleaner, trims = trimming(strategy, trim_threshold=10)
    cleaner.note_released(10)
    assert trims == [] and cleaner.wait_idle(0) is False
    cleaner.safe_point()
    assert trims == (["MainThread"] if strategy is CleanupStrategy.ON_SAFE_POINTS else [])
    cleaner.close(collect=False)
    assert trims == ["MainThread"]  # at the latest when the cleaner closes


def test_released_bytes_not_yet_trimmed_pass_to_the_successor():
    successor, trims = trimming(CleanupStrategy.ON_SAFE_POINTS, trim_threshold=100)
    cleaner, own = trimming(CleanupStrategy.ON_SESSION_CLOSE, trim_threshold=100)
    cleaner.note_released(60)
    cleaner.close(successor, collect=False)
    successor.note_released(40)
    successor.safe_point()
    assert own == [] and trims == ["MainThread"]


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


# --- a dropped owner is looked for at the strategy's moment ---------------------------


def test_an_explicit_safe_point_collects_for_an_undisposed_owner_even_the_newest():
    cleaner, calls = make(CleanupStrategy.ON_SAFE_POINTS, threshold=None)
    cleaner.note_allocated(10, owner="model")  # the newest: no pressure
    cleaner.safe_point()  # implicit (a model's call): nothing
    assert calls == []
    cleaner.safe_point(explicit=True)  # the program's own: it may have been dropped
    assert calls == ["MainThread"]
    cleaner.safe_point(explicit=True)  # nothing allocated since: nothing to find
    assert calls == ["MainThread"]


def test_an_explicit_safe_point_leaves_a_disposed_owners_garbage_to_pressure():
    cleaner, calls = make(CleanupStrategy.ON_SAFE_POINTS, threshold=100)
    cleaner.note_allocated(10, owner="model")
    cleaner.note_disposed("model")
    cleaner.note_garbage(50)  # its step functions: below the threshold
    cleaner.safe_point(explicit=True)
    assert calls == []


def test_background_collects_once_after_an_idle_spell_for_an_undisposed_owner():
    calls = []
    cleaner = Cleaner(
        strategy=CleanupStrategy.IN_BACKGROUND,
        name="idle",
        pressure_threshold=None,
        collector=lambda: calls.append(threading.current_thread().name),
        idle_collection=0.2,
    )
    cleaner.note_allocated(10, owner="model")
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == ["lifecycle-cleaner-idle"]
    # Nothing allocated since: no further collection however long it waits.
    time.sleep(0.5)
    assert len(calls) == 1 and cleaner.statistics().collections == 1
    cleaner.note_allocated(10, owner="other")
    cleaner.note_disposed("other")  # disposed before the spell ended: nothing to find
    time.sleep(0.5)
    assert len(calls) == 1
    cleaner.close(collect=False)


def test_no_idle_collection_while_an_owner_is_in_use():
    calls, busy = [], [True]
    cleaner = Cleaner(
        strategy=CleanupStrategy.IN_BACKGROUND,
        name="busy",
        pressure_threshold=None,
        collector=lambda: calls.append(1),
        idle_collection=0.1,
        busy=lambda: busy[0],
    )
    cleaner.note_allocated(10, owner="model")  # then a long fit: in use
    time.sleep(0.5)  # several idle spells went by
    assert calls == []
    busy[0] = False  # the call returned: the next spell collects
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [1]
    cleaner.close(collect=False)


def test_close_trims_what_its_owner_released_without_a_collection():
    trims = []
    cleaner = Cleaner(
        strategy=CleanupStrategy.ON_SESSION_CLOSE,
        name="t",
        pressure_threshold=None,
        trim_threshold=2**30,
        trimmer=lambda: trims.append(1) or True,
    )
    cleaner.close(collect=False, trim=True)
    assert trims == [1] and cleaner.statistics().collections == 0
