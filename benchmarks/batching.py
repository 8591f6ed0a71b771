"""Request batching benchmark: N concurrent batch-1 clients, batching off and on.

Two parts (``--parts``, both by default), each comparing batching off and on
for every client count N of ``--clients`` (1, 4, 16), with the same model:
the served MLP of ``hot_swap.py`` (Input(256) -> Dense(units, relu) ->
Dense(units, relu) -> Dense(16), no optimizer; ``--units 2048`` gives 4.76M
params). Batching *on* is ``max_batch_size=32``, padded up to
``--allowed-batch-sizes`` (1,2,4,8,16,32; ``""`` for no padding), no batch
timeout unless ``--batch-timeout-micros``, ``num_batch_threads`` and
``return_wait`` the policy's defaults unless ``--num-batch-threads`` and
``--return-wait`` (``--return-wait 0``: no adaptive wait); *off* is no batching.

in-process
    The MLP is loaded twice into one ``lc.ModelRegistry``: once plainly (*off*)
    and once with ``batching=lc.BatchingPolicy(max_batch_size=32,
    allowed_batch_sizes=...)`` (*on*); the ceiling's MLP beside them, batched as *on*.
    N threads call
    ``registry.predict(name, x)`` with one row back to back, each request
    timed with ``time.perf_counter_ns``; every exception a request raises
    counts as a failed request of the version it went to. For *on*, the mean
    requests per batch is the change of the version's ``BatchingStatistics``
    over its measured seconds.

    Rounds: each of ``--rounds`` rounds is one child process that measures, for
    each N, off, on and the ceiling in turns: the N threads stay up and switch
    versions together, each version ``--slices`` times (8) for a slice of its
    ``--seconds`` after the same share of ``--warmup`` unmeasured, the order of
    the three reversed every other turn (off, on, ceiling, ceiling, on, off,
    ...). The machine's speed drifts by more than batching changes a lone
    caller's time within the seconds of a phase; measured in turns a fraction
    of a second apart, off and on see the same machine, and the first round
    starts with off, the next with on. One child per round rather than per
    phase: a child pays a TensorFlow import and three loads with warm-ups.

serve
    The MLP is written once by ``model.export()`` (a SavedModel) as version 1
    of two base paths, and two ``lifecycle serve`` processes on 127.0.0.1
    serve it, started and stopped as ``serve.py`` does (the ``lifecycle``
    command line in a subprocess, free ports, ready once the benchmark's
    request is answered, stopped by PID): *off* plainly, *on* with
    ``--enable_batching --max_batch_size 32 --allowed_batch_sizes ...`` (the
    batching flags apply to every model of a server, hence two servers). A
    third serves the ceiling's MLP with *on*'s flags. All run with
    ``--file_system_poll_wait_seconds 0`` and ``--port 0`` (no version polling,
    no gRPC). The load is a Locust child per round and N: N ``FastHttpUser``s
    with no wait time sending the TensorFlow Serving REST request ``POST
    /v1/models/mlp:predict`` with ``{"instances": [[256 floats]]}``, all to
    one server at a time, the three servers taking turns as in process
    (``--slices`` turns each of a share of ``--warmup`` unmeasured and of
    ``--seconds`` measured, the order reversed every other turn, off first in
    odd rounds and on first in even ones). Each request is timed by Locust
    (send to body read) and counts for the server it was sent to: measured if
    answered within that server's measured slices, failed if it raises, is not
    answered 200 or is still unanswered at the end, in the warm-up too.
    *on*'s requests per batch is the change of the version's batching counters
    in the admin API (``GET /v1/admin/models/mlp``) over its measured slices;
    the server's CPU time per request and the load generator's CPU share over
    them are shown too (psutil, as in ``serve.py``). The servers stay up.

Both parts also measure a *ceiling* for each N, in turns with off and on:
the same path (the registry, or a third ``lifecycle serve`` process) serving
the same MLP at ``--ceiling-units`` (16) wide, batched as *on*: a model
whose call costs next to nothing, so its requests/s is about the most
batching can reach on that path, where only the per-request costs (the HTTP
exchange, the lease, the batcher) are left. A costlier model only lowers
it, so on/off can hardly exceed ceiling/off; where ceiling/off is under a
target, the target is out of reach on that path and machine, whatever the
batcher does.

Each part prints a table (per N and off/on/ceiling: median over rounds with
min-max) and the ratios on/off and ceiling/off, taken within each round, then
their median and min-max, and checks the targets: with 16 clients, throughput
on/off >= 2.5x and p50 on/off <= 1.2x; with 1 client, throughput on/off >=
0.95x.

The serve part needs the server's and the load generator's extras::

    pip install -e '.[serve,bench,loadtest]'

Run (from the repository root)::

    python benchmarks/batching.py      # both parts, 6 rounds of 4 s phases: ~10 min
    python benchmarks/batching.py --parts in-process
    # a quick look, ~1.5 min:
    python benchmarks/batching.py --rounds 1 --seconds 1 --units 256 --clients 1,4
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import _harness
import serve
from _harness import MIB, ChildOutcome, fmt
from hot_swap import INPUT_DIM, OUTPUTS, RequestThreads, build_mlp, mlp_params, percentiles_us

# The order of off and on in a round; rounds alternate between the two.
VARIANTS = ("off-first", "on-first")
MODES = ("off", "on")
# The same path with a model that costs next to nothing, batched as on: measured in turns
# with off and on of each N.
CEILING = "ceiling"
PARTS = ("in-process", "serve")
MAX_BATCH_SIZE = 32
ALLOWED_BATCH_SIZES = "1,2,4,8,16,32"
# The targets: (clients, throughput ratio at least, p50 ratio at most).
TARGETS = ((16, 2.5, 1.2), (1, 0.95, None))
HEADER = [
    "clients / batching",
    "requests/s",
    "p50 µs",
    "p99 µs",
    "requests/batch",
    "failed requests",
]
RATIO_HEADER = ["clients", "throughput on/off", "p50 on/off", "p99 on/off", "ceiling/off"]
# The server part's table: the columns above, the server's and the load generator's CPU.
SERVE_HEADER = [*HEADER, "server CPU ms/request", "load gen CPU %"]
# The admin API path of the served model's versions (their batching counters).
ADMIN_STATUS_PATH = f"/v1/admin/models/{serve.MODEL_NAME}"


# --------------------------------------------------------------------------- child


def round_modes(off_first: bool) -> tuple[str, ...]:
    """The order of one N's modes in a round's first turn: off and on (alternating), the ceiling."""
    return (*(MODES if off_first else MODES[::-1]), CEILING)


def measure_modes(
    registry: Any, modes: tuple[str, ...], request: Any, clients: int, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """``clients`` threads calling ``registry.predict`` on each of ``modes`` in turn; per mode.

    The threads stay up; each mode's ``--seconds`` are measured in ``--slices``
    slices, the modes taking turns slice by slice (their order reversed every
    other turn), each slice after its share of ``--warmup`` unmeasured. So a
    mode's figures and the next mode's are a fraction of a second apart, and
    the machine's drift over the seconds of a phase falls on all modes alike.
    """
    import numpy as np

    def serve(index: int) -> object:
        return registry.predict(modes[index], request)

    def batching(mode: str) -> Any:
        return registry.status(mode)[0].batching

    threads = RequestThreads(serve, clients, by_phase=True)
    seconds = dict.fromkeys(modes, 0.0)
    # The change of each batched mode's counters over its measured slices.
    counted = {mode: [0, 0, 0] for mode in modes if batching(mode) is not None}
    threads.phase = 0
    threads.start()
    try:
        for turn in range(args.slices):
            for mode in modes if turn % 2 == 0 else modes[::-1]:
                threads.phase = modes.index(mode)
                time.sleep(args.warmup / args.slices)
                before = batching(mode)
                started = time.perf_counter()
                threads.recording = True
                time.sleep(args.seconds / args.slices)
                threads.recording = False
                seconds[mode] += time.perf_counter() - started
                after = batching(mode)
                if mode in counted:
                    change = (
                        after.batches - before.batches,
                        after.requests - before.requests,
                        after.padded_rows - before.padded_rows,
                    )
                    counted[mode] = [a + b for a, b in zip(counted[mode], change, strict=True)]
    finally:
        threads.stop()

    workers = threads.workers
    latencies = np.concatenate([np.frombuffer(w.latencies, dtype=np.int64) for w in workers])
    phases = np.concatenate([np.frombuffer(w.phases, dtype=np.int8) for w in workers])
    failed = np.concatenate([np.frombuffer(w.failed_phases, dtype=np.int8) for w in workers])
    results = {}
    for index, mode in enumerate(modes):
        mine = latencies[phases == index]
        result: dict[str, Any] = {
            "requests_per_second": mine.size / seconds[mode],
            **percentiles_us(mine),
            "failed_requests": int(np.count_nonzero(failed == index)),
            # A worker's errors are not kept by mode: those of all, where this mode failed.
            "errors": [e for w in workers for e in w.errors][:5] if (failed == index).any() else [],
        }
        if mode in counted:
            batches, requests, padded = counted[mode]
            result["requests_per_batch"] = requests / batches if batches else None
            result["padded_rows_per_batch"] = padded / batches if batches else None
        results[mode] = result
    return results


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # Imported here so the parent never loads TensorFlow.
    import numpy as np

    import lifecycle as lc

    request = np.random.default_rng(0).standard_normal((1, INPUT_DIM), dtype=np.float32)
    # The policy's defaults unless given.
    given = {"num_batch_threads": args.num_batch_threads, "return_wait": args.return_wait}
    options = {name: value for name, value in given.items() if value is not None}
    policy = lc.BatchingPolicy(
        max_batch_size=MAX_BATCH_SIZE,
        batch_timeout_micros=args.batch_timeout_micros,
        allowed_batch_sizes=args.allowed_batch_sizes,
        **options,
    )
    registry = lc.ModelRegistry(name="bench")

    def factory() -> Any:
        return build_mlp(args.units)

    model_bytes = registry.load("off", 1, factory, warmup=request).bytes
    registry.load("on", 1, factory, warmup=request, batching=policy)
    registry.load(
        CEILING, 1, lambda: build_mlp(args.ceiling_units), warmup=request, batching=policy
    )
    modes = round_modes(variant == "off-first")
    phases: dict[str, dict[str, Any]] = {}
    try:
        for clients in args.clients:
            measured = measure_modes(registry, modes, request, clients, args)
            phases.update({f"{clients}/{mode}": result for mode, result in measured.items()})
    finally:
        registry.close()
    return {"variant": variant, "model_bytes": model_bytes, "phases": phases}


# ------------------------------------------------------------- parent: in-process


def child_options(args: argparse.Namespace) -> list[str]:
    return [
        *("--seconds", str(args.seconds), "--warmup", str(args.warmup)),
        *("--slices", str(args.slices)),
        *("--units", str(args.units), "--clients", ",".join(map(str, args.clients))),
        *("--ceiling-units", str(args.ceiling_units)),
        *("--allowed-batch-sizes", ",".join(map(str, args.allowed_batch_sizes))),
        *("--batch-timeout-micros", str(args.batch_timeout_micros)),
        *(
            ()
            if args.num_batch_threads is None
            else ("--num-batch-threads", str(args.num_batch_threads))
        ),
        *(() if args.return_wait is None else ("--return-wait", str(args.return_wait))),
    ]


def run_rounds(args: argparse.Namespace) -> list[ChildOutcome]:
    """One child per round, alternating the order of off and on; their outcomes."""
    outcomes = []
    for index in range(args.rounds):
        variant = VARIANTS[index % 2]
        print(f"round {index + 1}/{args.rounds} ({variant}) ...", file=sys.stderr, flush=True)
        outcome = _harness.spawn_child(__file__, variant, child_options(args), args.timeout)
        status = "ok" if outcome.error is None else "FAILED"
        print(f"  {status} in {outcome.seconds:.1f} s", file=sys.stderr, flush=True)
        outcomes.append(outcome)
    return outcomes


# ------------------------------------------------------------------ parent: serve


def server_flags(mode: str, args: argparse.Namespace) -> list[str]:
    """A server's flags beyond ``serve.py``'s (ports, model, base path): on and ceiling batch."""
    flags = ["--file_system_poll_wait_seconds", "0"]
    if mode in ("on", CEILING):
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


def batching_counters(url: str) -> tuple[int, int] | None:
    """``(batches, requests)`` of the served version (admin API); None if it does not batch."""
    try:
        with urllib.request.urlopen(url + ADMIN_STATUS_PATH, timeout=10.0) as response:
            body = json.loads(response.read())
        stats = body["versions"][0]["batching"]
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise RuntimeError(f"reading the batching counters at {url} failed: {error!r}") from error
    return None if stats is None else (stats["batches"], stats["requests"])


def microseconds(ms: float | None) -> float | None:
    return None if ms is None else 1000 * ms


class ServerSlices:
    """One server's CPU time and batching counters, summed over its measured slices."""

    def __init__(self, server: serve.Server) -> None:
        import psutil

        self.server = server
        self._process = psutil.Process(server.process.pid)
        self._batched = server.variant != "off"
        self.cpu_seconds = 0.0
        self.batches = self.requests = 0
        self._cpu: float | None = None
        self._counters: tuple[int, int] | None = None

    def open(self) -> None:
        self._cpu = sum(self._process.cpu_times()[:2])
        self._counters = batching_counters(self.server.url) if self._batched else None

    def close(self) -> None:
        if self._cpu is not None:
            self.cpu_seconds += sum(self._process.cpu_times()[:2]) - self._cpu
        closed = batching_counters(self.server.url) if self._batched else None
        if self._counters is not None and closed is not None:
            self.batches += closed[0] - self._counters[0]
            self.requests += closed[1] - self._counters[1]
        self._cpu = self._counters = None

    def requests_per_batch(self) -> float | None:
        if not self._batched or not self.batches:
            return None
        return self.requests / self.batches


