"""Checkpoints: a model's keeper against plain ``tf.train.Checkpoint``.

A compiled MLP (1024 -> ``--units`` x 2 -> 1024, Adam slots built; 2048 units:
96 MiB of weights and slots) is saved and restored each way once per round,
after a warm-up round, all in one process (saves, then restores, each group in
an order rotating between rounds):

    plain save            ``tf.train.CheckpointManager(tf.train.Checkpoint(model=,
                          optimizer=)).save()``
    keeper save           ``model.checkpoints(dir).save()``
    keeper async save (returns), keeper async save (on disk)
                          ``model.checkpoints(dir, async_save=True).save()``: until it
                          returns, and until ``sync()``
    plain restore         ``tf.train.Checkpoint(...).restore(path)`` into a second model
    keeper restore        ``keeper.restore(path)``: every tensor's CRC checked first
    keeper restore (verify=False)
                          object-graph matching only

Saves are compared with plain save, restores with plain restore; the target is at
most 1.5x. The files are in the page cache: this measures the library, not the disk.

Run (from the repository root, with the package installed)::

    python benchmarks/checkpoints.py            # about 10 s
    python benchmarks/checkpoints.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _harness
from _harness import Metric, Option

TARGET = 1.5
SAVES = ("plain save", "keeper save", "keeper async save")
RESTORES = ("plain restore", "keeper restore", "keeper restore (verify=False)")


def build(units: int) -> Any:
    import keras

    import lifecycle as lc

    inputs = keras.Input((1024,))
    hidden = keras.layers.Dense(units)(keras.layers.Dense(units)(inputs))
    model = lc.ManagedModel(inputs, keras.layers.Dense(1024)(hidden))
    model.compile(keras.optimizers.Adam(), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def timed(action: Callable[[], object]) -> dict[str, float]:
    started = time.perf_counter()
    action()
    return {"ms": 1000 * (time.perf_counter() - started)}


def collect(args: argparse.Namespace) -> _harness.Runs:
    import tensorflow as tf

    source, target = build(args.units), build(args.units)
    runs: _harness.Runs = []
    with tempfile.TemporaryDirectory() as base:
        checkpoint = tf.train.Checkpoint(model=source, optimizer=source.optimizer)
        plain = tf.train.CheckpointManager(checkpoint, os.path.join(base, "plain"), 2)
        keeper = source.checkpoints(os.path.join(base, "keeper"), max_to_keep=2)
        later = source.checkpoints(os.path.join(base, "async"), max_to_keep=2, async_save=True)
        into = tf.train.Checkpoint(model=target, optimizer=target.optimizer)
        target_keeper = target.checkpoints(os.path.join(base, "target"))

        def async_save() -> dict[str, Any]:
            returned = timed(later.save)["ms"]
            return {
                "keeper async save (returns)": {"ms": returned},
                "keeper async save (on disk)": {"ms": returned + timed(later.sync)["ms"]},
            }

        saves = {
            "plain save": lambda: {"plain save": timed(plain.save)},
            "keeper save": lambda: {"keeper save": timed(keeper.save)},
            "keeper async save": async_save,
        }
        for index in range(args.rounds + 1):  # round 0 warms up
            run: dict[str, Any] = {}
            for name in _harness.rotation(SAVES, index):
                run.update(saves[name]())
            path, plain_path = keeper.latest, plain.latest_checkpoint
            restores = {
                "plain restore": lambda p=plain_path: into.restore(p).assert_consumed(),
                "keeper restore": lambda p=path: target_keeper.restore(p),
                "keeper restore (verify=False)": lambda p=path: target_keeper.restore(
                    p, verify=False
                ),
            }
            for name in _harness.rotation(RESTORES, index):
                run[name] = timed(restores[name])
            if index:
                runs.append(run)
        source.dispose()
        target.dispose()
    return runs


def target(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    lines = []
    for variant in BENCHMARK.variants:
        base = BENCHMARK.baseline_of(variant)
        found = _harness.ratio_over_rounds(runs, "ms", variant, base)
        if variant != base and found is not None:
            lines.append(_harness.judge(f"{variant} <= {TARGET}x {base}", found, TARGET))
    return lines


BENCHMARK = _harness.Benchmark(
    name="checkpoints",
    doc=__doc__,
    variants={
        "plain save": "tf.train.CheckpointManager.save()",
        "keeper save": "model.checkpoints(dir).save()",
        "keeper async save (returns)": "async_save=True, until save() returns",
        "keeper async save (on disk)": "async_save=True, until sync()",
        "plain restore": "tf.train.Checkpoint.restore()",
        "keeper restore": "keeper.restore(path), verified",
        "keeper restore (verify=False)": "keeper.restore(path, verify=False)",
    },
    metrics=[Metric("ms", "ms", ".0f", "ms")],
    collect=collect,
    options=[Option("--units", 2048, "hidden width (2048: 96 MiB)", _harness.positive_int)],
    quick={"units": 256, "rounds": 2},
    baseline=lambda variant: "plain save" if "save" in variant else "plain restore",
    rounds=7,
    notes=target,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
