"""A failed swap loses nothing: the watched model serves what it served, under either policy.

A base path gets a new version directory that holds a broken model (a zip named
``model.keras`` that is no Keras archive). Under ``AVAILABILITY_PRESERVING`` the
old version never left; under ``RESOURCE_PRESERVING`` it was retired to make room
and comes back, with its labels, route and default. The warning says which.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.broken_versions import publish_broken
from support.models import constant_model, save
from support.waits import wait_until

import lifecycle as lc

X = np.ones((2, 3), "float32")
POLICIES = [lc.SwapPolicy.AVAILABILITY_PRESERVING, lc.SwapPolicy.RESOURCE_PRESERVING]


def answer(registry: lc.ModelRegistry, **kwargs: object) -> float:
    return float(registry.predict("m", X, **kwargs).numpy()[0, 0])


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "lifecycle.registry"]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """``m`` with version 1, answering 1.0."""
    root = tmp_path / "m"
    save(constant_model(1.0), root, 1)
    return root


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name.lower())
def test_a_broken_new_version_leaves_the_old_one_serving(base, policy, caplog):
    caplog.set_level(logging.WARNING, logger="lifecycle.registry")
    with lc.ModelRegistry(swap_policy=policy, lease_timeout=10) as registry:
        registry.watch("m", base)
        registry.set_label("m", "stable", 1)
        registry.route("m", {"stable": 1.0})
        publish_broken(base, 2)
        report = registry.scan("m")
        [(version, message)] = report.failed
        assert version == 2 and "LoadError" in message and "'m' version 2" in message
        assert (report.loaded, report.retired, report.default) == ((), (), 1)
        assert answer(registry) == 1.0 and answer(registry, label="stable") == 1.0
        [status] = registry.status("m")
        assert (status.version, status.state, status.default) == (1, lc.VersionState.READY, True)
        assert status.labels == ("stable",) and status.weight == 1.0
        [warning] = warnings_of(caplog)
        assert warning.startswith("'m' version 2 failed to load from ")
        assert "config.json" in warning and "tried again once its directory changes" in warning
        if policy is lc.SwapPolicy.RESOURCE_PRESERVING:
            assert report.restored == (1,)
            assert "; versions [1] were retired to make room and are loaded back;" in warning
        else:
            assert report.restored == ()
            assert "retired" not in warning
        assert warning.endswith(
            "'m' serves versions [1]. It is tried again once its directory changes."
        )
        assert "registry is unchanged" not in warning

        # Polling again changes nothing: the broken version is not tried, nothing retires.
        caplog.clear()
        served_by = registry.status("m")[0].requests
        report = registry.scan("m")
        assert (report.retired, report.restored, report.failed[0][0]) == ((), (), 2)
        assert registry.status("m")[0].requests == served_by  # the same version object
        assert warnings_of(caplog) == []

        # The fixed version takes over; the old one goes.
        shutil.rmtree(base / "2")
        save(constant_model(2.0), base, 2)
        registry.set_label("m", "stable", 1)  # still pinned: the scan unpins what it retires
        report = registry.scan("m")
        assert (report.loaded, report.retired, report.default) == ((2,), (1,), 2)
        assert answer(registry) == 2.0


def test_a_version_still_draining_is_made_routable_again(base, caplog):
    caplog.set_level(logging.WARNING, logger="lifecycle.registry")
    with lc.ModelRegistry(swap_policy=lc.SwapPolicy.RESOURCE_PRESERVING) as registry:
        registry.watch("m", base)
        publish_broken(base, 2)
        with registry.lease("m") as model:  # a request in flight on version 1
            report = registry.scan("m")
            assert report.restored == (1,)
            assert float(model(X).numpy()[0, 0]) == 1.0
        assert answer(registry) == 1.0
        # Taken back, not rebuilt: the same version, its requests counted on.
        assert registry.status("m")[0].requests == 2
        assert "were retired to make room and are loaded back" in warnings_of(caplog)[0]


def test_a_version_that_cannot_come_back_is_named(base, caplog):
    caplog.set_level(logging.WARNING, logger="lifecycle.registry")
    with lc.ModelRegistry(swap_policy=lc.SwapPolicy.RESOURCE_PRESERVING) as registry:
        registry.watch("m", base)
        (base / "1" / "model.keras").unlink()  # its source is gone
        publish_broken(base, 2)
        report = registry.scan("m")
        assert (report.restored, report.retired, report.default) == ((), (1,), None)
        assert registry.status() == ()
        [warning] = warnings_of(caplog)
        assert "versions [1] were retired to make room and could not be loaded back" in warning
        assert "so they no longer serve; 'm' serves nothing." in warning


def test_a_version_refused_for_room_is_not_tried_until_the_room_changes(base, caplog):
    caplog.set_level(logging.WARNING, logger="lifecycle.registry")
    # A load is checked against the archive's size first: twice version 1's.
    budget = 2 * (base / "1" / "model.keras").stat().st_size
    with lc.ModelRegistry(
        swap_policy=lc.SwapPolicy.RESOURCE_PRESERVING, memory_budget=budget
    ) as registry:
        registry.watch("m", base)
        save(constant_model(2.0, units=2048), base, 2)  # over the budget on its own
        report = registry.scan("m")
        assert report.restored == (1,) and "BudgetExceededError" in report.failed[0][1]
        assert answer(registry) == 1.0
        assert "or the registry's loaded versions change" in warnings_of(caplog)[0]
        report = registry.scan("m")  # nothing changed: no retire, no rebuild
        assert (report.retired, report.restored, report.loaded) == ((), (), ())
        registry.load("other", 1, lambda: constant_model(3.0))  # the loaded versions change
        report = registry.scan("m")
        assert report.restored == (1,) and "BudgetExceededError" in report.failed[0][1]
        assert answer(registry) == 1.0


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name.lower())
def test_polling_keeps_serving_through_a_broken_version(base, policy):
    with lc.ModelRegistry(swap_policy=policy, lease_timeout=10) as registry:
        registry.watch("m", base, poll_interval=0.05)
        publish_broken(base, 2)
        answers = []

        def failed_once() -> bool:
            answers.append(answer(registry))  # requests go on through the scans
            report = registry.last_scan("m")
            return bool(report.failed)

        wait_until(failed_once, "a poll that found version 2 broken")
        report = registry.last_scan("m")
        for _ in range(3):  # later polls: still version 1, nothing retired again
            wait_until(lambda r=report: registry.last_scan("m") is not r, "another poll")
            report = registry.last_scan("m")
            answers.append(answer(registry))
        assert set(answers) == {1.0}
        assert [s.version for s in registry.status("m")] == [1]
        assert (report.failed[0][0], report.retired, report.restored) == (2, (), ())


def test_requests_during_a_failed_resource_preserving_swap_wait_and_never_fail(tmp_path):
    def slow_factory():
        time.sleep(0.2)  # the gap lasts: requests arrive while nothing is routable
        return constant_model(0.0)

    def publish(version: int, value: float) -> str:
        with lc.LifecycleSession(name=f"publish-{version}"):
            model = lc.manage(constant_model(value))
            prefix = model.checkpoints(tmp_path / str(version)).save()
            model.dispose()
        return prefix

    publish(1, 1.0)
    with lc.ModelRegistry(
        swap_policy=lc.SwapPolicy.RESOURCE_PRESERVING, lease_timeout=30
    ) as registry:
        registry.watch("m", tmp_path, slow_factory)
        Path(publish(2, 2.0) + ".index").write_bytes(b"not an index")
        answers, errors, done = [], [], threading.Event()

        def client() -> None:
            while not done.is_set():
                try:
                    answers.append(answer(registry))
                except Exception as error:
                    errors.append(f"{type(error).__name__}: {error}")

        thread = threading.Thread(target=client)
        thread.start()
        try:
            wait_until(lambda: len(answers) > 10, "requests answered before the swap")
            report = registry.scan("m")
            count = len(answers)
            wait_until(lambda: len(answers) > count + 10, "requests answered after it")
        finally:
            done.set()
            thread.join(30)
        assert report.restored == (1,) and report.failed[0][0] == 2
        assert errors == [] and set(answers) == {1.0}
