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
one row. The load is Locust, as a library, in a child process per phase
(``_harness.load``): ``--clients`` ``FastHttpUser``s without wait, ``--warmup``
s, then ``--seconds`` measured; a request fails if it raises or is not answered
200 (warm-ups too). Only the servers ``--variants`` picks start; they stay up,
and each round runs a phase per server, the order rotating. Per phase:
requests/s, p50/p99/p99.9, the server's CPU per request, the load generator's
CPU (psutil) and the load average at its start. In (c) a swap starts every
``--swap-every`` s while the window is open: a version written until it alone
is served, ``AVAILABLE``; then the RSS of (c) 0.5 s later (every swap's in the
JSON, the ``series`` of ``rss_after_swap_1_mib``); a swap finishing after the
window is counted apart. If the rounds end with fewer than ``--min-swaps`` swaps
under load, further (c) phases run (their number, failed requests and median
p99 in case ``swaps``).
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
import urllib.request
from pathlib import Path
from typing import Any

import _harness
from _harness import MIB, Metric, Option, load, servers
from _harness.servers import Server
from hot_swap import INPUT_DIM, build_mlp

MODEL_NAME = "mlp"
PREDICT_PATH = f"/v1/models/{MODEL_NAME}:predict"
PURE_PYTHON_HTTP = ("httptools", "uvloop")  # what d's path hides
MAX_EXTRA_PHASES = 20
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


def measure(role: str, args: argparse.Namespace) -> dict[str, Any]:
    """A child's role: ``export`` the model to ``--model``, or the ``handwritten`` server."""
    if role == "export":
        import tensorflow as tf

        build_mlp(args.units).export(args.model, verbose=False)
        signature = tf.saved_model.load(args.model).signatures["serving_default"]
        return {"input_name": next(iter(signature.structured_input_signature[1]))}
    return run_handwritten(args)


# ------------------------------------------------- the served model, for the parents


def lifecycle_serve(port: int, base: Path, *flags: str) -> list[str]:
    """The command of ``lifecycle serve`` on ``port`` for ``base``, REST only."""
    command = [str(Path(sys.executable).with_name("lifecycle")), "serve"]  # as users run it
    command += ["--rest_api_port", str(port), "--port", "0", "--model_name", MODEL_NAME]
    return [*command, "--model_base_path", str(base), *flags]