def serve_turns(
    servers: list[serve.Server], clients: int, args: argparse.Namespace, logs: Path
) -> dict[str, dict[str, Any]]:
    """``clients`` Locust users taking turns between ``servers`` (one load child); per variant.

    Keys as in-process phases'.
    """
    for server in servers:
        server.check_alive()
    slices = [ServerSlices(server) for server in servers]
    command = [sys.executable, serve.__file__, "--variant", "load", "--clients", str(clients)]
    command += ["--url", ",".join(server.url for server in servers)]
    command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    command += ["--slices", str(args.slices)]

    def on_line(line: str) -> None:
        marker, _, index = line.partition(" ")
        if marker == serve.MEASURING:
            slices[int(index)].open()
        elif marker == serve.MEASURED:
            slices[int(index)].close()

    log = logs / "load-turns.log"
    try:
        result = serve.run_load_child(command, log, args.timeout, on_line, "taking turns")
    except RuntimeError:
        for server in servers:  # a server that died says so first
            server.check_alive()
        raise
    for server in servers:
        server.check_alive()
    phases = {}
    for measured, loaded in zip(slices, result["servers"], strict=True):
        requests = loaded["requests"]
        phases[measured.server.variant] = {
            "requests_per_second": loaded["requests_per_second"],
            "p50_us": microseconds(loaded["p50_ms"]),
            "p99_us": microseconds(loaded["p99_ms"]),
            "requests_per_batch": measured.requests_per_batch(),
            "failed_requests": loaded["failed"],
            "errors": loaded["errors"],
            "server_cpu_ms": 1000 * measured.cpu_seconds / requests if requests else None,
            "load_cpu_percent": 100 * loaded["load_cpu_share"],
            "load_cpu_warning": loaded["load_cpu_warning"],
        }
    return phases


