"""Checkpoint benchmark: a model's keeper against plain ``tf.train.Checkpoint``.

A compiled MLP (Input(1024) -> Dense(units) -> Dense(units) -> Dense(1024), Adam
with its slots built; ``--units 2048`` gives 8.4M params, 96 MiB of weights and
slots) is saved and restored, each way ``--repeats`` times, interleaved so that
drift hits every row alike, after one warm-up round:

    plain save          ``tf.train.CheckpointManager(tf.train.Checkpoint(model=,
                        optimizer=)).save()``
    keeper save         ``model.checkpoints(dir).save()``
    keeper async save   ``model.checkpoints(dir, async_save=True).save()``: the time
                        until ``save()`` returns, and until ``sync()`` (on disk)
    plain restore       ``tf.train.Checkpoint(...).restore(path)`` into a second
                        model of the same architecture, optimizer built
    keeper restore      ``keeper.restore(path)`` into it: checked first (every
                        tensor's CRC read, object graph matched)
    keeper restore,     the same with ``verify=False``: object-graph matching only
      verify=False

The medians are compared with the plain counterpart. The checkpoint files are
in the page cache (written just before): the table measures the library's work,
not the disk.

Run (from the repository root, with the package installed)::

    python benchmarks/checkpoints.py                      # about 10 s
    python benchmarks/checkpoints.py --units 256 --repeats 1   # quick check
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import _harness
from _harness import MIB, fmt

HEADER = ["operation", "median ms", "min ms", "vs plain", "target <= 1.5x"]
TARGET = 1.5


def build(units: int):
    import keras

    import lifecycle as lc

    inputs = keras.Input((1024,))
    hidden = keras.layers.Dense(units)(keras.layers.Dense(units)(inputs))
    model = lc.ManagedModel(inputs, keras.layers.Dense(1024)(hidden))
    model.compile(keras.optimizers.Adam(), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(args: argparse.Namespace) -> tuple[dict[str, list[float]], int]:
    import tensorflow as tf

    source, target = build(args.units), build(args.units)
    nbytes = source.owned_bytes
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as base:
        plain_checkpoint = tf.train.Checkpoint(model=source, optimizer=source.optimizer)
        plain = tf.train.CheckpointManager(plain_checkpoint, os.path.join(base, "plain"), 2)
        keeper = source.checkpoints(os.path.join(base, "keeper"), max_to_keep=2)
        asynchronous = source.checkpoints(
            os.path.join(base, "async"), max_to_keep=2, async_save=True
        )
        restore_into = tf.train.Checkpoint(model=target, optimizer=target.optimizer)
        target_keeper = target.checkpoints(os.path.join(base, "target"))
        for round_ in range(args.repeats + 1):  # round 0 warms up
            results = {}
            results["plain save"] = timed(plain.save)
            results["keeper save"] = timed(keeper.save)
            results["keeper async save (returns)"] = timed(asynchronous.save)
            results["keeper async save (on disk)"] = results["keeper async save (returns)"] + (
                timed(asynchronous.sync)
            )
            path, plain_path = keeper.latest, plain.latest_checkpoint
            results["plain restore"] = timed(
                lambda path=plain_path: restore_into.restore(path).assert_consumed()
            )
            results["keeper restore"] = timed(lambda path=path: target_keeper.restore(path))
            results["keeper restore, verify=False"] = timed(
                lambda path=path: target_keeper.restore(path, verify=False)
            )
            if round_:
                for name, seconds in results.items():
                    times.setdefault(name, []).append(seconds)
        source.dispose()
        target.dispose()
    return times, nbytes


def rows(times: dict[str, list[float]]) -> list[list[str]]:
    medians = {name: statistics.median(values) for name, values in times.items()}
    table = []
    for name, values in times.items():
        reference = medians["plain save" if "save" in name else "plain restore"]
        ratio = medians[name] / reference
        plain = name.startswith("plain")
        table.append(
            [
                name,
                fmt(medians[name] * 1000, ".0f"),
                fmt(min(values) * 1000, ".0f"),
                fmt(ratio, ".2f", "x"),
                "-" if plain else ("met" if ratio <= TARGET else "missed"),
            ]
        )
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--units", type=int, default=2048, help="hidden width (2048: 96 MiB with Adam slots)"
    )
    parser.add_argument("--repeats", type=int, default=7, help="measured rounds")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    args = parser.parse_args(argv)
    if args.units < 1 or args.repeats < 1 or args.timeout <= 0:
        parser.error("--units, --repeats and --timeout must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.alarm(max(1, int(args.timeout)))  # SIGALRM ends a run that hangs
    times, nbytes = measure(args)
    signal.alarm(0)
    description = [
        *_harness.machine_lines(),
        f"model:    MLP 1024-{args.units}-{args.units}-1024 with Adam slots built, "
        f"{nbytes / MIB:.1f} MiB of weights and slots; {args.repeats} rounds after a warm-up, "
        "interleaved; files in the page cache",
    ]
    legend = [
        "vs plain: median over the plain tf.train.Checkpoint median of the same kind",
        "          (saves against plain save, restores against plain restore)",
    ]
    _harness.print_report(description, HEADER, rows(times), legend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