def post_predict(url: str) -> None:
    """The benchmark's request; raises unless it is answered with JSON."""
    request = urllib.request.Request(
        url + PREDICT_PATH, request_body(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10.0) as response:
        json.loads(response.read())


def served_versions(url: str) -> dict[int, str]:
    with urllib.request.urlopen(f"{url}/v1/models/{MODEL_NAME}", timeout=10.0) as response:
        body = json.loads(response.read())
    return {int(s["version"]): s["state"] for s in body["model_version_status"]}


def export_model(units: int, path: Path, timeout: float) -> dict[str, Any]:
    """Write the served MLP as a SavedModel at ``path``, in a child; its input's name."""
    options = ["--units", str(units), "--model", str(path)]
    done = _harness.spawn_child(Path(__file__), "export", options, timeout)
    if done.error is not None:
        raise RuntimeError(f"exporting the {units}-unit model failed: {done.error}")
    return done.result or {}


# ----------------------------------------------------------------- the run


def pure_python_http(parent: Path) -> Path:
    """Modules named as :data:`PURE_PYTHON_HTTP` raising ImportError: uvicorn picks h11, asyncio."""
    directory = parent / "pure-python-http"
    directory.mkdir(exist_ok=True)
    for name in PURE_PYTHON_HTTP:
        (directory / f"{name}.py").write_text(f"raise ImportError('{name}: left out by (d)')\n")
    return directory


def start_servers(args: argparse.Namespace, work: Path, running: dict[str, Server]) -> None:
    """Export the model and start the servers ``--variants`` picks into ``running``."""
    template, logs = work / "model", work / "logs"
    export_model(args.units, template, args.timeout)
    ports = dict(zip(args.variants, _harness.free_ports(len(args.variants)), strict=True))
    env = _harness.child_environment()
    env["PYTHONPATH"] = os.pathsep.join([str(pure_python_http(logs)), env["PYTHONPATH"]])
    poll = ["--file_system_poll_wait_seconds", str(args.poll_wait)]
    for name, port in ports.items():
        if name == "a":
            command = [sys.executable, __file__, "--variant", "handwritten"]
            command += ["--model", str(template), "--port", str(port)]
        else:
            shutil.copytree(template, work / f"base-{name}" / "1")
            command = lifecycle_serve(port, work / f"base-{name}", *(poll if name == "c" else ()))
        extra = env if name == "d" else None
        running[name] = servers.start_server(name, port, command, logs, extra)
    for server in running.values():
        servers.wait_ready(server, args.timeout, post_predict)


def phase(
    server: Server, args: argparse.Namespace, logs: Path, swapper: load.Swapper | None = None
) -> dict[str, Any]:
    spec = {"path": PREDICT_PATH, "body": request_body().decode(), "clients": args.clients}
    spec |= {"warmup": args.warmup, "seconds": args.seconds}
    log = logs / f"load-{server.name}.log"
    [result] = load.run_load([server], spec, log, args.timeout, swapper=swapper)
    return result


def c_http_modules(server: Server) -> list[str]:
    """Which of the C HTTP modules the server process has mapped."""
    import psutil

    paths = [region.path for region in psutil.Process(server.process.pid).memory_maps()]
    return [name for name in PURE_PYTHON_HTTP if any(f"/{name}/" in path for path in paths)]


def collect(args: argparse.Namespace) -> _harness.Runs:
    """Start the servers, run the rounds (and extra (c) phases), stop every server."""
    with servers.workspace("lifecycle-serve-bench-") as (work, running):
        start_servers(args, work, running)
        swapper = None
        if "c" in running:
            served = lambda: served_versions(running["c"].url)  # noqa: E731
            swap = load.version_swap(work / "base-c", work / "model", served, lambda: None)
            swapper = load.Swapper(swap, args.swap_every, running["c"])
        runs: _harness.Runs = []
        for index in range(args.rounds):
            runs.append({})
            for name in _harness.rotation(args.variants, index):
                print(f"round {index + 1}: {name} ...", file=sys.stderr, flush=True)
                found = phase(running[name], args, work / "logs", swapper if name == "c" else None)
                runs[-1][name] = {"cases": {"serving": found}}
        extra = []
        while swapper and swapper.under_load() < args.min_swaps and len(extra) < MAX_EXTRA_PHASES:
            extra.append(phase(running["c"], args, work / "logs", swapper))
        for name, result in runs[-1].items():
            result["cases"]["serving"]["server_rss_mib"] = running[name].rss() / MIB
            result["c_http_modules"] = c_http_modules(running[name])
        if swapper is not None:
            runs[-1]["c"]["cases"]["swaps"] = swap_summary(swapper, extra)
    return runs


def swap_summary(swapper: load.Swapper, extra: list[dict[str, Any]]) -> dict[str, Any]:
    """The swaps of the whole run; the failed requests and p99 of the extra (c) phases."""
    found: dict[str, Any] = {"swaps_under_load": swapper.under_load()}
    found["swaps_after_window"] = len(swapper.swaps) - swapper.under_load()
    found["failed_in_extra_phases"] = sum(phase["failed"] for phase in extra)
    found["extra_phases"] = len(extra)
    found["extra_p99_ms"] = _harness.percentiles([p["p99_ms"] for p in extra if p["p99_ms"]], 50)[0]
    if swapper.swaps:
        found["swap_s"] = _harness.percentiles([s for s, _, _ in swapper.swaps], 50)[0]
        after = found["rss_after_swap_mib"] = [rss / MIB for *_, rss in swapper.swaps]
        found["rss_after_swap_1_mib"] = after[0]
        if len(after) >= SWAPS_TARGET:
            found["rss_swap_50_over_1"] = after[SWAPS_TARGET - 1] / after[0]
    return found


def targets(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    def ratio(key: str, over: str, under: str) -> _harness.Spread | None:
        return _harness.ratio_over_rounds(runs, key, over, under, "serving")

    failed = sum(r["cases"]["serving"]["failed"] for run in runs for r in run.values() if r)
    swaps = next((r["c"]["cases"]["swaps"] for r in runs[::-1] if r.get("c")), {})
    failed += swaps.get("failed_in_extra_phases", 0)
    rss = swaps.get("rss_swap_50_over_1")
    lines = [
        _harness.judge(
            "b/a requests/s >= 0.95x", ratio("requests_per_second", "b", "a"), 0.95, True
        ),
        _harness.judge("b/a p99 <= 1.1x", ratio("p99_ms", "b", "a"), 1.1),
        _harness.judge("c/b p99 <= 1.5x", ratio("p99_ms", "c", "b"), 1.5),
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
        Metric(
            "rss_after_swap_1_mib", "MiB", ".0f", "RSS after swap 1", False, "rss_after_swap_mib"
        ),
        Metric("rss_swap_50_over_1", "x", ".3f", "RSS swap 50 / 1", ratio=False),
        Metric("swaps_after_window", "", ".0f", "swaps after window", ratio=False),
        Metric("extra_phases", "", ".0f", "extra c phases", ratio=False),
        Metric("extra_p99_ms", "ms", ".2f", "extra phases p99 ms", ratio=False),
        Metric("load_average", "", ".2f", "load average", ratio=False),
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
        Option("--model", None, argparse.SUPPRESS, str),
        Option("--port", 0, argparse.SUPPRESS),
    ],
    quick={"seconds": 2.0, "warmup": 1.0, "units": 32, "swap_every": 1.0, "min_swaps": 0},
    baseline=lambda name: {"a": "a", "b": "a", "c": "b", "d": "b"}[name],
    rounds=5,
    timeout=600.0,
    notes=targets,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
