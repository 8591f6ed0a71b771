"""Batching: N concurrent batch-1 clients, request batching off and on.

The served MLP of ``hot_swap.py`` (``--units`` wide) is called by N clients of
``--clients``, batching off and on (``max_batch_size=32``, padded up to
``--allowed-batch-sizes``; ``--batch-timeout-micros``, ``--num-batch-threads``
and ``--return-wait`` as given, else the policy's defaults), beside a
*ceiling*: the same path with a ``--ceiling-units`` wide MLP batched as on, a
call that costs next to nothing, so about the most batching can reach there.
Two parts (``--parts``), whose cases are ``<part>, N clients``:

    in-process  one ``lc.ModelRegistry`` holding off, on and the ceiling; N threads
                call ``registry.predict(name, x)`` back to back; a child per round
    serve       three ``lifecycle serve`` processes (``--enable_batching`` and its
                flags for on and the ceiling), N Locust users sending the TF
                Serving REST predict of ``serve.py``, to one server at a time

Within a round and N the modes take turns, ``--slices`` times each, every slice
a share of ``--warmup`` unmeasured and of ``--seconds`` measured, the order
reversed every other turn (off first in odd rounds, on first in even ones): the
machine's drift falls on every mode alike. Per mode: requests/s, p50/p99,
failed requests, requests and padded rows per batch (the version's batching
counters over its slices), and when served the server's CPU per request and
the load generator's CPU. Modes are compared with off. Targets: with 16
clients on/off requests/s >= 2.5x and p50 <= 1.2x; with 1 client >= 0.95x.

Needs ``pip install -e '.[serve,bench,loadtest]'`` for the serve part. Run::

    python benchmarks/batching.py      # both parts, 6 rounds of 4 s phases: ~10 min
    python benchmarks/batching.py --quick
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import _harness
import serve
from _harness import Metric, Option, load, servers
from _harness.servers import Server
from hot_swap import INPUT_DIM, build_mlp, latency_us

MODES = ("off", "on", "ceiling")
PARTS = ("in-process", "serve")
MAX_BATCH_SIZE = 32
TARGETS = ((16, 2.5, 1.2), (1, 0.95, None))  # clients, requests/s at least, p50 at most


def modes_of(round_index: int) -> tuple[str, ...]:
    """The first turn's order of a round: off and on alternating which goes first."""
    return ("off", "on", "ceiling") if round_index % 2 == 0 else ("on", "off", "ceiling")


def in_turns(modes: tuple[str, ...], args: argparse.Namespace, measure: Any) -> None:
    """Call ``measure(mode, seconds_warm, seconds_measured)`` in turns of ``--slices``."""
    for turn in range(args.slices):
        for mode in modes if turn % 2 == 0 else modes[::-1]:
            measure(mode, args.warmup / args.slices, args.seconds / args.slices)


# ------------------------------------------------------------------ in-process