def start_servers(args: argparse.Namespace, work: Path, logs: Path) -> list[serve.Server]:
    """Export the MLP as version 1 of a base path per server; start *off*, *on* and *ceiling*."""
    print("exporting the models for the servers ...", file=sys.stderr, flush=True)
    models = {}
    for units in dict.fromkeys((args.units, args.ceiling_units)):
        models[units] = work / f"model-{units}"
        options = ["--units", str(units), "--out", str(models[units])]
        exported = _harness.spawn_child(serve.__file__, "export", options, args.timeout)
        if exported.result is None:
            raise RuntimeError(f"exporting the {units}-unit model failed: {exported.error}")
    servers = []
    modes = (*MODES, CEILING)
    for mode, port in zip(modes, serve.free_ports(len(modes)), strict=True):
        model = models[args.ceiling_units if mode == CEILING else args.units]
        base = work / f"base-{mode}"
        shutil.copytree(model, base / "1")
        flags = server_flags(mode, args)
        servers.append(serve.start_server(mode, port, model, base, 0.0, logs, flags))
    return servers


def run_serve_rounds(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str | None]:
    """The server part: each round's phases (keys ``"N/mode"``), and why it failed if it did.

    Every server started is stopped at the end (by its PID), also on error; the
    logs are kept on failure.
    """
    work = Path(tempfile.mkdtemp(prefix="lifecycle-batching-bench-"))
    logs = work / "logs"
    logs.mkdir()
    servers: list[serve.Server] = []
    rounds: list[dict[str, Any]] = []
    try:
        servers = start_servers(args, work, logs)
        for server in servers:
            seconds = serve.wait_ready(server, args.timeout)
            print(f"server {server.variant} ready after {seconds:.1f} s", file=sys.stderr)
        by_mode = {s.variant: s for s in servers}
        for index in range(args.rounds):
            phases: dict[str, Any] = {}
            rounds.append(phases)
            for clients in args.clients:
                print(
                    f"serve round {index + 1}/{args.rounds}: {clients} clients ...",
                    file=sys.stderr,
                    flush=True,
                )
                modes = round_modes(index % 2 == 0)
                measured = serve_turns([by_mode[mode] for mode in modes], clients, args, logs)
                phases.update({f"{clients}/{mode}": result for mode, result in measured.items()})
    except RuntimeError as error:
        return rounds, f"{error}\nlogs and models kept in {work}"
    finally:
        serve.stop_processes([s.process for s in servers])
    shutil.rmtree(work, ignore_errors=True)
    return rounds, None


