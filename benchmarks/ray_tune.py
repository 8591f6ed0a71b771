"""Ray Tune: a reused worker's memory over a sweep, plain and with managed_trainable.

A ``ray.tune.Tuner`` of ``--trials`` trials (grid over a trial index; each
trial an MLP Input(784) -> Dense(units) x 2 -> Dense(10), Adam, ``units``
cycling through ``--units``, seeded by its index, ``--epochs`` epochs of
``--batches`` batches of synthetic data, one ``ray.tune.report`` per epoch) on
a local Ray instance of one CPU with ``reuse_actors=True``, so that one worker
process runs every trial, one after another. Tune's defaults otherwise: no
environment variable is set for the worker. Three variants:

    plain          the trainable function as written (``del`` at the end of
                   the function is all it does)
    managed        ``managed_trainable(train)``: each trial's models disposed
                   when it ends, every trial on one long-lived thread of the
                   worker (the default)
    managed-tune-thread  ``managed_trainable(train, thread="trial")``: the same,
                   each trial on the new thread Tune starts for it

Each trial samples the worker's RSS when it starts (after the previous
trial's end); the child reports the growth from the start of trial
``--from-trial`` to the start of the last trial, its slope per trial, the
tuner's wall time, and each trial's final loss (the variants must agree:
same seeds, same data).

Run (from the repository root, with the package, Ray Tune and psutil installed)::

    python benchmarks/ray_tune.py            # 30 trials, 2 rounds
    python benchmarks/ray_tune.py --quick
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from typing import Any

import _harness
from _harness import MIB, Metric, Option

INPUT_DIM = 784
CLASSES = 10
BATCH_SIZE = 128
# The targets of the issue: growth at most 10 % of plain's, wall time at most 1.05x.
GROWTH_TARGET = 0.10
WALL_TARGET = 1.05


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import tune

    from lifecycle.integrations.ray import managed_trainable

    units, epochs, batches = list(args.units), args.epochs, args.batches

    def train(config: dict[str, Any]) -> None:
        import os

        import keras
        import numpy as np
        import psutil

        index = config["index"]
        rss = psutil.Process(os.getpid()).memory_info().rss / (1024 * 1024)
        keras.utils.set_random_seed(index)
        rng = np.random.default_rng(index)
        x = rng.standard_normal((batches * BATCH_SIZE, INPUT_DIM), dtype=np.float32)
        y = rng.integers(0, CLASSES, size=batches * BATCH_SIZE)
        width = units[index % len(units)]
        model = keras.Sequential(
            [
                keras.Input((INPUT_DIM,)),
                keras.layers.Dense(width, activation="relu"),
                keras.layers.Dense(width, activation="relu"),
                keras.layers.Dense(CLASSES, activation="softmax"),
            ]
        )
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        for _ in range(epochs):
            history = model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
            loss = float(history.history["loss"][-1])
            tune.report({"loss": loss, "rss_start_mib": rss, "worker_pid": os.getpid()})
        del model

    trainable = {
        "plain": train,
        "managed": managed_trainable(train),
        "managed-tune-thread": managed_trainable(train, thread="trial"),
    }[variant]
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=100 * MIB,
        configure_logging=False,
    )
    try:
        with tempfile.TemporaryDirectory() as directory:
            tuner = tune.Tuner(
                trainable,
                param_space={"index": tune.grid_search(list(range(args.trials)))},
                tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
                run_config=tune.RunConfig(storage_path=directory, verbose=0),
            )
            started = time.perf_counter()
            results = tuner.fit()
            wall_s = time.perf_counter() - started
            frame = results.get_dataframe()
    finally:
        ray.shutdown()
    frame = frame.sort_values("config/index")
    rss = [float(value) for value in frame["rss_start_mib"]]
    pids = set(frame["worker_pid"])
    first = max(0, min(args.from_trial, args.trials) - 1)
    return {
        "growth_mib": rss[-1] - rss[first],
        "growth_mib_per_trial": _harness.slope(rss[first:]),
        "wall_s": wall_s,
        "seconds_per_trial": wall_s / args.trials,
        "workers": len(pids),
        "rss_mib": rss,
        "losses": [float(value) for value in frame["loss"]],
    }


def targets(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """The issue's targets, judged within each round, and what a worker saw."""
    lines = []
    for variant in ("managed", "managed-tune-thread"):
        growth = _harness.ratio_over_rounds(runs, "growth_mib", variant, "plain")
        label = f"{variant} growth <= {GROWTH_TARGET:.0%} of plain's"
        lines.append(_harness.judge(label, growth, GROWTH_TARGET))
        wall = _harness.ratio_over_rounds(runs, "wall_s", variant, "plain")
        lines.append(_harness.judge(f"{variant} wall <= {WALL_TARGET}x plain's", wall, WALL_TARGET))
    workers = sorted({r["workers"] for run in runs for r in run.values() if r})
    lines.append(f"  worker processes per run: {workers} (1: every trial reused one actor)")
    return lines


def disagreements(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """Runs whose per-trial losses differ from the first run's (same seeds, same data)."""
    found = [(v, r["losses"]) for run in runs for v, r in run.items() if r]
    problems = []
    for variant, losses in found:
        if len(losses) != len(found[0][1]) or not all(
            math.isclose(a, b, rel_tol=1e-5) for a, b in zip(losses, found[0][1], strict=False)
        ):
            problems.append(
                f"losses differ: {variant}: {losses[:3]}..., expected {found[0][1][:3]}..."
            )
    return problems


BENCHMARK = _harness.Benchmark(
    name="ray_tune",
    doc=__doc__,
    variants={
        "plain": "the function as written",
        "managed": "managed_trainable(train)",
        "managed-tune-thread": 'managed_trainable(train, thread="trial")',
    },
    metrics=[
        Metric("growth_mib", "MiB", "+.0f", "RSS growth MiB", ratio=True, series="rss_mib"),
        Metric("growth_mib_per_trial", "MiB", "+.2f", "MiB/trial", ratio=False),
        Metric("wall_s", "s", ".1f", "wall s"),
        Metric("seconds_per_trial", "s", ".2f", "s/trial", ratio=False),
        Metric("workers", "", ".0f", "workers", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--trials", 30, "trials in the sweep", _harness.positive_int),
        Option("--from-trial", 5, "growth measured from the start of this trial"),
        Option("--units", "512,768,1024", "comma-separated widths", _harness.positive_ints),
        Option("--epochs", 2, "epochs per trial (one report each)", _harness.positive_int),
        Option("--batches", 4, "batches per epoch", _harness.positive_int),
    ],
    quick={"trials": 4, "from_trial": 2, "units": "16,32", "epochs": 1, "batches": 1},
    rounds=2,
    timeout=900.0,
    notes=targets,
    check=disagreements,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
