"""The loader thread on its own: pure Python."""

from __future__ import annotations

import contextvars
import os
import sys
import threading

import pytest

from lifecycle._core import Loader, check_gil_share, check_nice

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


def make(*, nice=None, gil_share=1.0, busy=lambda: True):
    return Loader("t", nice=nice, gil_share=gil_share, busy=busy)


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