# ----------------------------------------------------------------- parent: report


def spread(values: list[float], spec: str, suffix: str = "") -> str:
    """``median (min-max)`` of ``values``, or ``-`` when there are none."""
    if not values:
        return "-"
    return (
        f"{fmt(statistics.median(values), spec, suffix)} "
        f"({fmt(min(values), spec)}-{fmt(max(values), spec, suffix)})"
    )


def values(phases: list[dict[str, Any]], key: str) -> list[float]:
    return [p[key] for p in phases if p.get(key) is not None]


def ratios(rounds: list[dict[str, Any]], clients: int, key: str, mode: str = "on") -> list[float]:
    """Per round, ``key`` of ``mode`` (batching on) over ``key`` of batching off at ``clients``."""
    found = []
    for phases in rounds:
        off, other = phases.get(f"{clients}/off", {}), phases.get(f"{clients}/{mode}", {})
        if off.get(key) and other.get(key) is not None:
            found.append(other[key] / off[key])
    return found


def table_rows(
    rounds: list[dict[str, Any]], clients: list[int], served: bool = False
) -> list[list[str]]:
    """A row per (N, off/on/ceiling); if ``served``, the server's and the load generator's CPU."""
    rows = []
    for count in clients:
        for mode in (*MODES, CEILING):
            phases = [r[f"{count}/{mode}"] for r in rounds if f"{count}/{mode}" in r]
            row = [
                f"{count} / {mode}",
                spread(values(phases, "requests_per_second"), ",.0f"),
                spread(values(phases, "p50_us"), ".0f"),
                spread(values(phases, "p99_us"), ".0f"),
                spread(values(phases, "requests_per_batch"), ".1f") if mode != "off" else "-",
                str(sum(p["failed_requests"] for p in phases)) if phases else "FAILED",
            ]
            if served:
                row.append(spread(values(phases, "server_cpu_ms"), ".2f"))
                row.append(spread(values(phases, "load_cpu_percent"), ".0f"))
            rows.append(row)
    return rows