def measure_modes(
    registry: Any, modes: tuple[str, ...], request: Any, clients: int, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """``clients`` threads calling ``registry.predict`` on each mode in turn; per mode."""
    threads = load.RequestThreads(lambda index: registry.predict(modes[index], request), clients)
    seconds = dict.fromkeys(modes, 0.0)
    counted = {mode: [0, 0, 0] for mode in modes if registry.status(mode)[0].batching}

    def slice_(mode: str, warm: float, measured: float) -> None:
        threads.phase = modes.index(mode)
        time.sleep(warm)
        before, started = registry.status(mode)[0].batching, time.perf_counter()
        threads.recording = True
        time.sleep(measured)
        threads.recording = False
        seconds[mode] += time.perf_counter() - started
        if mode in counted:
            after = registry.status(mode)[0].batching
            for i, key in enumerate(("batches", "requests", "padded_rows")):
                counted[mode][i] += getattr(after, key) - getattr(before, key)

    try:
        in_turns(modes, args, slice_)
    finally:
        threads.stop()
    records = threads.recorded()
    results = {}
    for index, mode in enumerate(modes):
        mine = [latency for _, latency, phase in records if phase == index]
        failed = sum(phases.count(index) for phases in threads.failed)
        result = {**latency_us(mine), "requests_per_second": len(mine) / seconds[mode]}
        result |= {"failed_requests": failed, "errors": threads.errors if failed else []}
        if counted.get(mode, [0])[0]:
            batches, requests, padded = counted[mode]
            result |= {"requests_per_batch": requests / batches}
            result |= {"padded_rows_per_batch": padded / batches}
        results[mode] = result
    return results


def measure(role: str, args: argparse.Namespace) -> dict[str, Any]:
    """A child: one in-process round, ``role`` being ``round-<index>``."""
    import numpy as np

    import lifecycle as lc

    request = np.random.default_rng(0).standard_normal((1, INPUT_DIM), dtype=np.float32)
    given = {"num_batch_threads": args.num_batch_threads, "return_wait": args.return_wait}
    policy = lc.BatchingPolicy(
        max_batch_size=MAX_BATCH_SIZE,
        batch_timeout_micros=args.batch_timeout_micros,
        allowed_batch_sizes=args.allowed_batch_sizes,
        **{name: value for name, value in given.items() if value is not None},
    )
    found: dict[str, Any] = {mode: {"cases": {}} for mode in MODES}
    with lc.ModelRegistry(name="bench") as registry:
        registry.load("off", 1, lambda: build_mlp(args.units), warmup=request)
        registry.load("on", 1, lambda: build_mlp(args.units), warmup=request, batching=policy)
        ceiling = lambda: build_mlp(args.ceiling_units)  # noqa: E731
        registry.load("ceiling", 1, ceiling, warmup=request, batching=policy)
        for clients in args.clients:
            modes = modes_of(int(role.removeprefix("round-")))
            for mode, result in measure_modes(registry, modes, request, clients, args).items():
                found[mode]["cases"][f"in-process, {clients} clients"] = result
    return found


# ----------------------------------------------------------------------- served


def server_flags(mode: str, args: argparse.Namespace) -> list[str]:
    flags = ["--file_system_poll_wait_seconds", "0"]
    if mode == "off":
        return flags
    flags += ["--enable_batching", "--max_batch_size", str(MAX_BATCH_SIZE)]
    if args.allowed_batch_sizes:
        flags += ["--allowed_batch_sizes", ",".join(map(str, args.allowed_batch_sizes))]
    if args.num_batch_threads is not None:
        flags += ["--num_batch_threads", str(args.num_batch_threads)]
    if args.batch_timeout_micros:
        flags += ["--batch_timeout_micros", str(args.batch_timeout_micros)]
    if args.return_wait is not None:
        flags += ["--batch_return_wait", str(args.return_wait)]
    return flags


def counters(server: Server) -> tuple[float, int, int]:
    """The server's CPU seconds, and its version's batches and requests (admin API)."""
    url = f"{server.url}/v1/admin/models/{serve.MODEL_NAME}"
    with urllib.request.urlopen(url, timeout=10.0) as response:
        stats = json.loads(response.read())["versions"][0]["batching"] or {}
    return server.cpu_seconds(), stats.get("batches", 0), stats.get("requests", 0)


def serve_round(
    running: dict[str, Server], index: int, clients: int, args: argparse.Namespace, logs: Path
) -> dict[str, dict[str, Any]]:
    """``clients`` Locust users taking turns between the servers (one load child); per mode."""
    modes = modes_of(index)
    spec = {"path": serve.PREDICT_PATH, "body": serve.request_body().decode()}
    spec |= {"clients": clients, "seconds": args.seconds, "warmup": args.warmup}
    spec |= {"slices": args.slices}
    targets = [running[mode] for mode in modes]
    loaded = load.run_load(targets, spec, logs / "load.log", args.timeout, counters)
    results = {}
    for mode, phase in zip(modes, loaded, strict=True):
        _, batches, requests = phase["counted"] or (0, 0, 0)
        results[mode] = {
            "requests_per_second": phase["requests_per_second"],
            "p50_us": phase["p50_ms"] and 1000 * phase["p50_ms"],
            "p99_us": phase["p99_ms"] and 1000 * phase["p99_ms"],
            "failed_requests": phase["failed"],
            "errors": phase["errors"],
            "server_cpu_ms": phase.get("server_cpu_ms"),
            "load_cpu_percent": phase["load_cpu_percent"],
        }
        if batches:
            results[mode]["requests_per_batch"] = requests / batches
    return results


def collect(args: argparse.Namespace) -> _harness.Runs:
    runs: _harness.Runs = [{mode: {"cases": {}} for mode in MODES} for _ in range(args.rounds)]
    if "in-process" in args.parts:
        for index, run in enumerate(runs):
            print(f"in-process round {index + 1} ...", file=sys.stderr, flush=True)
            done = _harness.spawn_child(Path(__file__), f"round-{index}", args.argv, args.timeout)
            if done.result is None:
                raise SystemExit(f"in-process round {index + 1} failed: {done.error}")
            for mode in MODES:
                run[mode]["cases"] |= done.result[mode]["cases"]
    if "serve" in args.parts:
        with servers.workspace("lifecycle-batching-bench-") as (work, running):
            for units in {args.units, args.ceiling_units}:
                serve.export_model(units, work / f"model-{units}", args.timeout)
            for mode, port in zip(MODES, _harness.free_ports(3), strict=True):
                units = args.ceiling_units if mode == "ceiling" else args.units
                shutil.copytree(work / f"model-{units}", work / f"base-{mode}" / "1")
                flags = server_flags(mode, args)
                command = serve.lifecycle_serve(port, work / f"base-{mode}", *flags)
                running[mode] = servers.start_server(mode, port, command, work / "logs")
            for server in running.values():
                servers.wait_ready(server, args.timeout, serve.post_predict)
            for index, run in enumerate(runs):
                for clients in args.clients:
                    print(f"serve round {index + 1}: {clients} clients", file=sys.stderr)
                    found = serve_round(running, index, clients, args, work / "logs")
                    for mode, result in found.items():
                        run[mode]["cases"][f"serve, {clients} clients"] = result
    return runs


def targets(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """The targets, judged on the median of the per-round on/off ratios, per part."""
    lines = []
    for part in args.parts:
        for clients, throughput, p50 in TARGETS:
            case = f"{part}, {clients} clients"
            found = _harness.ratio_over_rounds(runs, "requests_per_second", "on", "off", case)
            if found is None:
                continue
            label = f"{case}, requests/s on/off >= {throughput:g}x"
            lines.append(_harness.judge(label, found, throughput, at_least=True))
            ceiling = _harness.ratio_over_rounds(
                runs, "requests_per_second", "ceiling", "off", case
            )
            if ceiling is not None and ceiling.median < throughput:
                lines.append(f"  out of reach: the ceiling served {ceiling.median:.2f}x off's")
            if p50:
                found = _harness.ratio_over_rounds(runs, "p50_us", "on", "off", case)
                lines.append(_harness.judge(f"{case}, p50 on/off <= {p50:g}x", found, p50))
    failed = sum(
        c["failed_requests"] for run in runs for r in run.values() for c in r["cases"].values()
    )
    lines.append(
        f"target: no failed request: {'met' if failed == 0 else 'MISSED'} ({failed} failed)"
    )
    return lines


def allowed_sizes(text: str) -> list[int]:
    return _harness.positive_ints(text) if text else []


BENCHMARK = _harness.Benchmark(
    name="batching",
    doc=__doc__,
    variants={
        "off": "no batching",
        "on": f"max_batch_size={MAX_BATCH_SIZE}, padded to --allowed-batch-sizes",
        "ceiling": "a --ceiling-units wide MLP batched as on",
    },
    metrics=[
        Metric("requests_per_second", "req/s", ",.0f", "requests/s"),
        Metric("p50_us", "µs", ".0f", "p50 µs"),
        Metric("p99_us", "µs", ".0f", "p99 µs"),
        Metric("requests_per_batch", "", ".2f", "requests/batch", ratio=False),
        Metric("padded_rows_per_batch", "", ".2f", "padded rows/batch", ratio=False),
        Metric("failed_requests", "", ".0f", "failed", ratio=False),
        Metric("server_cpu_ms", "ms", ".3f", "server CPU ms/request", ratio=False),
        Metric("load_cpu_percent", "%", ".0f", "load gen CPU %", ratio=False),
    ],
    measure=measure,
    collect=collect,
    options=[
        Option("--parts", ",".join(PARTS), "comma-separated subset", _harness.names(PARTS)),
        Option("--clients", "1,4,16", "comma-separated client counts", _harness.positive_ints),
        Option("--seconds", 4.0, "measured seconds per mode", _harness.positive_float),
        Option("--warmup", 1.0, "unmeasured seconds per mode"),
        Option("--slices", 8, "turns each mode is measured in", _harness.positive_int),
        Option("--units", 2048, "hidden width (2048: 4.76M params)", _harness.positive_int),
        Option("--ceiling-units", 16, "the ceiling's hidden width", _harness.positive_int),
        Option("--allowed-batch-sizes", "1,2,4,8,16,32", "'' for no padding", allowed_sizes),
        Option("--batch-timeout-micros", 0, "the policy's batch_timeout_micros"),
        Option("--num-batch-threads", None, "the policy's (default: its own)", int),
        Option("--return-wait", None, "the policy's (default: its own); 0: none", float),
    ],
    quick={"clients": "1,4", "seconds": 1.0, "warmup": 0.5, "units": 256, "slices": 2},
    baseline="off",
    rounds=6,
    notes=targets,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
