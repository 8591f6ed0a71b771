"""Tuner sweeps: memory of a KerasTuner search, plain or with the integration.

A ``keras_tuner.RandomSearch`` of ``--trials`` trials over an MLP (Input(784)
-> Dense(units) x 2 -> Dense(10), Adam; ``units`` among ``--units``), each trial
fitting 1 epoch of 2 batches of synthetic data, in two variants:

    plain    ``kt.RandomSearch`` as KerasTuner ships it (``clear_session()`` and
             ``gc.collect()`` at each trial's start)
    managed  ``managed_tuner(kt.RandomSearch)``: each trial's models disposed

A child samples its RSS after the constructor and after every trial, and
reports the RSS growth per trial (least-squares slope after ``--warmup``
trials), over the whole search, seconds per trial, what the managed tuner
released, and the best trial (same seed, same search: the variants must agree,
or the run fails).

Run (from the repository root, with the package, keras-tuner and psutil installed)::

    python benchmarks/sweeps.py            # 12 trials, 2 rounds
    python benchmarks/sweeps.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

import _harness
from _harness import MIB, Metric, Option

INPUT_DIM = 784
CLASSES = 10
BATCH_SIZE = 128
SAMPLES = 2 * BATCH_SIZE + 64  # 2 training batches, 64 for validation
SEED = 0


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import keras
    import keras_tuner as kt
    import numpy as np
    import psutil

    from lifecycle.integrations.keras_tuner import managed_tuner

    process = psutil.Process()
    rss: list[float] = []
    trial_seconds: list[float] = []
    base = managed_tuner(kt.RandomSearch) if variant == "managed" else kt.RandomSearch

    class Sampled(base):  # type: ignore[misc, valid-type]
        def on_trial_begin(self, trial: Any) -> None:
            self.began = time.perf_counter()
            super().on_trial_begin(trial)

        def on_trial_end(self, trial: Any) -> None:
            super().on_trial_end(trial)  # the managed variant disposes here
            trial_seconds.append(time.perf_counter() - self.began)
            rss.append(process.memory_info().rss / MIB)

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
        start, searching = process.memory_info().rss / MIB, time.perf_counter()
        tuner.search(
            x, y, validation_split=64 / SAMPLES, epochs=1, batch_size=BATCH_SIZE, verbose=0
        )
        search_s = time.perf_counter() - searching
        (best,) = tuner.oracle.get_best_trials(1)
        warmup = max(0, min(args.warmup, args.trials // 3))
        result: dict[str, Any] = {
            "growth_mib_per_trial": _harness.slope(rss[warmup:]),
            "search_growth_mib": rss[-1] - start,
            "seconds_per_trial": statistics.fmean(trial_seconds),
            "search_s": search_s,
            "rss_mib": rss,
            "best_score": best.score,
            "best_trial": best.hyperparameters.values,
        }
        if variant == "managed":
            stats = tuner.lifecycle_statistics()
            result["models_disposed"] = stats.models_disposed
            result["released_mib"] = stats.bytes_released / MIB
    return result


def best_trials(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    found = [(v, r["best_trial"], r["best_score"]) for run in runs for v, r in run.items() if r]
    return [f"  best trial, {v}: {trial}, val_accuracy {score:.4f}" for v, trial, score in found]


def disagreements(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """Children whose best trial differs from the first child's (same seed, same search)."""
    found = [(v, r["best_trial"], r["best_score"]) for run in runs for v, r in run.items() if r]
    return [
        f"best trials differ: {v}: {trial} {score}, expected {found[0][1:]}"
        for v, trial, score in found
        if (trial, score) != found[0][1:]
    ]


BENCHMARK = _harness.Benchmark(
    name="sweeps",
    doc=__doc__,
    variants={"plain": "kt.RandomSearch", "managed": "managed_tuner(kt.RandomSearch)"},
    metrics=[
        Metric("growth_mib_per_trial", "MiB", "+.2f", "RSS growth MiB/trial", False, "rss_mib"),
        Metric("search_growth_mib", "MiB", "+.0f", "search growth MiB", ratio=False),
        Metric("seconds_per_trial", "s", ".2f", "s/trial"),
        Metric("search_s", "s", ".1f", "search s"),
        Metric("models_disposed", "", ".0f", "models disposed", ratio=False),
        Metric("released_mib", "MiB", ".0f", "released MiB", ratio=False),
        Metric("best_score", "val_accuracy", ".4f", "best score", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--trials", 12, "trials per search", _harness.positive_int),
        Option("--warmup", 3, "trials left out of the slope (at most trials // 3)"),
        Option("--units", "768,1024,1280", "comma-separated widths", _harness.positive_ints),
    ],
    quick={"trials": 2, "units": "16,32"},
    rounds=2,
    timeout=900.0,
    notes=best_trials,
    check=disagreements,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