def ratio_rows(rounds: list[dict[str, Any]], clients: list[int]) -> list[list[str]]:
    return [
        [
            str(count),
            spread(ratios(rounds, count, "requests_per_second"), ".2f", "x"),
            spread(ratios(rounds, count, "p50_us"), ".2f", "x"),
            spread(ratios(rounds, count, "p99_us"), ".2f", "x"),
            spread(ratios(rounds, count, "requests_per_second", CEILING), ".2f", "x"),
        ]
        for count in clients
    ]


def target_lines(rounds: list[dict[str, Any]], clients: list[int]) -> list[str]:
    """Whether each of the issue's targets is met by the median ratios; failed requests."""
    lines = []
    for count, throughput_min, p50_max in TARGETS:
        if count not in clients:
            continue
        throughput = ratios(rounds, count, "requests_per_second")
        p50 = ratios(rounds, count, "p50_us")
        if not throughput:
            lines.append(f"  {count} clients: not measured")
            continue
        checks = [("throughput", statistics.median(throughput), throughput_min, ">=")]
        if p50_max is not None and p50:
            checks.append(("p50", statistics.median(p50), p50_max, "<="))
        for label, value, bound, op in checks:
            met = value >= bound if op == ">=" else value <= bound
            lines.append(
                f"  {count} clients, {label} on/off {op} {bound:g}x: "
                f"{'met' if met else 'MISSED'} (median {value:.3f}x)"
            )
            if label == "throughput":
                lines += ceiling_note(rounds, count, bound)
    failed = sum(p["failed_requests"] for phases in rounds for p in phases.values())
    lines.append(f"  no failed request: {'met' if failed == 0 else 'MISSED'} ({failed} failed)")
    return lines


