"""Load: request threads in this process; on servers, Locust clients and swaps.

:class:`RequestThreads` call a function back to back from threads, each call
timed and tagged with the phase it started in (closed-loop load in one
process); :class:`RssSampler` samples this process's RSS meanwhile.

:func:`run_load` is what the server benchmarks share: a child process
(``python -m _harness.load SPEC``) runs ``clients`` Locust ``FastHttpUser``s
without wait against one server or several in turns, each given ``slices`` turns
of its share of ``warmup`` unmeasured and ``seconds`` measured seconds, the order
reversed every other turn. The child prints ``MEASURING i`` / ``MEASURED i``
when server i's measured slice opens and closes; the parent reads the server's
counters (CPU seconds, by default) at each mark, and a :class:`Swapper` swaps
models while the slices are open. A request counts for the server it went to:
measured if answered within its slices, failed if it raises, is not answered
200 (warm-ups too), or is unanswered at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import BENCHMARKS
from .servers import Server, stream_child
from .stats import percentiles

MEASURING, MEASURED = "MEASURING", "MEASURED"
STOP_TIMEOUT = 10.0  # clients finishing their request in flight
ERRORS_KEPT = 5
SWAP_TIMEOUT = 120.0
STATUS_POLL = 0.1
RSS_SETTLE = 0.5  # after a swap, before the server's RSS is read
JOIN_TIMEOUT = 60.0  # request threads finishing their call in flight


def latency_ms(times: Sequence[float]) -> dict[str, float | None]:
    p50, p99, p999 = percentiles(times, 50, 99, 99.9)
    return {"p50_ms": p50, "p99_ms": p99, "p999_ms": p999}


# ------------------------------------------------------------------- the child


def locust(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The child: Locust users against ``spec["urls"]`` in turns; a result per server."""
    import gevent
    from locust import FastHttpUser, constant, task
    from locust.env import Environment

    urls, path, body = spec["urls"], spec["path"], spec["body"].encode()
    headers = {"Content-Type": "application/json"}
    target, measuring = [0], [None]
    times: list[list[float]] = [[] for _ in urls]
    errors: list[list[str]] = [[] for _ in urls]
    sent, answered, failed = [0] * len(urls), [0] * len(urls), [0] * len(urls)
    seconds, cpu = [0.0] * len(urls), [0.0] * len(urls)

    class Client(FastHttpUser):
        host = urls[0]
        wait_time = constant(0)

        @task
        def predict(self) -> None:
            index = target[0]
            sent[index] += 1
            self.client.post(urls[index] + path, data=body, headers=headers, name=str(index))

    def on_request(name: str, response_time: float, response: Any, exception: Any, **_: Any):
        index = int(name)
        answered[index] += 1
        status = getattr(response, "status_code", None)
        if exception is not None or status != 200:
            failed[index] += 1
            if len(errors[index]) < ERRORS_KEPT:
                errors[index].append(f"status {status}: {exception!r}"[:300])
        elif measuring[0] == index:
            times[index].append(response_time)

    environment = Environment(user_classes=[Client], stop_timeout=STOP_TIMEOUT)
    environment.events.request.add_listener(on_request)
    runner = environment.create_local_runner()
    runner.start(spec["clients"], spawn_rate=max(spec["clients"], 100))
    order, slices = list(range(len(urls))), spec["slices"]
    for turn in range(slices):
        for index in order if turn % 2 == 0 else order[::-1]:
            target[0] = index
            gevent.sleep(spec["warmup"] / slices)
            print(f"{MEASURING} {index}", flush=True)
            started, cpu_started = time.perf_counter(), time.process_time()
            measuring[0] = index
            gevent.sleep(spec["seconds"] / slices)
            measuring[0] = None
            seconds[index] += time.perf_counter() - started
            cpu[index] += time.process_time() - cpu_started
            print(f"{MEASURED} {index}", flush=True)
    runner.stop()  # each client finishes its request in flight (stop_timeout)
    runner.quit()
    results = []
    for index in order:
        if sent[index] > answered[index]:
            failed[index] += sent[index] - answered[index]
            errors[index].append(f"{sent[index] - answered[index]} request(s) unanswered")
        results.append(
            {
                "requests": len(times[index]),
                "requests_per_second": len(times[index]) / seconds[index],
                **latency_ms(times[index]),
                "failed": failed[index],
                "errors": errors[index],
                "load_cpu_percent": 100 * cpu[index] / seconds[index],
                "load_cpu_warning": bool(runner.cpu_warning_emitted),
            }
        )
    return results


# ------------------------------------------------------------------ the parent


class RequestThreads:
    """``count`` threads calling ``serve(phase)`` back to back until stopped.

    Every call is counted; while ``recording`` is set when it starts it is also
    recorded: (start ns, latency ns, ``phase`` at its start). Every exception
    counts as a failed request of that phase, and the thread goes on.
    """

    def __init__(self, serve: Callable[[int], object], count: int) -> None:
        self.serve = serve
        self.recording = False
        self.phase = 0
        self.records: list[list[tuple[int, int, int]]] = [[] for _ in range(count)]
        self.requests = [0] * count
        self.failed: list[list[int]] = [[] for _ in range(count)]  # phases of failures
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"request-{i}", daemon=True)
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            raise RuntimeError(f"request threads still busy after {JOIN_TIMEOUT:g} s: {stuck}")

    def recorded(self) -> list[tuple[int, int, int]]:
        return [record for mine in self.records for record in mine]

    def _run(self, index: int) -> None:
        serve, clock, records = self.serve, time.perf_counter_ns, self.records[index]
        while not self._stop.is_set():
            recording, phase = self.recording, self.phase
            started = clock()
            try:
                serve(phase)
            except Exception as error:
                self.failed[index].append(phase)
                if len(self.errors) < ERRORS_KEPT:
                    self.errors.append(f"{type(error).__name__}: {error}"[:300])
            self.requests[index] += 1
            if recording:
                records.append((started, clock() - started, phase))


