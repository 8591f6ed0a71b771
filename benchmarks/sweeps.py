"""Sweep benchmark: memory of a KerasTuner search, plain or with the integration.

Runs a ``keras_tuner.RandomSearch`` of ``--trials`` trials over an MLP
(Input(784) -> Dense(units) -> Dense(units) -> Dense(10), Adam; ``units`` among
``--units``), each trial fitting 1 epoch of 2 batches on synthetic numpy data,
in two variants:

    plain    ``kt.RandomSearch`` as KerasTuner ships it (each trial starts with
             ``clear_session()`` and ``gc.collect()``, as KerasTuner does)
    managed  ``managed_tuner(kt.RandomSearch)``: each trial's models disposed at
             its end, and the constructor's

Each variant runs in a fresh child process, ``--rounds`` times, interleaved
(plain, managed, plain, managed, ...) so that machine drift hits both alike. A
child samples its RSS (psutil) after the constructor and after every trial
(once the trial has ended) and reports:

* RSS growth per trial: least-squares slope of RSS over the trials after the
  first ``--warmup`` ones;
* RSS growth over the search: RSS after the last trial minus after the constructor;
* seconds per trial, and the best trial's hyperparameters and score (the same
  seed gives the same search, so they must agree between the variants).

The parent prints the machine and a table of medians over the rounds, with
their spread (min-max). It exits non-zero if a child fails or the variants
disagree on the best trial.

Run (from the repository root, with the package, keras-tuner and psutil installed)::

    python benchmarks/sweeps.py                        # 12 trials, 2 rounds
    python benchmarks/sweeps.py --trials 6 --rounds 1  # quick look
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

import _harness
from _harness import MIB, ChildOutcome, fmt

INPUT_DIM = 784
CLASSES = 10
BATCH_SIZE = 128
SAMPLES = 2 * BATCH_SIZE + 64  # 2 training batches, 64 for validation
VARIANTS = ("plain", "managed")
LABELS = {"plain": "plain kt.RandomSearch", "managed": "managed_tuner(kt.RandomSearch)"}
# Weights + the two Adam slots (m, v), float32.
BYTES_PER_PARAM = 4 * 3
SEED = 0


def mlp_params(units: int) -> int:
    return (INPUT_DIM + 1) * units + (units + 1) * units + (units + 1) * CLASSES


# --------------------------------------------------------------------------- child


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # Imported here so the parent never loads TensorFlow.
    import keras
    import keras_tuner as kt
    import numpy as np
    import psutil

    from lifecycle.integrations.keras_tuner import managed_tuner

    process = psutil.Process()
    rss_mib: list[float] = []
    trial_seconds: list[float] = []
    base = managed_tuner(kt.RandomSearch) if variant == "managed" else kt.RandomSearch

    class Sampled(base):  # type: ignore[misc, valid-type]
        def on_trial_begin(self, trial: Any) -> None:
            self.began = time.perf_counter()
            super().on_trial_begin(trial)

        def on_trial_end(self, trial: Any) -> None:
            super().on_trial_end(trial)  # the managed variant disposes here
            trial_seconds.append(time.perf_counter() - self.began)
            rss_mib.append(process.memory_info().rss / MIB)

    def build(hp: kt.HyperParameters) -> keras.Model:
        units = hp.Choice("units", args.units)
        model = keras.Sequential(
            [
                keras.Input((INPUT_DIM,)),
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(CLASSES, activation="softmax"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(hp.Float("lr", 1e-4, 1e-2, sampling="log")),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        return model

    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((SAMPLES, INPUT_DIM), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=SAMPLES)
    keras.utils.set_random_seed(SEED)
    with tempfile.TemporaryDirectory() as directory:
        tuner = Sampled(
            build, objective="val_accuracy", max_trials=args.trials, seed=SEED, directory=directory
        )
        rss_start = process.memory_info().rss / MIB
        started = time.perf_counter()
        tuner.search(
            x, y, validation_split=64 / SAMPLES, epochs=1, batch_size=BATCH_SIZE, verbose=0
        )
        elapsed = time.perf_counter() - started
        (best,) = tuner.oracle.get_best_trials(1)
        result: dict[str, Any] = {
            "variant": variant,
            "rss_start_mib": rss_start,
            "rss_mib": rss_mib,
            "growth_mib_per_trial": slope(rss_mib[args.warmup :]),
            "search_growth_mib": rss_mib[-1] - rss_start,
            "seconds_per_trial": statistics.fmean(trial_seconds),
            "search_seconds": elapsed,
            "best_values": best.hyperparameters.values,
            "best_score": best.score,
        }
        if variant == "managed":
            stats = tuner.lifecycle_statistics()
            result["models_disposed"] = stats.models_disposed
            result["released_mib"] = stats.bytes_released / MIB
    return result


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index (nan if < 2 values)."""
    if len(values) < 2:
        return float("nan")
    return statistics.linear_regression(range(len(values)), values).slope


# -------------------------------------------------------------------------- parent


def child_options(args: argparse.Namespace) -> list[str]:
    return [
        *("--trials", str(args.trials)),
        *("--warmup", str(args.warmup)),
        *("--units", ",".join(map(str, args.units))),
    ]


