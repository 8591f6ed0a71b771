"""Sweep benchmark: memory of a KerasTuner search, plain or with the integration.

Runs a ``keras_tuner.RandomSearch`` of ``--trials`` trials over an MLP
(Input(784) -> Dense(units) -> Dense(units) -> Dense(10), Adam; ``units`` among
``--units``), each trial fitting 1 epoch of 2 batches on synthetic numpy data,
in two variants:

    plain    ``kt.RandomSearch`` as KerasTuner ships it (each trial starts with
             ``clear_session()`` and ``gc.collect()``, as KerasTuner does)
    managed  ``managed_tuner(kt.RandomSearch)``: each trial's models disposed at
             its end, and the constructor's

Each variant runs in a fresh child process, once per round of ``--rounds``
rounds (2 by default), the order rotating between rounds (plain, managed, then
managed, plain, ...) so that machine drift hits both alike. A
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
from _harness import MIB, fmt

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


def table_rows(rounds: _harness.Rounds) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        results = [r for r in rounds.results(variant) if r is not None]
        if len(results) < len(rounds.runs):
            rows.append([LABELS[variant], "FAILED", *["-"] * 5])
            continue
        best = results[0]
        released = rounds.values(variant, "released_mib")
        rows.append(
            [
                LABELS[variant],
                _harness.fmt_spread(rounds.values(variant, "growth_mib_per_trial"), "+.2f"),
                _harness.fmt_spread(rounds.values(variant, "search_growth_mib"), "+.0f"),
                _harness.fmt_spread(rounds.values(variant, "seconds_per_trial"), ".2f"),
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
        _harness.rounds_line(args.rounds),
        f"slope:    over trials {args.warmup + 1}..{args.trials}",
    ]


def disagreements(rounds: _harness.Rounds) -> list[str]:
    """Children whose best trial differs from the first child's (same seed, same search)."""
    results = [run.result for runs in rounds.runs for run in runs.values() if run.result]
    if not results:
        return []
    first = (results[0]["best_values"], results[0]["best_score"])
    return [
        f"{r['variant']}: best {r['best_values']} score {r['best_score']}, expected {first}"
        for r in results
        if (r["best_values"], r["best_score"]) != first
    ]


def run_parent(args: argparse.Namespace) -> int:
    rounds = _harness.run_rounds(
        __file__, args.variants, args.rounds, child_options(args), args.timeout
    )
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
    _harness.print_report(describe_run(args), header, table_rows(rounds), legend)
    mismatches = disagreements(rounds)
    for line in mismatches:
        print(f"best trials differ: {line}", file=sys.stderr)
    return _harness.report_round_failures(rounds) or (1 if mismatches else 0)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument("--trials", type=int, default=12, help="trials per search")
    parser.add_argument(
        "--warmup", type=int, default=3, help="trials left out of the slope (clamped)"
    )
    parser.add_argument(
        "--units",
        default="768,1024,1280",
        help="comma-separated hidden widths to choose from (1280 gives 2.6M params)",
    )
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=900.0, rounds=2)
    args = parser.parse_args(argv)
    try:
        args.units = [int(u) for u in str(args.units).split(",") if u.strip()]
    except ValueError:
        parser.error(f"--units takes comma-separated integers; got {args.units!r}")
    if args.trials < 2 or not args.units or min(args.units) < 1:
        parser.error("--trials must be >= 2 and every --units width >= 1")
    args.warmup = max(0, min(args.warmup, args.trials // 3))
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