class RssSampler(threading.Thread):
    """Samples the process's RSS every 2 ms: (perf_counter seconds, bytes)."""

    def __init__(self) -> None:
        import psutil

        super().__init__(name="rss-sampler", daemon=True)
        self.memory_info = psutil.Process().memory_info
        self.samples: list[tuple[float, int]] = []
        self.stopping = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stopping.wait(0.002):
            self.samples.append((time.perf_counter(), self.memory_info().rss))

    def window(self, start: float, end: float) -> list[int]:
        return [rss for at, rss in list(self.samples) if start <= at < end]


# ------------------------------------------------------------ load on servers


@dataclass
class Swapper:
    """Runs ``swap()`` back to back, ``every`` s apart at least, while a window is open.

    Each swap is recorded as (seconds, finished inside the window, server RSS
    :data:`RSS_SETTLE` s after it, or None without ``server``).
    """

    swap: Callable[[], None]
    every: float
    server: Server | None = None
    swaps: list[tuple[float, bool, int | None]] = field(default_factory=list)
    error: BaseException | None = None
    window: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self.window = True
        self._thread = threading.Thread(target=self._run, name="swapper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the window, let the swap in flight finish; raise what a swap raised."""
        self.window = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SWAP_TIMEOUT)
        error, self.error = self.error, None  # raised once
        if error is not None:
            raise RuntimeError(f"a swap failed: {error!r}") from error

    def under_load(self) -> int:
        return sum(inside for _, inside, _ in self.swaps)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                self.swap()
                seconds, inside = time.perf_counter() - started, self.window
                if self.server is not None:
                    time.sleep(RSS_SETTLE)
                rss = self.server.rss() if self.server is not None else None
                self.swaps.append((seconds, inside, rss))
                self._stop.wait(max(0.0, started + self.every - time.perf_counter()))
        except BaseException as error:
            self.error = error


def version_swap(
    base: Path, template: Path, served: Callable[[], dict[int, str]], load: Callable[[], Any]
) -> Callable[[], None]:
    """A swap of ``lifecycle serve``: a new version directory renamed into ``base``.

    ``load()`` runs after the rename (a repository load, or nothing while the
    server polls); the swap ends when ``served()`` lists the new version alone
    ``AVAILABLE``, and the old directory is deleted.
    """
    version = [max(int(p.name) for p in base.iterdir() if p.name.isdigit())]

    def swap() -> None:
        new = version[0] + 1
        shutil.copytree(template, base / f".tmp-{new}")
        os.rename(base / f".tmp-{new}", base / str(new))
        load()
        deadline = time.perf_counter() + SWAP_TIMEOUT
        while served() != {new: "AVAILABLE"}:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"version {new} not served alone {SWAP_TIMEOUT:g} s on")
            time.sleep(STATUS_POLL)
        shutil.rmtree(base / str(version[0]))
        version[0] = new

    return swap


def cpu_of(server: Server) -> tuple[float, ...]:
    return (server.cpu_seconds(),)


def run_load(
    targets: Sequence[Server],
    spec: dict[str, Any],
    log: Path,
    timeout: float,
    read: Callable[[Server], tuple[float, ...]] = cpu_of,
    swapper: Swapper | None = None,
) -> list[dict[str, Any]]:
    """Load ``targets`` in turns (``spec``: path, body, clients, warmup, seconds, slices).

    ``read(server)`` is taken when each measured slice opens and closes; the
    differences, summed over the slices, are a result's ``counted`` (the first:
    CPU seconds, giving ``server_cpu_ms`` per request). ``swapper`` swaps while
    the one target's measured slice is open (the swap in flight then finishes).
    A result also has the load average at the start.
    """
    opened: dict[int, tuple[float, ...]] = {}
    counted: dict[int, list[float]] = {}

    def on_line(line: str) -> None:
        marker, _, index = line.partition(" ")
        if marker not in (MEASURING, MEASURED):
            return
        now = read(targets[int(index)])
        if marker == MEASURING:
            opened[int(index)] = now
            if swapper is not None:
                swapper.start()
            return
        spent = [b - a for a, b in zip(opened[int(index)], now, strict=True)]
        mine = counted.setdefault(int(index), [0.0] * len(spent))
        counted[int(index)] = [a + b for a, b in zip(mine, spent, strict=True)]
        if swapper is not None:
            swapper.stop()

    spec = {"slices": 1, **spec, "urls": [server.url for server in targets]}
    command = [sys.executable, "-m", "_harness.load", json.dumps(spec)]
    load_average = os.getloadavg()[0]
    try:
        results = stream_child(command, log, timeout, on_line, cwd=BENCHMARKS)["servers"]
    finally:
        if swapper is not None:
            swapper.stop()
    for index, (server, result) in enumerate(zip(targets, results, strict=True)):
        server.check_alive()
        result["counted"] = counted.get(index, [])
        result["load_average"] = load_average
        if result["counted"] and result["requests"]:
            result["server_cpu_ms"] = 1000 * result["counted"][0] / result["requests"]
    return results


if __name__ == "__main__":
    from . import RESULT_PREFIX

    print(RESULT_PREFIX + json.dumps({"servers": locust(json.loads(sys.argv[1]))}), flush=True)