def run_rounds(args: argparse.Namespace) -> dict[str, list[ChildOutcome]]:
    """Every variant once per round, interleaved: plain, managed, plain, managed, ..."""
    outcomes: dict[str, list[ChildOutcome]] = {variant: [] for variant in args.variants}
    for round_number in range(1, args.rounds + 1):
        for variant in args.variants:
            print(f"round {round_number}: {variant} ...", file=sys.stderr, flush=True)
            outcome = _harness.spawn_child(__file__, variant, child_options(args), args.timeout)
            status = "ok" if outcome.error is None else "FAILED"
            print(f"  {status} in {outcome.seconds:.1f} s", file=sys.stderr, flush=True)
            outcomes[variant].append(outcome)
    return outcomes


def median_and_spread(values: list[float], spec: str) -> str:
    if not values:
        return "-"
    cell = fmt(statistics.median(values), spec)
    if len(values) > 1:
        cell += f" ({fmt(min(values), spec)}..{fmt(max(values), spec)})"
    return cell


def table_rows(outcomes: dict[str, list[ChildOutcome]]) -> list[list[str]]:
    rows = []
    for variant, runs in outcomes.items():
        results = [run.result for run in runs if run.result is not None]
        if len(results) < len(runs):
            rows.append([LABELS[variant], "FAILED", *["-"] * 5])
            continue
        best = results[0]
        released = [r["released_mib"] for r in results if "released_mib" in r]
        rows.append(
            [
                LABELS[variant],
                median_and_spread([r["growth_mib_per_trial"] for r in results], "+.2f"),
                median_and_spread([r["search_growth_mib"] for r in results], "+.0f"),
                median_and_spread([r["seconds_per_trial"] for r in results], ".2f"),
                fmt(statistics.median(released) if released else None, ".0f"),
                f"{best['best_score']:.4f}",
                ", ".join(f"{k}={v:.4g}" for k, v in best["best_values"].items()),
            ]
        )
    return rows


def describe_run(args: argparse.Namespace) -> list[str]:
    sizes = ", ".join(
        f"{units} ({mlp_params(units) * BYTES_PER_PARAM / MIB:.1f} MiB)" for units in args.units
    )
    machine, software = _harness.machine_lines()
    return [
        machine,
        f"{software}, keras-tuner {_harness.version_of('keras-tuner')}",
        f"workload: RandomSearch, {args.trials} trials, seed {SEED}; MLP {INPUT_DIM}-u-u-{CLASSES}"
        f" + Adam, u in {sizes} of weights + slots; 1 epoch of 2 batches of {BATCH_SIZE} per trial",
        f"rounds:   {args.rounds}, variants interleaved; medians (min..max); slope over trials "
        f"{args.warmup + 1}..{args.trials}",
    ]


def disagreements(outcomes: dict[str, list[ChildOutcome]]) -> list[str]:
    """Children whose best trial differs from the first child's (same seed, same search)."""
    results = [run.result for runs in outcomes.values() for run in runs if run.result]
    if not results:
        return []
    first = (results[0]["best_values"], results[0]["best_score"])
    return [
        f"{r['variant']}: best {r['best_values']} score {r['best_score']}, expected {first}"
        for r in results
        if (r["best_values"], r["best_score"]) != first
    ]


def run_parent(args: argparse.Namespace) -> int:
    outcomes = run_rounds(args)
    header = [
        "variant",
        "RSS growth MiB/trial",
        "search growth MiB",
        "s/trial",
        "released MiB",
        "best score",
        "best trial",
    ]
    legend = [
        "search growth: RSS after the last trial minus RSS after the constructor",
        "released MiB:  bytes the managed tuner's disposals released (lifecycle_statistics())",
        "best score:    the best trial's val_accuracy; the same seed must give the same search",
    ]
    _harness.print_report(describe_run(args), header, table_rows(outcomes), legend)
    mismatches = disagreements(outcomes)
    for line in mismatches:
        print(f"best trials differ: {line}", file=sys.stderr)
    flat = {f"{v}#{i}": run for v, runs in outcomes.items() for i, run in enumerate(runs, 1)}
    return _harness.report_failures(flat) or (1 if mismatches else 0)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument("--trials", type=int, default=12, help="trials per search")
    parser.add_argument("--rounds", type=int, default=2, help="searches per variant")
    parser.add_argument(
        "--warmup", type=int, default=3, help="trials left out of the slope (clamped)"
    )
    parser.add_argument(
        "--units",
        default="768,1024,1280",
        help="comma-separated hidden widths to choose from (1280 gives 2.6M params)",
    )
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=900.0)
    args = parser.parse_args(argv)
    try:
        args.units = [int(u) for u in str(args.units).split(",") if u.strip()]
    except ValueError:
        parser.error(f"--units takes comma-separated integers; got {args.units!r}")
    if args.trials < 2 or args.rounds < 1 or not args.units or min(args.units) < 1:
        parser.error("--trials must be >= 2, --rounds >= 1 and every --units width >= 1")
    args.warmup = max(0, min(args.warmup, args.trials // 3))
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
