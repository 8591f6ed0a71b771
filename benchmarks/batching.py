"""Request batching benchmark: N concurrent batch-1 clients, registry batching off and on.

The served MLP of ``hot_swap.py`` (Input(256) -> Dense(units, relu) ->
Dense(units, relu) -> Dense(16), no optimizer; ``--units 2048`` gives 4.76M
params) is loaded twice into one ``lc.ModelRegistry``: once plainly (*off*) and
once with ``batching=lc.BatchingPolicy(max_batch_size=32,
allowed_batch_sizes=(1, 2, 4, 8, 16, 32))`` (*on*, no batch timeout;
``--allowed-batch-sizes ""`` for no padding). For each client count N of
``--clients`` (1, 4, 16), N threads call ``registry.predict(name, x)`` with
one row back to back, first for
``--warmup`` seconds unmeasured, then for ``--seconds`` seconds, each request
timed with ``time.perf_counter_ns``; every exception a request raises counts as
a failed request. For *on*, the mean requests per batch is the change of the
version's ``BatchingStatistics`` over the measured seconds.

Rounds: the machine is shared and drifts, so each of ``--rounds`` rounds is one
child process that measures every (N, off/on) phase, off and on of one N back
to back, with the order of off and on alternating between rounds. One child per
round rather than per phase: a phase only starts and joins threads, while a
child pays a TensorFlow import and two loads with warm-ups; with both variants
in one child, off and on of one N run seconds apart and see nearly the same
machine. The ratios on/off are taken per round and their median reported.

Run::

    python benchmarks/batching.py
    python benchmarks/batching.py --rounds 1 --seconds 1 --units 256 --clients 1,4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import _harness
from _harness import MIB, ChildOutcome, fmt
from hot_swap import INPUT_DIM, OUTPUTS, RequestThreads, build_mlp, mlp_params, percentiles_us

# The order of off and on in a round; rounds alternate between the two.
VARIANTS = ("off-first", "on-first")
MODES = ("off", "on")
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
RATIO_HEADER = ["clients", "throughput on/off", "p50 on/off", "p99 on/off"]


# --------------------------------------------------------------------------- child


def measure_phase(
    registry: Any, name: str, request: Any, clients: int, args: argparse.Namespace
) -> dict[str, Any]:
    """``clients`` threads calling ``registry.predict(name, request)``; what they saw."""
    import numpy as np

    def serve() -> object:
        return registry.predict(name, request)

    def batching() -> Any:
        return registry.status(name)[0].batching

    threads = RequestThreads(serve, clients)
    threads.start()
    time.sleep(args.warmup)
    before = batching()
    started = time.perf_counter()
    threads.recording = True
    time.sleep(args.seconds)
    threads.recording = False
    ended = time.perf_counter()
    after = batching()
    threads.stop()

    workers = threads.workers
    latencies = np.concatenate([np.frombuffer(w.latencies, dtype=np.int64) for w in workers])
    result: dict[str, Any] = {
        "requests_per_second": latencies.size / (ended - started),
        **percentiles_us(latencies),
        "failed_requests": sum(w.failures for w in workers),
        "requests_total": sum(w.requests for w in workers),
        "errors": [e for w in workers for e in w.errors][:5],
    }
    if after is not None:
        batches = after.batches - before.batches
        requests = after.requests - before.requests
        result["requests_per_batch"] = requests / batches if batches else None
        result["padded_rows_per_batch"] = (
            (after.padded_rows - before.padded_rows) / batches if batches else None
        )
    return result


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # Imported here so the parent never loads TensorFlow.
    import numpy as np

    import lifecycle as lc

    request = np.random.default_rng(0).standard_normal((1, INPUT_DIM), dtype=np.float32)
    policy = lc.BatchingPolicy(
        max_batch_size=MAX_BATCH_SIZE, allowed_batch_sizes=args.allowed_batch_sizes
    )
    registry = lc.ModelRegistry(name="bench")

    def factory() -> Any:
        return build_mlp(args.units)

    model_bytes = registry.load("off", 1, factory, warmup=request).bytes
    registry.load("on", 1, factory, warmup=request, batching=policy)
    modes = MODES if variant == "off-first" else MODES[::-1]
    phases: dict[str, dict[str, Any]] = {}
    try:
        for clients in args.clients:
            for mode in modes:
                phases[f"{clients}/{mode}"] = measure_phase(registry, mode, request, clients, args)
    finally:
        registry.close()
    return {"variant": variant, "model_bytes": model_bytes, "phases": phases}


# -------------------------------------------------------------------------- parent


def child_options(args: argparse.Namespace) -> list[str]:
    return [
        *("--seconds", str(args.seconds), "--warmup", str(args.warmup)),
        *("--units", str(args.units), "--clients", ",".join(map(str, args.clients))),
        *("--allowed-batch-sizes", ",".join(map(str, args.allowed_batch_sizes))),
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


def ratios(rounds: list[dict[str, Any]], clients: int, key: str) -> list[float]:
    """Per round, ``key`` of batching on over ``key`` of batching off at ``clients``."""
    found = []
    for phases in rounds:
        off, on = phases.get(f"{clients}/off", {}), phases.get(f"{clients}/on", {})
        if off.get(key) and on.get(key) is not None:
            found.append(on[key] / off[key])
    return found


def table_rows(rounds: list[dict[str, Any]], clients: list[int]) -> list[list[str]]:
    rows = []
    for count in clients:
        for mode in MODES:
            phases = [r[f"{count}/{mode}"] for r in rounds if f"{count}/{mode}" in r]
            rows.append(
                [
                    f"{count} / {mode}",
                    spread(values(phases, "requests_per_second"), ",.0f"),
                    spread(values(phases, "p50_us"), ".0f"),
                    spread(values(phases, "p99_us"), ".0f"),
                    spread(values(phases, "requests_per_batch"), ".1f") if mode == "on" else "-",
                    str(sum(p["failed_requests"] for p in phases)) if phases else "FAILED",
                ]
            )
    return rows


def ratio_rows(rounds: list[dict[str, Any]], clients: list[int]) -> list[list[str]]:
    return [
        [
            str(count),
            spread(ratios(rounds, count, "requests_per_second"), ".2f", "x"),
            spread(ratios(rounds, count, "p50_us"), ".2f", "x"),
            spread(ratios(rounds, count, "p99_us"), ".2f", "x"),
        ]
        for count in clients
    ]


def target_lines(rounds: list[dict[str, Any]], clients: list[int]) -> list[str]:
    """Whether each of the issue's targets is met by the median ratios measured."""
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
        if p50_max is not None:
            checks.append(("p50", statistics.median(p50), p50_max, "<="))
        for label, value, bound, op in checks:
            met = value >= bound if op == ">=" else value <= bound
            lines.append(
                f"  {count} clients, {label} on/off {op} {bound:g}x: "
                f"{'met' if met else 'MISSED'} (median {value:.3f}x)"
            )
    return lines


