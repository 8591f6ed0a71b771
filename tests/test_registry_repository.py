"""ModelRegistry.watch_repository: a model repository, ``<repository>/<model>/<version>/``.

Each directory of a temporary repository is a model; the registry watches
them all (or the ones named), and each scan makes models join, swap and leave.
Most tests scan by hand (``scan_repository``) so that each step is one scan;
one test polls.
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
from support.models import constant_model, model_repository, save
from support.waits import wait_until

import lifecycle as lc
from lifecycle.errors import CheckpointError, UnknownModelError

X = np.ones((2, 3), "float32")


def answer(registry: lc.ModelRegistry, name: str) -> float:
    return float(registry.predict(name, X).numpy()[0, 0])


def served(registry: lc.ModelRegistry) -> dict[str, list[int]]:
    """``{model: [versions]}`` of every loaded version."""
    versions: dict[str, list[int]] = {}
    for status in registry.status():
        versions.setdefault(status.name, []).append(status.version)
    return versions


def publish(value: float, repository: Path, name: str, version: int = 1) -> None:
    """A new model, published whole: written aside under a dot-name, then renamed into place."""
    aside = repository / f".writing-{name}"
    save(constant_model(value), aside, version)
    aside.rename(repository / name)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """Models ``a`` (answers 1) and ``b`` (answers 2), and two entries that are no model."""
    return model_repository(tmp_path / "repository")


def test_models_join_swap_and_leave_with_each_scan(repository):
    with lc.ModelRegistry(name="repository") as registry:
        report = registry.watch_repository(repository)
        assert report.path == str(repository) and report.models == ("a", "b")
        assert report.joined == ("a", "b") and report.left == ()
        assert [(r.name, r.loaded) for r in report.scans] == [("a", (1,)), ("b", (1,))]
        assert served(registry) == {"a": [1], "b": [1]}
        assert (answer(registry, "a"), answer(registry, "b")) == (1.0, 2.0)
        assert registry.last_scan("a") is report.scan("a")  # each model is a watch

        publish(3.0, repository, "c")
        save(constant_model(5.0), repository / "a", 2)
        registry.set_label("b", "stable", 1)
        shutil.rmtree(repository / "b")
        report = registry.scan_repository(repository)
        assert (report.joined, report.left, report.models) == (("c",), ("b",), ("a", "c"))
        assert (report.scan("a").loaded, report.scan("a").retired) == ((2,), (1,))
        assert report.scan("b") is None
        wait_until(lambda: served(registry) == {"a": [2], "c": [1]}, "a swapped, b retired")
        assert (answer(registry, "a"), answer(registry, "c")) == (5.0, 3.0)
        with pytest.raises(UnknownModelError, match="'b' is not watched"):
            registry.last_scan("b")
        assert registry.last_repository_scan(repository) is report
        assert registry.statistics().watched == 2


def test_a_broken_version_is_remembered_until_its_directory_changes(repository, caplog):
    caplog.set_level(logging.WARNING, logger="lifecycle.registry")
    with lc.ModelRegistry(name="broken", lease_timeout=10) as registry:
        registry.watch_repository(repository)
        publish_broken(repository / "a", 2)
        for _ in range(3):  # tried once, then remembered
            [(version, message)] = registry.scan_repository(repository).scan("a").failed
            assert version == 2 and "LoadError" in message
            assert answer(registry, "a") == 1.0
        warnings = [r.getMessage() for r in caplog.records if r.name == "lifecycle.registry"]
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith("'a' version 2 failed to load from ")
        assert (
            "'a' serves versions [1]. It is tried again once its directory changes."
            in (warnings[0])
        )
        shutil.rmtree(repository / "a" / "2")
        save(constant_model(6.0), repository / "a", 2)
        report = registry.scan_repository(repository).scan("a")
        assert (report.loaded, report.failed, report.default) == ((2,), (), 2)
        assert answer(registry, "a") == 6.0


def test_named_models_load_by_name_and_unwatch_leaves_them_alone(repository):
    with lc.ModelRegistry(name="explicit") as registry:
        report = registry.watch_repository(repository, models=["a"])  # Triton's explicit mode
        assert report.models == ("a",) and served(registry) == {"a": [1]}
        publish(3.0, repository, "c")
        assert registry.scan_repository(repository).models == ("a",)  # c is not named
        report = registry.scan_repository(repository, models=["c"])
        assert report.joined == ("c",) and answer(registry, "c") == 3.0

        registry.unwatch("a", retire=True)  # Triton's unload
        wait_until(lambda: "a" not in served(registry), "a's versions retired")
        assert registry.scan_repository(repository).models == ("c",)  # not brought back
        assert "a" not in served(registry)

        with pytest.raises(UnknownModelError, match=r"No model directory \['nope'\]") as caught:
            registry.scan_repository(repository, models=["nope"])
        assert "Its models: ['a', 'b', 'c']" in str(caught.value)


def test_an_unwatched_model_keeps_its_versions_until_named_again(repository):
    with lc.ModelRegistry(name="unwatched") as registry:
        registry.watch_repository(repository)
        registry.unwatch("b")  # its versions stay loaded; scans leave it alone
        save(constant_model(7.0), repository / "b", 2)
        assert registry.scan_repository(repository).models == ("a",)
        assert served(registry)["b"] == [1]
        # Named again: watched afresh, it swaps to its newest version and
        # retires the one its earlier watch loaded.
        report = registry.scan_repository(repository, models=["b"])
        assert (report.scan("b").loaded, report.scan("b").retired) == ((2,), (1,))
        wait_until(lambda: served(registry)["b"] == [2], "b's version 1 retired")
        assert answer(registry, "b") == 7.0


def test_a_name_watched_from_another_base_path_is_skipped(repository, tmp_path):
    save(constant_model(8.0), tmp_path / "elsewhere", 1)
    with lc.ModelRegistry(name="skipped") as registry:
        registry.watch("a", tmp_path / "elsewhere")
        report = registry.watch_repository(repository)
        assert (report.models, report.skipped) == (("b",), ("a",))
        assert answer(registry, "a") == 8.0


def test_polling_finds_new_models_until_unwatch_repository(repository):
    with lc.ModelRegistry(name="polled") as registry:
        registry.watch_repository(repository, poll_interval=0.05)
        publish(3.0, repository, "c")
        wait_until(lambda: "c" in served(registry), "c loaded by a poll")
        shutil.rmtree(repository / "a")
        wait_until(lambda: "a" not in served(registry), "a retired by a poll")
        threads = {t.name for t in threading.enumerate()}
        assert sum(name.startswith("lifecycle-repository-") for name in threads) == 1
        assert not any(name.startswith("lifecycle-watch-") for name in threads)

        registry.unwatch_repository(repository)
        assert registry.statistics().watched == 0
        publish(4.0, repository, "d")
        time.sleep(0.3)  # an absence: six poll intervals, bounded
        assert sorted(served(registry)) == ["b", "c"]  # loaded versions stay
        with pytest.raises(UnknownModelError, match="is not watched"):
            registry.last_repository_scan(repository)


def test_unwatch_repository_with_retire_retires_every_model(repository):
    with lc.ModelRegistry(name="retired") as registry:
        registry.watch_repository(repository)
        registry.unwatch_repository(repository, retire=True)
        wait_until(lambda: served(registry) == {}, "every version retired")


def test_bad_repositories_and_arguments_are_refused(repository, tmp_path):
    with lc.ModelRegistry(name="bad") as registry:
        with pytest.raises(CheckpointError, match="does not exist or is not a directory"):
            registry.watch_repository(tmp_path / "nowhere")
        with pytest.raises(TypeError, match=r"not one string.*pass \['a'\]"):
            registry.watch_repository(repository, models="a")
        with pytest.raises(UnknownModelError, match=r"No model directory \['nope'\]"):
            registry.watch_repository(repository, models=["a", "nope"])
        assert registry.statistics().watched == 0 and served(registry) == {}
        with pytest.raises(ValueError, match="poll_interval"):
            registry.watch_repository(repository, poll_interval=0)
        registry.watch_repository(repository, models=[])
        with pytest.raises(ValueError, match="is watched already; unwatch_repository"):
            registry.watch_repository(repository)
        with pytest.raises(UnknownModelError, match="is not watched"):
            registry.scan_repository(tmp_path)
