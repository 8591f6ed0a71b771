"""Loop-training benchmark: does memory come back when a model is dropped?

Builds, fits and drops an MLP (Input(784) -> Dense(units) -> Dense(units) ->
Dense(10), Adam, 2 fit steps on small synthetic numpy data) for ``--cycles``
cycles, once per way of dropping the model:

    (a) ``del model``
    (b) ``del model; keras.backend.clear_session(); gc.collect()``
    (c) ``lc.ManagedModel(inputs, outputs)`` + ``model.dispose()``, then ``del model``

Each variant runs in a fresh child process (this script re-invoked with
``--variant``), so one variant's leak cannot distort another's numbers. A
child samples its RSS (psutil) after every cycle and reports:

* RSS growth per cycle: least-squares slope of RSS over the cycles after the
  first ``--warmup`` ones (allocator and tracing caches settle during warm-up);
* time per cycle: mean wall time of a post-warm-up cycle, build to drop (the
  mean, so that a collection that runs every few cycles is paid in full);
* for (c), the median ``DisposeReport.release_seconds`` (dispose time without
  the final ``gc.collect()``) and ``bytes_released``.

A last child (``dispose``) measures ``dispose()`` of a wider MLP whose weights
plus Adam slots hold ``--dispose-mb`` MiB (100 by default): build, fit one step,
dispose, three times; it reports the median ``release_seconds``.

Rounds: the run is ``--rounds`` rounds (3 by default); each round runs every
variant in a fresh child, the order rotating between rounds (a b c dispose,
then b c dispose a, ...). The parent prints the machine and one table: each
cell is the median over the rounds (min-max), and the ratios (vs (b), vs (a))
are taken within each round, where the machine's drift cancels, then reported
as the median of the per-round ratios (min-max). It exits non-zero if a child
fails or times out, and names the failed children under the table.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/loop_training.py                         # 2.6M-param MLP, 30 cycles
    python benchmarks/loop_training.py --rounds 1 --cycles 8 --units 512  # quick, no slope
    python benchmarks/loop_training.py --variants a,c --timeout 300
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import _harness
from _harness import MIB

if TYPE_CHECKING:
    import numpy as np

# The workload of `lifecycle soak` (lifecycle.cli._soak_worker.build_mlp builds it). The parent
# does not import the package: that would load TensorFlow in it.
INPUT_DIM = 784
CLASSES = 10
BATCH_SIZE = 64

LOOP_VARIANTS = ("a", "b", "c")
DISPOSE_VARIANT = "dispose"
ALL_VARIANTS = (*LOOP_VARIANTS, DISPOSE_VARIANT)
LABELS = {
    "a": "(a) del model",
    "b": "(b) del + clear_session() + gc.collect()",
    "c": "(c) ManagedModel + dispose()",
}

STEPS_PER_CYCLE = 2
DISPOSE_REPEATS = 3
# Weights + the two Adam slots (m, v), float32.
BYTES_PER_PARAM = 4 * 3


def mlp_params(units: int) -> int:
    return (INPUT_DIM + 1) * units + (units + 1) * units + (units + 1) * CLASSES


def units_for_mib(mib: float) -> int:
    """Smallest width whose weights + Adam slots hold at least ``mib`` MiB."""
    params = mib * MIB / BYTES_PER_PARAM
    b = INPUT_DIM + 2 + CLASSES  # params(u) = u**2 + b*u + CLASSES
    units = math.ceil((-b + math.sqrt(b * b + 4 * (params - CLASSES))) / 2)
    return max(units, 1)


# --------------------------------------------------------------------------- child


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # Imported here so the parent never loads TensorFlow.
    import numpy as np

    rng = np.random.default_rng(0)
    samples = BATCH_SIZE * STEPS_PER_CYCLE
    x = rng.standard_normal((samples, INPUT_DIM), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=samples)
    if variant == DISPOSE_VARIANT:
        return measure_dispose(units_for_mib(args.dispose_mb), x[:BATCH_SIZE], y[:BATCH_SIZE])
    return measure_loop(variant, args.units, args.cycles, args.warmup, x, y)


def measure_loop(
    variant: str, units: int, cycles: int, warmup: int, x: np.ndarray, y: np.ndarray
) -> dict[str, Any]:
    import keras
    import psutil

    from lifecycle.cli._soak_worker import build_mlp

    process = psutil.Process()
    rss_mib: list[float] = []
    cycle_seconds: list[float] = []
    drop_seconds: list[float] = []
    release_seconds: list[float] = []
    collect_seconds: list[float] = []
    bytes_released: list[int] = []
    rss_start = process.memory_info().rss / MIB
    for _ in range(cycles):
        started = time.perf_counter()
        model = build_mlp(units, managed=variant == "c")
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
        fitted = time.perf_counter()
        if variant == "c":
            report = model.dispose()
            release_seconds.append(report.release_seconds)
            collect_seconds.append(report.collect_seconds)
            bytes_released.append(report.bytes_released)
        del model
        if variant == "b":
            keras.backend.clear_session()
            gc.collect()
        dropped = time.perf_counter()
        cycle_seconds.append(dropped - started)
        drop_seconds.append(dropped - fitted)
        rss_mib.append(process.memory_info().rss / MIB)

    measured = slice(warmup, None)
    result: dict[str, Any] = {
        "variant": variant,
        "warmup": warmup,
        "rss_start_mib": rss_start,
        "rss_mib": rss_mib,
        "growth_mib_per_cycle": slope(rss_mib[measured]),
        "seconds_per_cycle": statistics.fmean(cycle_seconds[measured]),
        "cycle_seconds": cycle_seconds,
        "drop_ms": 1000 * statistics.fmean(drop_seconds[measured]),
    }
    if variant == "c":
        result["release_ms"] = 1000 * statistics.median(release_seconds[measured])
        result["collect_ms"] = 1000 * statistics.median(collect_seconds[measured])
        result["released_mib"] = statistics.median(bytes_released[measured]) / MIB
    return result


def measure_dispose(units: int, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    from lifecycle.cli._soak_worker import build_mlp

    release_seconds: list[float] = []
    bytes_released: list[int] = []
    for _ in range(DISPOSE_REPEATS):
        model = build_mlp(units, managed=True)
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
        report = model.dispose()
        release_seconds.append(report.release_seconds)
        bytes_released.append(report.bytes_released)
        del model
    return {
        "variant": DISPOSE_VARIANT,
        "units": units,
        "params": mlp_params(units),
        "release_ms": 1000 * statistics.median(release_seconds),
        "release_ms_all": [1000 * s for s in release_seconds],
        "released_mib": statistics.median(bytes_released) / MIB,
    }


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index (nan if < 2 values)."""
    if len(values) < 2:
        return math.nan
    return statistics.linear_regression(range(len(values)), values).slope