def ceiling_note(rounds: list[dict[str, Any]], clients: int, target: float) -> list[str]:
    """A line if the ceiling's throughput over off's is under ``target``: out of reach."""
    ceiling = ratios(rounds, clients, "requests_per_second", CEILING)
    median = statistics.median(ceiling) if ceiling else None
    if median is None or median >= target:
        return []
    return [f"    out of reach on this path: the ceiling served {median:.2f}x off's requests/s"]


def print_part(
    title: str,
    table: tuple[list[str], list[list[str]]],
    legend: list[str],
    rounds: list[dict[str, Any]],
    clients: list[int],
) -> None:
    """One part's title, table (header, rows) and legend, the on/off ratios and the targets."""
    print(f"\n{title}\n")
    print(_harness.render_table(*table))
    print()
    print("\n".join(legend))
    print()
    print(_harness.render_table(RATIO_HEADER, ratio_rows(rounds, clients)))
    print()
    print("ratios: on (ceiling) over off of the same round, median over rounds (min-max)")
    print("targets:")
    print("\n".join(target_lines(rounds, clients)))
    errors = list(dict.fromkeys(e for r in rounds for p in r.values() for e in p["errors"]))
    if errors:
        print(f"errors: {errors[:5]}")


def describe_run(args: argparse.Namespace, load_start: str) -> list[str]:
    params = mlp_params(args.units)
    timeout = args.batch_timeout_micros
    lines = [
        *_harness.machine_lines(),
        f"load:     uptime load average {load_start} at the start",
        f"served:   MLP {INPUT_DIM}-{args.units}-{args.units}-{OUTPUTS}, {params:,} params "
        f"({params * 4 / MIB:.1f} MiB weights); N clients sending 1 row back to back",
        f"batching: on = max_batch_size {MAX_BATCH_SIZE}, allowed batch sizes "
        f"{args.allowed_batch_sizes or 'none (no padding)'}, "
        f"{f'timeout {timeout} µs' if timeout else 'no timeout'}, num_batch_threads "
        f"{args.num_batch_threads or 'the default (half the cores, at least 1)'}, return_wait "
        f"{'the default (1.0)' if args.return_wait is None else args.return_wait}; off = none",
        f"rounds:   {args.rounds} per part, each measuring every phase (N, off/on/ceiling) for "
        f"{args.seconds:g} s after {args.warmup:g} s of warm-up",
        f"ceiling:  the same path serving the MLP at {args.ceiling_units} units, batched as on "
        "(a call that costs next to nothing: about the most batching can reach there)",
    ]
    if "in-process" in args.parts:
        lines.append(
            "in-process: a child process per round; N threads calling registry.predict(name, x)"
            "; on: BatchingPolicy(...), off: no policy; off, on and the ceiling of one N take "
            f"turns in {args.slices} slices each ({args.seconds / args.slices:g} s measured "
            f"after {args.warmup / args.slices:g} s), their order reversed every other turn"
        )
    if "serve" in args.parts:
        lines.append(
            "serve:    three `lifecycle serve` processes on model.export() SavedModels, on with "
            "--enable_batching; N Locust FastHttpUsers, no wait, batch-1 REST :predict, sent to "
            "the three servers in turns as in process (one Locust child per round and N)"
        )
    return lines


