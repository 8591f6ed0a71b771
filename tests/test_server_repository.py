"""lifecycle.server's Triton/KServe model repository: ``<repository>/<model>/<version>/``.

The server runs on 127.0.0.1 and a free port over the models of a temporary
repository, and is spoken to with tritonclient's HTTP client (its defaults) and
plain HTTP, in each of Triton's model control modes: ``explicit``, ``poll`` and
``none``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

import httpx
import keras
import pytest
import tritonclient.http as triton
from support.broken_versions import publish_broken
from support.models import constant_model, model_repository, save
from support.servers import free_port, lifecycle_serve, rest_answer, running, stop
from support.waits import wait_until
from tritonclient.utils import InferenceServerException

import lifecycle as lc
from lifecycle.server import ServerConfig


def publish(model: keras.Model, repository: Path, name: str, version: int) -> None:
    """A new model, published whole: written aside under a dot-name, then renamed into place."""
    aside = repository / f".writing-{name}"
    save(model, aside, version)
    aside.rename(repository / name)


def index(url: str) -> dict[str, tuple[str, str]]:
    """``{name: (version, state)}`` of the repository index over plain HTTP."""
    rows = httpx.post(f"{url}/v2/repository/index", json={}, timeout=30).json()
    return {row["name"]: (row["version"], row["state"]) for row in rows}


def loaded(registry: lc.ModelRegistry) -> set[str]:
    """The models with a version in the registry."""
    return {status.name for status in registry.status()}


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """Models ``a`` (answers 1) and ``b`` (answers 2), and two entries that are no model."""
    return model_repository(tmp_path / "repository")


def test_explicit_mode_loads_and_unloads_models_by_name(repository):
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_repository=str(repository),
        model_control_mode="explicit",
    )
    with lc.ModelRegistry(name="explicit") as registry, running(registry, config) as url:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        try:
            # Nothing loads at start-up; the index lists every model of the repository.
            assert client.get_model_repository_index() == [
                {"name": "a", "version": "", "state": "UNAVAILABLE"},
                {"name": "b", "version": "", "state": "UNAVAILABLE"},
            ]
            assert client.is_server_ready() and not client.is_model_ready("a")
            client.load_model("a")
            assert client.is_model_ready("a")
            # The registry watches the repository: a load by name joins its models.
            assert registry.last_repository_scan(repository).models == ("a",)
            assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}
            assert index(url) == {"a": ("1", "READY"), "b": ("", "UNAVAILABLE")}
            client.load_model("b")
            assert rest_answer(url, "b") == {"predictions": [[2.0, 2.0]]}
            client.unload_model("a")
            wait_until(lambda: "a" not in loaded(registry), "a unloaded")
            with pytest.raises(lc.errors.UnknownModelError, match="'a' is not watched"):
                registry.last_scan("a")
            assert not client.is_model_ready("a")
            assert index(url) == {"a": ("", "UNAVAILABLE"), "b": ("1", "READY")}
            with pytest.raises(InferenceServerException, match="nor in its model repository"):
                client.load_model("nope")
            with pytest.raises(InferenceServerException, match="is not in the server's"):
                client.load_model(".hidden")
        finally:
            client.close()
        # The same over plain HTTP.
        assert httpx.post(f"{url}/v2/repository/models/a/load", json={}).status_code == 200
        assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}
        assert httpx.post(f"{url}/v2/repository/models/b/unload", json={}).status_code == 200
        wait_until(lambda: index(url)["b"] == ("", "UNAVAILABLE"), "b unloaded")
        unknown = httpx.post(f"{url}/v2/repository/models/nope/unload", json={})
        assert unknown.status_code == 404


def test_a_load_of_a_loaded_model_reads_it_again_and_swaps_to_its_newest_version(repository):
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_repository=str(repository),
        model_control_mode="explicit",
        load_model=["a"],  # loaded at start-up; b is not
    )
    with lc.ModelRegistry(name="reread") as registry, running(registry, config) as url:
        assert index(url) == {"a": ("1", "READY"), "b": ("", "UNAVAILABLE")}
        loaded_by = registry.last_scan("a")
        save(constant_model(5.0), repository / "a", 2)
        # Explicit mode neither polls nor listens for changes: no scan runs, and
        # version 1 serves until a load. An absence, so a bounded wait.
        time.sleep(0.5)
        assert registry.last_scan("a") is loaded_by
        assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}
        load = httpx.post(f"{url}/v2/repository/models/a/load", json={}, timeout=60)
        assert load.status_code == 200, load.text
        assert rest_answer(url, "a") == {"predictions": [[5.0, 5.0]]}
        wait_until(lambda: [s.version for s in registry.status("a")] == [2], "1 retired")


def test_poll_mode_loads_new_models_and_versions_and_unloads_removed_models(repository):
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_repository=str(repository),
        model_control_mode="poll",
        repository_poll_secs=0.1,
    )
    with lc.ModelRegistry(name="poll") as registry, running(registry, config) as url:
        assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}  # all loaded at start-up
        assert rest_answer(url, "b") == {"predictions": [[2.0, 2.0]]}
        # One poll loop, the registry's: a thread for the repository, none per model.
        threads = [t.name for t in threading.enumerate()]
        assert [t for t in threads if t.startswith("lifecycle-repository-")] == [
            "lifecycle-repository-repository",
            "lifecycle-repository-notify-repository",
        ]
        assert not [t for t in threads if t.startswith("lifecycle-watch-")]
        publish(constant_model(3.0), repository, "c", 1)
        wait_until(lambda: rest_answer(url, "c") == {"predictions": [[3.0, 3.0]]}, "c served")
        save(constant_model(5.0), repository / "a", 2)
        wait_until(lambda: rest_answer(url, "a") == {"predictions": [[5.0, 5.0]]}, "a's v2 served")
        shutil.rmtree(repository / "b")
        wait_until(lambda: "b" not in index(url), "b unloaded")
        wait_until(lambda: "b" not in loaded(registry), "b's versions disposed")
        # A model written in place (not renamed) is loaded once complete.
        save(constant_model(4.0), repository / "d", 1)
        wait_until(lambda: rest_answer(url, "d") == {"predictions": [[4.0, 4.0]]}, "d served")
        refused = httpx.post(f"{url}/v2/repository/models/a/unload", json={})
        assert refused.status_code == 503
        assert "--model_control_mode poll" in refused.json()["error"]


@pytest.mark.parametrize(
    "policy",
    [lc.SwapPolicy.AVAILABILITY_PRESERVING, lc.SwapPolicy.RESOURCE_PRESERVING],
    ids=lambda p: p.name.lower(),
)
def test_a_broken_new_version_in_poll_mode_leaves_the_old_one_serving(repository, policy, caplog):
    caplog.set_level(logging.WARNING, logger="lifecycle.registry")
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_repository=str(repository),
        model_control_mode="poll",
        repository_poll_secs=0.1,
    )
    with (
        lc.ModelRegistry(name="broken", swap_policy=policy, lease_timeout=10) as registry,
        running(registry, config) as url,
    ):
        assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}
        publish_broken(repository / "a", 2)

        def polled_and_answered() -> bool:
            assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}  # all along
            report = registry.last_scan("a")
            return report is not None and [v for v, _ in report.failed] == [2]

        wait_until(polled_and_answered, "a poll that found a's version 2 broken")
        assert index(url)["a"] == ("1", "READY")
        assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}
        warnings = [r.getMessage() for r in caplog.records if r.name == "lifecycle.registry"]
        assert len(warnings) == 1, warnings  # once, not at every poll
        assert warnings[0].startswith("'a' version 2 failed to load from ")
        assert warnings[0].endswith(
            "'a' serves versions [1]. It is tried again once its directory changes."
        )
        if policy is lc.SwapPolicy.RESOURCE_PRESERVING:
            assert "versions [1] were retired to make room and are loaded back" in warnings[0]


def test_an_explicit_load_of_a_broken_new_version_keeps_the_old_one_serving(repository):
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_repository=str(repository),
        model_control_mode="explicit",
        load_model=["a"],
    )
    with (
        lc.ModelRegistry(name="reread-broken") as registry,
        running(registry, config) as url,
    ):
        publish_broken(repository / "a", 2)
        load = httpx.post(f"{url}/v2/repository/models/a/load", json={}, timeout=60)
        assert load.status_code == 500, load.text  # a LoadError: INTERNAL
        assert "Loading 'a' version 2 failed" in load.json()["error"]
        assert index(url)["a"] == ("1", "READY")
        assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}


def test_none_mode_loads_every_model_and_refuses_repository_loads(repository):
    config = ServerConfig.from_flags(rest_api_port=free_port(), model_repository=str(repository))
    assert config.model_control_mode == "none"  # Triton's default
    with lc.ModelRegistry(name="none") as registry, running(registry, config) as url:
        assert index(url) == {"a": ("1", "READY"), "b": ("1", "READY")}
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        try:
            with pytest.raises(InferenceServerException, match="explicit model load / unload"):
                client.load_model("a")
            with pytest.raises(InferenceServerException, match="not allowed if polling"):
                client.unload_model("b")
        finally:
            client.close()
        refused = httpx.post(f"{url}/v2/repository/models/a/load", json={})
        assert refused.status_code == 503  # Triton's UNAVAILABLE
        assert "--model_control_mode none" in refused.json()["error"]
        assert "--model_control_mode explicit" in refused.json()["error"]
        assert [s.version for s in registry.status("a")] == [1]


def test_a_repository_beside_tensorflow_servings_flags(repository, tmp_path):
    save(constant_model(7.0), tmp_path / "risk", 1)
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_name="risk",
        model_base_path=str(tmp_path / "risk"),
        model_repository=str(repository),
        model_control_mode="explicit",
        load_model=["*"],
    )
    with lc.ModelRegistry(name="beside") as registry, running(registry, config) as url:
        assert rest_answer(url, "risk") == {"predictions": [[7.0, 7.0]]}
        assert rest_answer(url, "b") == {"predictions": [[2.0, 2.0]]}
        assert set(index(url)) == {"risk", "a", "b"}
    save(constant_model(7.0), repository / "risk", 1)
    with pytest.raises(ValueError, match=r"holds models named as models of .*\['risk'\]"):
        ServerConfig.from_flags(
            model_name="risk",
            model_base_path=str(tmp_path / "risk"),
            model_repository=str(repository),
        )


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        ({"model_control_mode": "explicit"}, "need --model_repository"),
        ({"repo": True, "load_model": ["a"]}, "--load_model takes effect only with"),
        ({"repo": True, "model_control_mode": "EXPLICIT", "load_model": ["*", "a"]}, "'*'"),
        ({"repo": True, "model_control_mode": "poll", "repository_poll_secs": 0}, "> 0"),
        ({"repo": True, "repository_poll_secs": -1}, "--repository_poll_secs must be"),
        ({"repo": True, "route": ["zzz=1:1"]}, "--route names models that are not served"),
    ],
)
def test_bad_repository_flags_are_refused_naming_the_flag(repository, flags, fragment):
    if flags.pop("repo", False):
        flags["model_repository"] = str(repository)
    with pytest.raises(ValueError) as caught:
        ServerConfig.from_flags(**flags)
    assert fragment in str(caught.value)


@pytest.mark.subprocess
def test_lifecycle_serve_with_tritons_repository_flags(repository):
    port = free_port()
    flags = ["--rest_api_port", str(port), "--port", "0", "--drain_seconds", "5"]
    flags += ["--model-repository", str(repository), "--model-control-mode", "EXPLICIT"]
    flags += ["--load-model", "b"]  # Triton's spellings of the flags work too
    with lifecycle_serve(*flags) as process:
        url = f"http://127.0.0.1:{port}"
        assert index(url) == {"a": ("", "UNAVAILABLE"), "b": ("1", "READY")}
        assert httpx.post(f"{url}/v2/repository/models/a/load", json={}).status_code == 200
        assert rest_answer(url, "a") == {"predictions": [[1.0, 1.0]]}
        output = stop(process)
    assert "Registry closed: 2 version(s) drained and disposed." in output
