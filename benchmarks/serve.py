"""Serve: ``lifecycle serve`` against a hand-written endpoint, and under swaps.

Four HTTP servers on 127.0.0.1 serve the same Keras 3 SavedModel (the MLP of
``hot_swap.py``, ``--units`` wide, written by ``model.export()``), each in its
own process:

    a   what users write today: Starlette, orjson, the SavedModel's ``serve``
        tf.function on the event loop, run by uvicorn with serve's settings
    b   ``lifecycle serve`` on a base path holding version 1
    c   the same polling its base path (``--poll-wait``) while a new version
        directory appears every ``--swap-every`` s during its measured windows
    d   b on uvicorn's pure-Python stack (h11, asyncio): modules ``httptools``
        and ``uvloop`` that raise ImportError come first on its path

Every request is the TF Serving REST call ``POST /v1/models/mlp:predict`` of
one row. The load is Locust, as a library, in a child process per phase:
``--clients`` ``FastHttpUser``s without wait, ``--warmup`` s, then ``--seconds``
measured; each request is timed from Locust's ``request`` event, a request
fails if it raises or is not answered 200 (warm-ups too). The servers stay up;
each round runs a phase per server, the order rotating. Per phase: requests/s,
p50/p99/p99.9, the server's CPU per request and the load generator's CPU
(psutil). A swap is a version written until it alone is served, ``AVAILABLE``;
then the RSS of (c) 0.5 s later. If the rounds end with fewer than
``--min-swaps`` swaps under load, further (c) phases run (left out of the table).
b is compared with a, c and d with b. Targets: b >= 0.95x a's requests/s and
<= 1.1x its p99; c's p99 <= 1.5x b's; no failed request over >= 50 swaps; RSS
after swap 50 within 10 % of after swap 1.

Needs ``pip install -e '.[serve,bench,loadtest]'``. Run (from the repository root)::

    python benchmarks/serve.py          # 5 rounds of 4 x (2 + 20) s, >= 50 swaps: ~11 min
    python benchmarks/serve.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _harness
from _harness import MIB, Metric, Option, servers
from _harness.servers import Server
from hot_swap import INPUT_DIM, build_mlp

MODEL_NAME = "mlp"
PREDICT_PATH = f"/v1/models/{MODEL_NAME}:predict"
PURE_PYTHON_HTTP = ("httptools", "uvloop")  # what d's path hides
MEASURING, MEASURED = "MEASURING", "MEASURED"  # a load child's lines, with a server index
STATUS_POLL = 0.1
SWAP_TIMEOUT = 120.0
RSS_SETTLE = 0.5
MAX_EXTRA_PHASES = 20
STOP_TIMEOUT = 10.0  # a load child's clients finishing their request in flight
ERRORS_KEPT = 5
SWAPS_TARGET = 50
# The uvicorn settings of `lifecycle serve` (lifecycle/server/_app.py, uvicorn_config()).
UVICORN_SETTINGS: dict[str, Any] = {
    "lifespan": "on",
    "timeout_graceful_shutdown": 10.0,
    "log_level": "info",
    "access_log": False,
}


def request_body() -> bytes:
    """The one request every client sends: one row of fixed pseudo-random floats."""
    import random

    rng = random.Random(0)
    row = [round(rng.uniform(-1, 1), 6) for _ in range(INPUT_DIM)]
    return json.dumps({"instances": [row]}).encode()


# ---------------------------------------------------------------- the children


def run_handwritten(args: argparse.Namespace) -> dict[str, Any]:
    """Serve ``--model`` the way a user writes it today, until SIGTERM."""
    import orjson
    import tensorflow as tf
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    model = tf.saved_model.load(args.model)

    async def predict(request: Request) -> Response:
        body = orjson.loads(await request.body())
        outputs = model.serve(tf.constant(body["instances"], dtype=tf.float32))
        answer = orjson.dumps({"predictions": outputs.numpy().tolist()})
        return Response(answer, media_type="application/json")

    app = Starlette(routes=[Route(PREDICT_PATH, predict, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=args.port, **UVICORN_SETTINGS)
    return {}


def latency_ms(times: Sequence[float]) -> dict[str, float | None]:
    p50, p99, p999 = _harness.percentiles(times, 50, 99, 99.9)
    return {"p50_ms": p50, "p99_ms": p99, "p999_ms": p999}


def run_load(args: argparse.Namespace) -> dict[str, Any]:
    """``--clients`` Locust users against the servers of ``--url`` (comma-separated).

    Several servers take turns: all users send to one at a time, each gets
    ``--slices`` turns of its share of ``--warmup`` and ``--seconds``, the order
    reversed every other turn. ``MEASURING i`` / ``MEASURED i`` lines tell the
    parent when server i's measured slice opens and closes. A request counts for
    the server it went to: measured if answered within its slices, failed if it
    fails at any time or is unanswered at the end.
    """
    import gevent
    from locust import FastHttpUser, constant, task
    from locust.env import Environment

    urls = args.url.split(",")
    body, headers = (
        args.body.encode() if args.body else request_body(),
        {"Content-Type": "application/json"},
    )
    path = args.path or PREDICT_PATH
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
    runner.start(args.clients, spawn_rate=max(args.clients, 100))
    order = list(range(len(urls)))
    for turn in range(args.slices):
        for index in order if turn % 2 == 0 else order[::-1]:
            target[0] = index
            gevent.sleep(args.warmup / args.slices)
            print(f"{MEASURING} {index}", flush=True)
            started, cpu_started = time.perf_counter(), time.process_time()
            measuring[0] = index
            gevent.sleep(args.seconds / args.slices)
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
    return {"servers": results}


def measure(role: str, args: argparse.Namespace) -> dict[str, Any]:
    """A child's role: ``export`` the model to ``--model``, the ``handwritten`` server, ``load``."""
    if role == "export":
        import tensorflow as tf

        build_mlp(args.units).export(args.model, verbose=False)
        signature = tf.saved_model.load(args.model).signatures["serving_default"]
        return {"input_name": next(iter(signature.structured_input_signature[1]))}
    return run_handwritten(args) if role == "handwritten" else run_load(args)


