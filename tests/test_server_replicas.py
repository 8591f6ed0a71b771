"""A deployment: several `lifecycle serve` replicas watching one base path.

A training job publishes a new version directory (written aside, renamed into
place); every replica's polling picks it up within two poll intervals, while
clients keep calling every replica and no request fails.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from support.models import constant_model, save
from support.servers import free_port, lifecycle_serve, stop
from support.waits import wait_until

POLL_SECONDS = 2.0


def test_two_replicas_move_to_a_new_version_within_two_polls_without_a_failed_request(tmp_path):
    save(constant_model(1.0), tmp_path / "m", 1)
    ports = [free_port(), free_port()]
    flags = [
        [
            *("--rest_api_port", str(port), "--port", "0", "--model_name", "m"),
            *("--model_base_path", str(tmp_path / "m")),
            *("--file_system_poll_wait_seconds", str(POLL_SECONDS), "--drain_seconds", "5"),
        ]
        for port in ports
    ]
    flags[0].append("--access_log")  # and a line per request, read while it serves
    answers: dict[int, list[tuple[float, float]]] = {port: [] for port in ports}
    failures: list[str] = []
    done = threading.Event()

    def client(port: int) -> None:
        """Calls one replica back to back: (time, answer) of each request."""
        body = {"instances": [[0.0, 0.0, 0.0]]}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            while not done.is_set():
                try:
                    response = http.post("/v1/models/m:predict", json=body)
                    value = response.json()["predictions"][0][0]
                    if response.status_code != 200:
                        raise AssertionError(response.text)
                except Exception as error:
                    failures.append(f"{port}: {type(error).__name__}: {error}")
                    continue
                answers[port].append((time.monotonic(), value))

    def every_replica(check=lambda port: True) -> bool:
        """Each replica answered and ``check(port)`` holds; a failed request fails at once."""
        assert failures == [], failures[:5]
        return all(answers[port] and check(port) for port in ports)

    with lifecycle_serve(*flags[0]) as first, lifecycle_serve(*flags[1]) as second:
        threads = [threading.Thread(target=client, args=(port,)) for port in ports]
        for thread in threads:
            thread.start()
        try:
            wait_until(every_replica, "both replicas answered (version 1)")
            save(constant_model(2.0), tmp_path / "m", 2)
            published = time.monotonic()
            wait_until(
                lambda: every_replica(lambda port: answers[port][-1][1] == 2.0),
                "both replicas answered with version 2",
            )
            swapped = {port: len(answers[port]) for port in ports}
            wait_until(
                lambda: every_replica(lambda port: len(answers[port]) >= swapped[port] + 10),
                "10 more requests to each replica after the swap",
            )
        finally:
            done.set()
            for thread in threads:
                thread.join(timeout=60)
        outputs = [stop(first), stop(second)]

    assert failures == [], failures[:5]
    for port in ports:
        values = [value for _, value in answers[port]]
        assert values[0] == 1.0 and values[-1] == 2.0, (port, values[:3], values[-3:])
        first_new = next(at for at, value in answers[port] if value == 2.0)
        # Never back to version 1 once version 2 answered.
        assert set(v for at, v in answers[port] if at >= first_new) == {2.0}
        moved = first_new - published
        print(f"replica {port}: moved after {moved:.2f} s, {len(values)} requests")
        assert moved <= 2 * POLL_SECONDS, f"replica {port} moved after {moved:.2f} s"
    for output in outputs:
        assert "Registry closed: 1 version(s) drained and disposed." in output
    logged = outputs[0].count('"POST /v1/models/m:predict HTTP/1.1" 200')
    assert logged == len(answers[ports[0]]), (logged, len(answers[ports[0]]))
    assert '"POST /v1/models' not in outputs[1]


# Over 10 s; test_server_swaps.py runs a `lifecycle serve` child taking a new
# version under traffic in the fast lane.
pytestmark = [pytest.mark.subprocess, pytest.mark.slow]