# -------------------------------------------------------------------------- parent


def child_options(args: argparse.Namespace) -> list[str]:
    return [
        "--cycles",
        str(args.cycles),
        "--warmup",
        str(args.warmup),
        "--units",
        str(args.units),
        "--dispose-mb",
        str(args.dispose_mb),
    ]


def describe_run(args: argparse.Namespace) -> list[str]:
    params = mlp_params(args.units)
    dispose_units = units_for_mib(args.dispose_mb)
    dispose_params = mlp_params(dispose_units)
    return [
        *_harness.machine_lines(),
        f"workload: MLP {INPUT_DIM}-{args.units}-{args.units}-{CLASSES} + Adam, "
        f"{params:,} params ({params * BYTES_PER_PARAM / MIB:.1f} MiB weights + slots); "
        f"{args.cycles} cycles, slope and means over the last {args.cycles - args.warmup} "
        f"({args.warmup} warm-up); {STEPS_PER_CYCLE} fit steps of batch {BATCH_SIZE} per cycle",
        f"dispose:  MLP {INPUT_DIM}-{dispose_units}-{dispose_units}-{CLASSES} + Adam, "
        f"{dispose_params:,} params ({dispose_params * BYTES_PER_PARAM / MIB:.1f} MiB), "
        f"1 fit step, median of {DISPOSE_REPEATS} disposes",
        _harness.rounds_line(args.rounds),
    ]


