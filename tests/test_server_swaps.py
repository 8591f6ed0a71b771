"""A new version of a small model takes traffic soon after its directory appears.

`lifecycle serve` loads in the background (a lower priority, paced while
requests are in flight) so that swaps do not disturb requests; a small
version loads in the foreground instead (``--loader_foreground_bytes``), so
that it is not held back for seconds. It also scans a polled base path as soon
as the operating system reports a change in it, so a new version does not wait
for the next poll. Clients keep sending through the swaps.
"""

from __future__ import annotations

import collections
import functools
import shutil
import threading
import time
from pathlib import Path

import httpx
import keras
import pytest
from support.broken_versions import publish_broken
from support.models import constant_model, save
from support.servers import free_port, lifecycle_serve, rest_answer, running, stop
from support.waits import wait_until
from typer.testing import CliRunner

import lifecycle as lc
import lifecycle.server
from lifecycle import cli
from lifecycle.server import ServerConfig

# Longer than WITHIN_SECONDS: only the change notification can find a new
# version in time, not the poll.
POLL_SECONDS = 30.0
CLIENTS = 4
# Generous for a loaded 2-core machine: a foreground load of this model takes
# ~0.1-0.5 s after the notification.
WITHIN_SECONDS = 5.0


def small_model() -> keras.Model:
    """About 1M parameters (4 MiB of weights, 8 MiB in its SavedModel): a small model."""
    x = keras.Input((256,), name="features")
    hidden = keras.layers.Dense(1024, activation="relu")(x)
    hidden = keras.layers.Dense(768, activation="relu")(hidden)
    return keras.Model(x, keras.layers.Dense(2)(hidden))


def publish(template: Path, base: Path, version: int) -> float:
    """Copy ``template`` aside and rename it into place as ``version``; when it appeared."""
    shutil.copytree(template, base / f".writing-{version}")
    (base / f".writing-{version}").rename(base / str(version))
    return time.monotonic()


@pytest.mark.parametrize("value", [-1, 1.5, True, "20"])
def test_a_bad_loader_foreground_bytes_is_refused_naming_the_flag(value):
    with pytest.raises(ValueError, match="--loader_foreground_bytes must be an integer >= 0"):
        ServerConfig(loader_foreground_bytes=value)


def test_the_server_loads_small_versions_in_the_foreground_by_default():
    assert ServerConfig().loader_foreground_bytes == 40 * 2**20


def test_the_command_passes_the_flag_to_the_server_and_refuses_a_bad_one(monkeypatch):
    served: list[ServerConfig] = []
    monkeypatch.setattr(lifecycle.server, "serve", served.append)
    app, runner = cli.build_app(), CliRunner()
    result = runner.invoke(app, ["serve", "--port", "0", "--loader_foreground_bytes", "0"])
    assert result.exit_code == 0, result.output
    assert [config.loader_foreground_bytes for config in served] == [0]
    result = runner.invoke(app, ["serve", "--port", "0", "--loader_foreground_bytes", "-1"])
    assert result.exit_code == 2
    assert "--loader_foreground_bytes must be an integer >= 0" in result.output


@pytest.mark.subprocess
def test_a_new_version_of_a_small_model_answers_soon_after_its_directory_appears(tmp_path):
    template, base = tmp_path / "template", tmp_path / "m"
    small_model().export(str(template), verbose=False)
    base.mkdir()
    publish(template, base, 1)
    port = free_port()
    flags = [
        *("--rest_api_port", str(port), "--port", "0", "--model_name", "m"),
        *("--model_base_path", str(base), "--drain_seconds", "5"),
        *("--file_system_poll_wait_seconds", str(POLL_SECONDS)),
    ]
    first_answer: dict[int, float] = {}
    answers: collections.Counter[int] = collections.Counter()
    failures: list[str] = []
    done = threading.Event()
    body = {
        "inputs": [{"name": "features", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}]
    }

    def client() -> None:
        """Sends KServe v2 infer back to back; its answers name their version."""
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            while not done.is_set():
                try:
                    response = http.post("/v2/models/m/infer", json=body)
                    if response.status_code != 200:
                        raise AssertionError(response.text)
                    version = int(response.json()["model_version"])
                except Exception as error:
                    failures.append(f"{type(error).__name__}: {error}")
                    continue
                first_answer.setdefault(version, time.monotonic())
                answers[version] += 1

    def settled(version: int) -> bool:
        """``version`` alone is loaded and has answered the clients a while."""
        assert failures == [], failures[:5]
        status = httpx.get(f"http://127.0.0.1:{port}/v1/models/m", timeout=30).json()
        alone = [s["version"] for s in status["model_version_status"]] == [str(version)]
        return alone and answers[version] >= 20

    moved: list[float] = []
    with lifecycle_serve(*flags) as process:
        threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        try:
            for version in (2, 3):
                wait_until(
                    functools.partial(settled, version - 1),
                    f"version {version - 1} alone serving, answering the clients",
                )
                appeared = publish(template, base, version)
                wait_until(lambda v=version: v in first_answer, f"version {version} answered")
                moved.append(first_answer[version] - appeared)
        finally:
            done.set()
            for thread in threads:
                thread.join(timeout=60)
        output = stop(process)

    print(f"directory appeared -> first answer: {', '.join(f'{s:.2f} s' for s in moved)}")
    assert failures == [], failures[:5]
    assert max(moved) <= WITHIN_SECONDS, moved
    assert "Registry closed: 1 version(s) drained and disposed." in output


@pytest.mark.parametrize(
    "policy",
    [lc.SwapPolicy.AVAILABILITY_PRESERVING, lc.SwapPolicy.RESOURCE_PRESERVING],
    ids=lambda p: p.name.lower(),
)
def test_reading_a_configured_model_again_past_a_broken_version_keeps_it_serving(tmp_path, policy):
    save(constant_model(1.0), tmp_path / "m", 1)
    config = ServerConfig.from_flags(
        rest_api_port=free_port(), model_name="m", model_base_path=str(tmp_path / "m")
    )
    with (
        lc.ModelRegistry(name="reread", swap_policy=policy) as registry,
        running(registry, config) as url,
    ):
        publish_broken(tmp_path / "m", 2)
        # A load of a configured model reads its base path again: version 2 fails.
        load = httpx.post(f"{url}/v2/repository/models/m/load", json={}, timeout=60)
        assert load.status_code == 200, load.text  # version 1 serves: not an error
        assert rest_answer(url, "m") == {"predictions": [[1.0, 1.0]]}
        assert [(s.version, s.state) for s in registry.status("m")] == [(1, lc.VersionState.READY)]
        [(version, message)] = registry.last_scan("m").failed
        assert version == 2 and "config.json" in message