def describe_run(args: argparse.Namespace, load_before: float, load_after: float) -> list[str]:
    params = mlp_params(args.units)
    return [
        *_harness.machine_lines(),
        f"load:     1-minute load average {load_before:.2f} before, {load_after:.2f} after",
        f"served:   MLP {INPUT_DIM}-{args.units}-{args.units}-{OUTPUTS}, {params:,} params "
        f"({params * 4 / MIB:.1f} MiB weights); N client threads calling "
        "registry.predict(name, x) with 1 row back to back",
        f"batching: on = BatchingPolicy(max_batch_size={MAX_BATCH_SIZE}, "
        f"allowed_batch_sizes={args.allowed_batch_sizes}), no timeout; off = no policy",
        f"rounds:   {args.rounds} child processes, each measuring every phase for "
        f"{args.seconds:g} s after {args.warmup:g} s of warm-up, off and on of one N back "
        "to back, their order alternating between rounds",
    ]


def run_parent(args: argparse.Namespace) -> int:
    load_before = os.getloadavg()[0]
    outcomes = run_rounds(args)
    load_after = os.getloadavg()[0]
    rounds = [o.result["phases"] for o in outcomes if o.result is not None]

    legend = [
        "each cell: median over rounds (min-max); failed requests: the sum over rounds",
        "requests/batch: requests served per call of the model while measuring (on only)",
    ]
    _harness.print_report(
        describe_run(args, load_before, load_after),
        HEADER,
        table_rows(rounds, args.clients),
        legend,
    )
    print()
    print(_harness.render_table(RATIO_HEADER, ratio_rows(rounds, args.clients)))
    print()
    print("ratios: on over off of the same round, median over rounds (min-max)")
    print("targets:")
    print("\n".join(target_lines(rounds, args.clients)))
    errors = [e for r in rounds for p in r.values() for e in p["errors"]]
    if errors:
        print(f"errors: {errors[:5]}")
    failed = [o for o in outcomes if o.error is not None]
    for outcome in failed:
        print(f"\nround ({outcome.variant}) failed: {outcome.error}", file=sys.stderr)
    return 1 if failed else 0


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
    parser.add_argument("--rounds", type=int, default=6, help="rounds (child processes)")
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
    _harness.add_child_arguments(parser, VARIANTS, timeout=600.0)
    args = parser.parse_args(argv)

    if args.seconds <= 0 or args.warmup < 0 or args.units < 1 or args.timeout <= 0:
        parser.error("--seconds, --units and --timeout must be positive, --warmup not negative")
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    args.clients = parse_counts(parser, "--clients", args.clients)
    sizes = parse_counts(parser, "--allowed-batch-sizes", args.allowed_batch_sizes, empty=True)
    if sizes and (sizes != sorted(sizes) or sizes[-1] != MAX_BATCH_SIZE):
        parser.error(f"--allowed-batch-sizes must ascend to {MAX_BATCH_SIZE}; got {sizes}")
    args.allowed_batch_sizes = tuple(sizes)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