IN_PROCESS_LEGEND = [
    "each cell: median over rounds (min-max); failed requests: the sum over rounds",
    "requests/batch: requests served per call of the model while measuring (on, ceiling)",
]
SERVE_LEGEND = [
    "each cell: median over rounds (min-max); failed requests: the sum over rounds,",
    "  warm-ups included; latencies timed by Locust (send to body read)",
    "requests/batch: change of the batching counters (admin API) over the server's measured",
    "  slices (on, ceiling)",
    "server CPU: the server process's user+system time over its measured slices / requests",
    "load gen CPU %: the Locust child's CPU time over the server's slices, % of one core",
]


def run_parent(args: argparse.Namespace) -> int:
    # SIGTERM ends the run through the server part's `finally`, which stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    load_start = serve.load_average()
    failures: list[str] = []
    in_process: list[dict[str, Any]] = []
    if "in-process" in args.parts:
        outcomes = run_rounds(args)
        in_process = [o.result["phases"] for o in outcomes if o.result is not None]
        failures += [f"round ({o.variant}) failed: {o.error}" for o in outcomes if o.error]
    served: list[dict[str, Any]] = []
    if "serve" in args.parts:
        served, error = run_serve_rounds(args)
        if error is not None:
            failures.append(f"server part failed: {error}")

    print("\n".join(describe_run(args, load_start)))
    if "in-process" in args.parts:
        table = (HEADER, table_rows(in_process, args.clients))
        title = "in-process (registry.predict):"
        print_part(title, table, IN_PROCESS_LEGEND, in_process, args.clients)
    if "serve" in args.parts:
        legend = list(SERVE_LEGEND)
        if any(p["load_cpu_warning"] for r in served for p in r.values()):
            legend.append("Locust warned that its CPU use was over 90 %: it limited some phases")
        table = (SERVE_HEADER, table_rows(served, args.clients, served=True))
        title = "through lifecycle serve (TF Serving REST :predict):"
        print_part(title, table, legend, served, args.clients)
    print(f"\nload average at the end: {serve.load_average()}")
    for failure in failures:
        print(f"\n{failure}", file=sys.stderr)
    return 1 if failures else 0