def total_growth(result: Mapping[str, Any]) -> float | None:
    """RSS growth over the measured cycles, MiB: the last sample over the last warm-up one."""
    rss, warmup = result.get("rss_mib"), result.get("warmup")
    if not rss or warmup is None:
        return None
    return rss[-1] - (rss[warmup - 1] if warmup else result["rss_start_mib"])


def table_rows(rounds: _harness.Rounds, dispose_mb: float) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        label = LABELS.get(variant, f"(c) dispose() of a {dispose_mb:g} MiB model")
        if not rounds.succeeded(variant):
            rows.append([label, "FAILED", *["-"] * 8])
            continue
        rows.append(
            [
                label,
                rounds.cell(variant, "growth_mib_per_cycle", "+.2f"),
                rounds.cell(variant, "seconds_per_cycle", ".3f"),
                rounds.ratio_cell("seconds_per_cycle", variant, "b"),
                rounds.ratio_cell("seconds_per_cycle", variant, "a"),
                rounds.cell(variant, "drop_ms", ".1f"),
                rounds.cell(variant, "release_ms", ".1f"),
                rounds.cell(variant, "released_mib", ".1f"),
                rounds.cell(variant, lambda r: r["rss_mib"][-1] if "rss_mib" in r else None, ".0f"),
                rounds.cell(variant, total_growth, "+.1f"),
            ]
        )
    return rows


def run_parent(args: argparse.Namespace) -> int:
    rounds = _harness.run_rounds(
        __file__, args.variants, args.rounds, child_options(args), args.timeout
    )

    header = [
        "variant",
        "RSS growth MiB/cycle",
        "s/cycle",
        "vs (b)",
        "vs (a)",
        "drop ms",
        "dispose ms",
        "released MiB",
        "final RSS MiB",
        "growth MiB",
    ]
    legend = [
        "each cell: median over the rounds (min-max); vs (b), vs (a): s/cycle over that",
        "           variant's s/cycle in the same round, median of the per-round ratios",
        "drop ms:    mean time from the end of fit() to the model being dropped",
        "dispose ms: median DisposeReport.release_seconds (release, purge, drop references)",
        "growth MiB: RSS after the last cycle over RSS after the last warm-up cycle (a soak's",
        "            total: `--variants c --cycles 1000`)",
    ]
    _harness.print_report(describe_run(args), header, table_rows(rounds, args.dispose_mb), legend)
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument("--cycles", type=int, default=30, help="build-fit-drop cycles")
    parser.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="cycles left out of the slope and medians (clamped to cycles // 3)",
    )
    parser.add_argument(
        "--units", type=int, default=1264, help="hidden width (1264 gives 2.6M params)"
    )
    _harness.add_variants_argument(parser, ALL_VARIANTS)
    parser.add_argument(
        "--dispose-mb",
        type=float,
        default=100.0,
        help="MiB of weights + Adam slots of the model the `dispose` variant disposes",
    )
    _harness.add_child_arguments(parser, ALL_VARIANTS, timeout=1200.0, rounds=3)
    args = parser.parse_args(argv)

    if args.cycles < 3:
        parser.error("--cycles must be at least 3")
    if args.units < 1 or args.dispose_mb <= 0 or args.timeout <= 0:
        parser.error("--units, --dispose-mb and --timeout must be positive")
    args.warmup = max(0, min(args.warmup, args.cycles // 3))
    args.variants = _harness.parse_variants(parser, args.variants, ALL_VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