# ------------------------------------------------------------- servers, for the parent


def lifecycle_serve(port: int, base: Path, *flags: str) -> list[str]:
    """The command of ``lifecycle serve`` on ``port`` for ``base``, REST only."""
    command = [sys.executable, "-m", "lifecycle.cli", "serve"]
    command += ["--rest_api_port", str(port), "--port", "0", "--model_name", MODEL_NAME]
    return [*command, "--model_base_path", str(base), *flags]


def post_predict(url: str) -> None:
    """The benchmark's request; raises unless it is answered with JSON."""
    request = urllib.request.Request(
        url + PREDICT_PATH, request_body(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10.0) as response:
        json.loads(response.read())


def export_model(units: int, path: Path, timeout: float) -> dict[str, Any]:
    """Write the served MLP as a SavedModel at ``path``, in a child; its input's name."""
    options = ["--units", str(units), "--model", str(path)]
    done = _harness.spawn_child(Path(__file__), "export", options, timeout)
    if done.error is not None:
        raise RuntimeError(f"exporting the {units}-unit model failed: {done.error}")
    return done.result or {}


def run_load_child(
    options: list[str], log: Path, timeout: float, on_line: Callable[[str], None]
) -> dict[str, Any]:
    """Run this script's ``load`` role with ``options``, handing each line to ``on_line``."""
    command = [sys.executable, __file__, "--variant", "load", *options]
    return servers.stream_child(command, log, timeout, on_line)


# ----------------------------------------------------------------- the run


@dataclass
class VersionWriter:
    """Writes a new version of (c) every ``every`` s while a measured window is open.

    A swap: the version directory copied aside and renamed into place, until it
    alone is listed ``AVAILABLE``; the old directory deleted, the RSS read
    ``RSS_SETTLE`` s later. It counts as under load if it completed in a window.
    """

    server: Server
    template: Path
    base: Path
    every: float
    version: int = 1
    swaps: list[tuple[float, bool, int]] = field(default_factory=list)  # seconds, loaded, RSS
    error: BaseException | None = None
    window: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self.window = True
        self._thread = threading.Thread(target=self._run, name="version-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.window = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"version writer failed: {self.error!r}") from self.error

    def _run(self) -> None:
        try:
            while not self._stop.wait(0 if not self.swaps else self.every):
                self._swap()
        except BaseException as error:
            self.error = error

    def _swap(self) -> None:
        new = self.version + 1
        shutil.copytree(self.template, self.base / f".tmp-{new}")
        os.rename(self.base / f".tmp-{new}", self.base / str(new))
        written = time.perf_counter()
        while served_versions(self.server.url) != {new: "AVAILABLE"}:
            self.server.check_alive()
            if time.perf_counter() - written > SWAP_TIMEOUT:
                raise RuntimeError(f"version {new} not served alone {SWAP_TIMEOUT:g} s on")
            time.sleep(STATUS_POLL)
        seconds, loaded = time.perf_counter() - written, self.window
        shutil.rmtree(self.base / str(self.version))
        self.version = new
        time.sleep(RSS_SETTLE)
        self.swaps.append((seconds, loaded, self.server.rss()))


def served_versions(url: str) -> dict[int, str]:
    with urllib.request.urlopen(f"{url}/v1/models/{MODEL_NAME}", timeout=10.0) as response:
        body = json.loads(response.read())
    return {int(s["version"]): s["state"] for s in body["model_version_status"]}


def run_phase(
    server: Server, args: argparse.Namespace, logs: Path, writer: VersionWriter | None
) -> dict[str, Any]:
    """One load phase against ``server``; its result, with the server's CPU per request."""
    server.check_alive()
    cpu: list[float] = []

    def on_line(line: str) -> None:
        marker = line.partition(" ")[0]
        if marker in (MEASURING, MEASURED):
            cpu.append(server.cpu_seconds())
        if writer is not None and marker == MEASURING:
            writer.start()
        elif writer is not None and marker == MEASURED:
            writer.window = False

    options = ["--url", server.url, "--clients", str(args.clients), "--seconds", str(args.seconds)]
    options += ["--warmup", str(args.warmup)]
    try:
        [result] = run_load_child(options, logs / f"load-{server.name}.log", args.timeout, on_line)[
            "servers"
        ]
    finally:
        if writer is not None:
            writer.stop()
    server.check_alive()
    if len(cpu) == 2 and result["requests"]:
        result["server_cpu_ms"] = 1000 * (cpu[1] - cpu[0]) / result["requests"]
    return result


def pure_python_http(parent: Path) -> Path:
    """Modules named as :data:`PURE_PYTHON_HTTP` raising ImportError: uvicorn picks h11, asyncio."""
    directory = parent / "pure-python-http"
    directory.mkdir(exist_ok=True)
    for name in PURE_PYTHON_HTTP:
        (directory / f"{name}.py").write_text(f"raise ImportError('{name}: left out by (d)')\n")
    return directory


def start_servers(
    args: argparse.Namespace, work: Path, logs: Path, running: dict[str, Server]
) -> None:
    """Export the model and start the four servers into ``servers``, as each starts."""
    template = work / "model"
    export_model(args.units, template, args.timeout)
    ports = dict(zip("abcd", _harness.free_ports(4), strict=True))
    for name in "bcd":
        shutil.copytree(template, work / f"base-{name}" / "1")
    handwritten = [sys.executable, __file__, "--variant", "handwritten", "--model", str(template)]
    env = _harness.child_environment()
    env["PYTHONPATH"] = os.pathsep.join([str(pure_python_http(logs)), env["PYTHONPATH"]])
    poll = ["--file_system_poll_wait_seconds", str(args.poll_wait)]
    commands = {
        "a": [*handwritten, "--port", str(ports["a"])],
        "b": lifecycle_serve(ports["b"], work / "base-b"),
        "c": lifecycle_serve(ports["c"], work / "base-c", *poll),
        "d": lifecycle_serve(ports["d"], work / "base-d"),
    }
    for name, command in commands.items():
        extra = env if name == "d" else None
        running[name] = servers.start_server(name, ports[name], command, logs, extra)
    for server in running.values():
        servers.wait_ready(server, args.timeout, post_predict)


def c_http_modules(server: Server) -> list[str]:
    """Which of the C HTTP modules the server process has mapped."""
    import psutil

    paths = [region.path for region in psutil.Process(server.process.pid).memory_maps()]
    return [name for name in PURE_PYTHON_HTTP if any(f"/{name}/" in path for path in paths)]


def collect(args: argparse.Namespace) -> _harness.Runs:
    """Start the servers, run the rounds (and extra (c) phases), stop every server."""
    with servers.workspace("lifecycle-serve-bench-") as (work, running):
        start_servers(args, work, work / "logs", running)
        writer = VersionWriter(running["c"], work / "model", work / "base-c", args.swap_every)
        runs: _harness.Runs = []
        for index in range(args.rounds):
            runs.append({})
            for name in _harness.rotation(args.variants, index):
                print(f"round {index + 1}: {name} ...", file=sys.stderr, flush=True)
                swapping = writer if name == "c" else None
                phase = run_phase(running[name], args, work / "logs", swapping)
                runs[-1][name] = {"cases": {"serving": phase}}
        extra = []
        while "c" in args.variants and len(extra) < MAX_EXTRA_PHASES:
            if sum(loaded for _, loaded, _ in writer.swaps) >= args.min_swaps:
                break
            extra.append(run_phase(running["c"], args, work / "logs", writer))
        for name, result in runs[-1].items():
            result["cases"]["serving"]["server_rss_mib"] = running[name].rss() / MIB
            result["c_http_modules"] = c_http_modules(running[name])
        if "c" in args.variants:
            runs[-1]["c"]["cases"]["swaps"] = swap_summary(writer, extra)
    return runs


def swap_summary(writer: VersionWriter, extra: list[dict[str, Any]]) -> dict[str, Any]:
    """The swaps of the whole run; the failed requests of the extra (c) phases."""
    found = {"swaps_under_load": sum(loaded for _, loaded, _ in writer.swaps)}
    found["failed_in_extra_phases"] = sum(phase["failed"] for phase in extra)
    if writer.swaps:
        found["swap_s"] = _harness.percentiles([s for s, _, _ in writer.swaps], 50)[0]
        after = [rss for *_, rss in writer.swaps]
        found["rss_after_swap_1_mib"] = after[0] / MIB
        if len(after) >= SWAPS_TARGET:
            found["rss_swap_50_over_1"] = after[SWAPS_TARGET - 1] / after[0]
    return found


def targets(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    def ratios(key: str, over: str, under: str) -> _harness.Spread | None:
        pairs = [(r.get(over), r.get(under)) for r in runs]
        values = [
            a["cases"]["serving"][key] / b["cases"]["serving"][key]
            for a, b in pairs
            if a and b and a["cases"]["serving"].get(key) and b["cases"]["serving"].get(key)
        ]
        return _harness.spread_of(values)

    def judged(label: str, found: _harness.Spread | None, ok: Callable[[float], bool]) -> str:
        if found is None:
            return f"target: {label}: not measured"
        return f"target: {label}: {'met' if ok(found.median) else 'MISSED'} ({found.median:.2f}x)"

    failed = sum(
        r["cases"]["serving"]["failed"] for run in runs for r in run.values() if r is not None
    )
    swaps = next((r["c"]["cases"]["swaps"] for r in runs[::-1] if r.get("c")), {})
    failed += swaps.get("failed_in_extra_phases", 0)
    rss = swaps.get("rss_swap_50_over_1")
    lines = [
        judged("b/a requests/s >= 0.95x", ratios("requests_per_second", "b", "a"), (0.95).__le__),
        judged("b/a p99 <= 1.1x", ratios("p99_ms", "b", "a"), (1.1).__ge__),
        judged("c/b p99 <= 1.5x", ratios("p99_ms", "c", "b"), (1.5).__ge__),
        f"target: >= {SWAPS_TARGET} swaps under load, 0 failed: "
        f"{swaps.get('swaps_under_load', 0)} swaps, {failed} failed",
        "target: RSS after swap 50 / after swap 1 within 1 +- 0.10: "
        + ("not measured" if rss is None else f"{rss:.3f}"),
    ]
    for name in args.variants:
        found = next((r[name] for r in runs[::-1] if r.get(name)), None)
        if found is not None:
            modules = found.get("c_http_modules", [])
            errors = found["cases"]["serving"].get("errors")
            lines.append(f"{name}: C HTTP modules loaded: {', '.join(modules) or 'none'}")
            if errors:
                lines.append(f"{name}: errors: {errors}")
    return lines


BENCHMARK = _harness.Benchmark(
    name="serve",
    doc=__doc__,
    variants={
        "a": "hand-written Starlette + tf.function",
        "b": "lifecycle serve, steady",
        "c": "lifecycle serve + new versions",
        "d": "lifecycle serve on h11 + asyncio",
    },
    metrics=[
        Metric("requests_per_second", "req/s", ",.0f", "requests/s"),
        Metric("p50_ms", "ms", ".2f", "p50 ms"),
        Metric("p99_ms", "ms", ".2f", "p99 ms"),
        Metric("p999_ms", "ms", ".1f", "p99.9 ms", ratio=False),
        Metric("server_cpu_ms", "ms", ".2f", "server CPU ms/request"),
        Metric("load_cpu_percent", "%", ".0f", "load gen CPU %", ratio=False),
        Metric("requests", "", ",.0f", "requests", ratio=False),
        Metric("failed", "", ".0f", "failed", ratio=False),
        Metric("server_rss_mib", "MiB", ".0f", "server RSS MiB", ratio=False),
        Metric("swaps_under_load", "", ".0f", "swaps under load", ratio=False),
        Metric("swap_s", "s", ".2f", "write -> served s", ratio=False),
        Metric("rss_after_swap_1_mib", "MiB", ".0f", "RSS after swap 1", ratio=False),
        Metric("rss_swap_50_over_1", "x", ".3f", "RSS swap 50 / 1", ratio=False),
    ],
    measure=measure,
    collect=collect,
    options=[
        Option("--seconds", 20.0, "measured seconds per phase", _harness.positive_float),
        Option("--warmup", 2.0, "unmeasured seconds before each phase"),
        Option("--clients", 4, "concurrent Locust clients", _harness.positive_int),
        Option("--units", 2048, "hidden width (2048: 4.76M params)", _harness.positive_int),
        Option("--swap-every", 2.0, "seconds between new versions in c", _harness.positive_float),
        Option("--poll-wait", 1.0, "c's --file_system_poll_wait_seconds", _harness.positive_float),
        Option("--min-swaps", SWAPS_TARGET, "swaps under load at least (extra c phases)"),
        *(Option(flag, None, argparse.SUPPRESS, str) for flag in ("--model", "--url", "--body")),
        Option("--path", None, argparse.SUPPRESS, str),
        Option("--port", 0, argparse.SUPPRESS),
        Option("--slices", 1, argparse.SUPPRESS),
    ],
    quick={"seconds": 2.0, "warmup": 1.0, "units": 32, "swap_every": 1.0, "min_swaps": 0},
    baseline=lambda name: {"a": "a", "b": "a", "c": "b", "d": "b"}[name],
    rounds=5,
    timeout=600.0,
    notes=targets,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
