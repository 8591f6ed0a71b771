"""Checkpoint benchmark: a model's keeper against plain ``tf.train.Checkpoint``.

A compiled MLP (Input(1024) -> Dense(units) -> Dense(units) -> Dense(1024), Adam
with its slots built; ``--units 2048`` gives 8.4M params, 96 MiB of weights and
slots) is saved and restored, each way once per round, for ``--rounds`` rounds (7 by
default; ``--repeats`` is the older name) after one warm-up round:

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

Rounds: all in one process (the operations share the models and the files), a
round runs the saves, then the restores, each group in an order that rotates
between rounds (plain keeper async, then keeper async plain, ...). Each
operation's time is compared with its plain counterpart's in the same round,
where the machine's drift cancels; the table gives the median of those
per-round ratios (min-max) and each operation's median time over the rounds
(min-max). The checkpoint files are in the page cache (written just before):
the table measures the library's work, not the disk.

Run (from the repository root, with the package installed)::

    python benchmarks/checkpoints.py                          # about 10 s
    python benchmarks/checkpoints.py --units 256 --rounds 2   # quick check
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable

import _harness
from _harness import MIB

HEADER = ["operation", "ms", "vs plain", "target <= 1.5x"]
TARGET = 1.5
OPERATIONS = (
    "plain save",
    "keeper save",
    "keeper async save (returns)",
    "keeper async save (on disk)",
    "plain restore",
    "keeper restore",
    "keeper restore, verify=False",
)


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
    """Each operation's seconds, one per measured round, and the bytes checkpointed."""
    import tensorflow as tf

    source, target = build(args.units), build(args.units)
    nbytes = source.owned_bytes
    times: dict[str, list[float]] = {name: [] for name in OPERATIONS}
    with tempfile.TemporaryDirectory() as base:
        plain_checkpoint = tf.train.Checkpoint(model=source, optimizer=source.optimizer)
        plain = tf.train.CheckpointManager(plain_checkpoint, os.path.join(base, "plain"), 2)
        keeper = source.checkpoints(os.path.join(base, "keeper"), max_to_keep=2)
        asynchronous = source.checkpoints(
            os.path.join(base, "async"), max_to_keep=2, async_save=True
        )
        restore_into = tf.train.Checkpoint(model=target, optimizer=target.optimizer)
        target_keeper = target.checkpoints(os.path.join(base, "target"))

        def async_save() -> dict[str, float]:
            returned = timed(asynchronous.save)
            return {
                "keeper async save (returns)": returned,
                "keeper async save (on disk)": returned + timed(asynchronous.sync),
            }

        saves: dict[str, Callable[[], dict[str, float]]] = {
            "plain": lambda: {"plain save": timed(plain.save)},
            "keeper": lambda: {"keeper save": timed(keeper.save)},
            "async": async_save,
        }
        for round_ in range(args.rounds + 1):  # round 0 warms up
            results: dict[str, float] = {}
            for kind in _harness.rotation(list(saves), round_):
                results.update(saves[kind]())
            path, plain_path = keeper.latest, plain.latest_checkpoint
            restores: dict[str, Callable[[], object]] = {
                "plain restore": lambda p=plain_path: restore_into.restore(p).assert_consumed(),
                "keeper restore": lambda p=path: target_keeper.restore(p),
                "keeper restore, verify=False": lambda p=path: target_keeper.restore(
                    p, verify=False
                ),
            }
            for name in _harness.rotation(list(restores), round_):
                results[name] = timed(restores[name])
            if round_:
                for name, seconds in results.items():
                    times[name].append(seconds)
        source.dispose()
        target.dispose()
    return times, nbytes


def rows(times: dict[str, list[float]]) -> list[list[str]]:
    table = []
    for name in OPERATIONS:
        reference = times["plain save" if "save" in name else "plain restore"]
        ratios = _harness.per_round_ratios(times[name], reference)
        found = _harness.spread_of(ratios)
        met = found is not None and found.median <= TARGET
        table.append(
            [
                name,
                _harness.fmt_spread([1000 * t for t in times[name]], ".0f"),
                _harness.fmt_spread(ratios, ".2f", "x"),
                "-" if name.startswith("plain") else ("met" if met else "missed"),
            ]
        )
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--units", type=int, default=2048, help="hidden width (2048: 96 MiB with Adam slots)"
    )
    parser.add_argument(
        "--rounds",
        "--repeats",
        dest="rounds",
        type=_harness.positive_int,
        default=7,
        help="measured rounds, after one warm-up round",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    args = parser.parse_args(argv)
    if args.units < 1 or args.timeout <= 0:
        parser.error("--units and --timeout must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.alarm(max(1, int(args.timeout)))  # SIGALRM ends a run that hangs
    times, nbytes = measure(args)
    signal.alarm(0)
    description = [
        *_harness.machine_lines(),
        f"model:    MLP 1024-{args.units}-{args.units}-1024 with Adam slots built, "
        f"{nbytes / MIB:.1f} MiB of weights and slots; files in the page cache",
        f"rounds:   {args.rounds} after a warm-up round, in one process; saves, then restores, "
        "each in an order rotating between rounds",
    ]
    legend = [
        "ms:       median over the rounds (min-max)",
        "vs plain: time over the plain tf.train.Checkpoint time of the same kind in the same",
        "          round (saves against plain save, restores against plain restore); median",
        "          of the per-round ratios (min-max); the target applies to the median",
    ]
    _harness.print_report(description, HEADER, rows(times), legend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