# ---------------------------------------------------------------------------- main


def parse_counts(
    parser: argparse.ArgumentParser, option: str, spec: str, empty: bool = False
) -> list[int]:
    """The positive integers of a comma-separated option (none only if ``empty``)."""
    try:
        counts = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        counts = [0]
    if (not counts and not empty) or min(counts, default=1) < 1:
        parser.error(f"{option} takes comma-separated positive integers; got {spec!r}")
    return list(dict.fromkeys(counts))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per phase")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="unmeasured seconds before each phase"
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}"
    )
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each part")
    parser.add_argument(
        "--slices",
        type=int,
        default=8,
        help="in-process: slices each phase is measured in, the modes taking turns",
    )
    parser.add_argument(
        "--clients", default="1,4,16", help="comma-separated numbers of client threads"
    )
    parser.add_argument(
        "--allowed-batch-sizes",
        default=ALLOWED_BATCH_SIZES,
        help=f"the policy's allowed_batch_sizes, ending at {MAX_BATCH_SIZE}; '' for no padding",
    )
    parser.add_argument(
        "--units", type=int, default=2048, help="hidden width (2048 gives 4.76M params)"
    )
    parser.add_argument(
        "--ceiling-units",
        type=int,
        default=16,
        help="hidden width of the ceiling's MLP (a call that costs next to nothing)",
    )
    parser.add_argument(
        "--batch-timeout-micros",
        type=int,
        default=0,
        help="the policy's batch_timeout_micros (default: 0, no wait)",
    )
    parser.add_argument(
        "--num-batch-threads",
        type=int,
        default=None,
        help="the policy's num_batch_threads (default: the policy's, half the cores)",
    )
    parser.add_argument(
        "--return-wait",
        type=float,
        default=None,
        help="the policy's return_wait (default: the policy's, 1.0); 0: no adaptive wait",
    )
    _harness.add_child_arguments(parser, VARIANTS, timeout=600.0)
    args = parser.parse_args(argv)

    if min(args.seconds, args.units, args.ceiling_units, args.timeout) <= 0 or args.warmup < 0:
        parser.error(
            "--seconds, --units, --ceiling-units and --timeout must be positive, "
            "--warmup not negative"
        )
    if args.rounds < 1 or args.slices < 1:
        parser.error("--rounds and --slices must be 1 or more")
    if args.num_batch_threads is not None and args.num_batch_threads < 1:
        parser.error("--num-batch-threads must be 1 or more")
    if args.batch_timeout_micros < 0:
        parser.error("--batch-timeout-micros must not be negative")
    if args.return_wait is not None and not 0 <= args.return_wait < float("inf"):
        parser.error("--return-wait must be a finite number >= 0")
    args.clients = parse_counts(parser, "--clients", args.clients)
    sizes = parse_counts(parser, "--allowed-batch-sizes", args.allowed_batch_sizes, empty=True)
    if sizes and (sizes != sorted(sizes) or sizes[-1] != MAX_BATCH_SIZE):
        parser.error(f"--allowed-batch-sizes must ascend to {MAX_BATCH_SIZE}; got {sizes}")
    args.allowed_batch_sizes = tuple(sizes)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not args.parts or not set(args.parts) <= set(PARTS):
        parser.error(f"--parts takes a subset of {','.join(PARTS)}; got {args.parts}")
    if args.variant is None and "serve" in args.parts:
        missing = [m for m in ("locust", "uvicorn") if importlib.util.find_spec(m) is None]
        if missing:
            parser.error(
                f"the serve part needs {', '.join(missing)}: pip install -e "
                "'.[serve,bench,loadtest]', or run --parts in-process"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
