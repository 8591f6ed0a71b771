"""The loader thread on its own: pure Python."""

from __future__ import annotations

import contextvars
import os
import sys
import threading

import pytest

from lifecycle._core import Loader, check_foreground_bytes, check_gil_share, check_nice

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


def python_work(calls: int = 20_000) -> int:
    def step(i: int) -> int:
        return i + 1

    total = 0
    for _ in range(calls):
        total = step(total)
    return total


# Linux clamps nice values at 19.
MAX_NICE = 19


def make(*, nice=None, gil_share=1.0, busy=lambda: True, foreground_bytes=0):
    return Loader("t", nice=nice, gil_share=gil_share, busy=busy, foreground_bytes=foreground_bytes)


def test_runs_on_its_own_thread_with_the_callers_context_and_returns_the_result():
    loader = make()
    token = VAR.set("caller")
    try:
        result = loader.run(lambda: (threading.current_thread().name, VAR.get()))
    finally:
        VAR.reset(token)
        loader.close()
    assert result == ("lifecycle-loader-t_0", "caller")


def test_reraises_the_callables_exception_and_keeps_working():
    loader = make()
    try:
        with pytest.raises(ZeroDivisionError):
            loader.run(lambda: 1 / 0)
        assert loader.run(lambda: 2) == 2
    finally:
        loader.close()


def test_a_call_from_the_loader_thread_runs_at_once():
    loader = make()
    try:
        assert loader.run(lambda: loader.run(lambda: "inner")) == "inner"
    finally:
        loader.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux-only")
def test_nice_lowers_only_the_loader_threads_priority():
    tid = threading.get_native_id
    mine = os.getpriority(os.PRIO_PROCESS, tid())
    if mine + 5 > MAX_NICE:
        pytest.skip(f"this thread runs at nice {mine}: no room to lower the loader's by 5")
    loader = make(nice=5)
    try:
        theirs = loader.run(lambda: os.getpriority(os.PRIO_PROCESS, tid()))
    finally:
        loader.close()
    assert theirs == mine + 5
    assert os.getpriority(os.PRIO_PROCESS, tid()) == mine


def test_paced_work_pauses_only_while_busy_and_restores_the_profile_hook():
    busy = threading.Event()
    loader = make(gil_share=0.5, busy=busy.is_set)
    try:
        assert loader.run(python_work) == 20_000
        assert loader.pauses == 0  # nothing in flight: no pauses
        busy.set()
        assert loader.run(python_work) == 20_000
        assert loader.pauses > 0
        # The hook is gone from the loader thread after a run.
        assert loader._executor.submit(sys.getprofile).result() is None
    finally:
        loader.close()


def test_a_users_profiler_of_the_loader_thread_is_replaced_during_paced_loads_only():
    seen: list[str] = []

    def profiler(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "step":
            seen.append(threading.current_thread().name)

    caller_profile = sys.getprofile()
    busy = threading.Event()
    busy.set()
    threading.setprofile(profiler)  # for threads started from now on: the loader's
    try:
        loader = make(gil_share=0.5, busy=busy.is_set)
        try:
            assert loader.run(python_work) == 20_000
            assert seen == [] and loader.pauses > 0  # the hook, not the profiler, ran
            # Put back after the load, on the loader thread only.
            assert loader._executor.submit(sys.getprofile).result() is profiler
            assert sys.getprofile() is caller_profile
            # Work that sets its own profile function is no longer paced.
            pauses = loader.pauses
            loader.run(lambda: (sys.setprofile(None), python_work()))
            assert loader.pauses == pauses
            assert loader._executor.submit(sys.getprofile).result() is profiler
        finally:
            loader.close()
    finally:
        threading.setprofile(None)


def test_full_gil_share_never_pauses():
    loader = make(gil_share=1.0)
    try:
        loader.run(python_work)
        assert loader.pauses == 0
    finally:
        loader.close()


@pytest.mark.parametrize("value", [0, 20, -3, True, 1.0, "5"])
def test_bad_nice_values_are_rejected(value):
    with pytest.raises(ValueError, match=f"Received: nice={value!r}"):
        check_nice(value, "nice")


@pytest.mark.parametrize("value", [0, -0.5, 1.5, float("nan"), True, "0.5", None])
def test_bad_gil_shares_are_rejected(value):
    with pytest.raises(ValueError, match="must be a number in"):
        check_gil_share(value, "share")


def test_small_work_runs_in_the_foreground_unpaced_and_large_or_unsized_work_in_the_background():
    busy = threading.Event()
    busy.set()  # requests in flight the whole time: background work pauses
    loader = make(gil_share=0.5, busy=busy.is_set, foreground_bytes=1000)

    def where() -> tuple[str, int]:
        pauses = loader.pauses
        python_work()
        return threading.current_thread().name, loader.pauses - pauses

    try:
        caller = threading.current_thread().name
        assert loader.in_foreground(1000) and not loader.in_foreground(1001)
        assert not loader.in_foreground(None)
        # At most foreground_bytes: on the calling thread, never paused.
        assert loader.run(where, nbytes=0) == (caller, 0)
        assert loader.run(where, nbytes=1000) == (caller, 0)
        assert loader.foreground_runs == 2
        # Larger, or of unknown size: on the loader thread, paced.
        thread, pauses = loader.run(where, nbytes=1001)
        assert thread.startswith("lifecycle-loader-t") and pauses > 0
        thread, pauses = loader.run(where)
        assert thread.startswith("lifecycle-loader-t") and pauses > 0
        assert loader.foreground_runs == 2
        # The calling thread's profile function was never touched.
        assert sys.getprofile() is None
    finally:
        loader.close()


def test_foreground_bytes_zero_keeps_every_call_on_the_loader_thread():
    loader = make(gil_share=0.5, foreground_bytes=0)
    try:
        assert not loader.in_foreground(0)
        assert loader.run(lambda: threading.current_thread().name, nbytes=0).startswith(
            "lifecycle-loader-t"
        )
        assert loader.foreground_runs == 0
    finally:
        loader.close()


@pytest.mark.parametrize("value", [-1, 1.5, True, "20", None])
def test_bad_foreground_bytes_are_rejected(value):
    with pytest.raises(
        ValueError, match=f"must be an int .a number of bytes. >= 0. Received: fg={value!r}"
    ):
        check_foreground_bytes(value, "fg")
