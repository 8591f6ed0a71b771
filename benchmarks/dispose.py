"""Dispose benchmark: how long ``model.dispose()`` takes for real architectures.

Each child process builds one model with Adam, fits it one step on random data
(batch 8, so the optimizer's slots exist and the training step is traced),
settles (waits for the session's cleaner, then ``gc.collect()``, so that a
collection owed by the build is not charged to what follows), and measures
one way of getting rid of it:

    mlp                 the 3-layer MLP of ``benchmarks/loop_training.py`` whose
                        weights + Adam slots hold ``--mlp-mb`` MiB (100 by
                        default), ``lc.ManagedModel``, ``model.dispose()``
    resnet50            ``keras.applications.ResNet50(weights=None)`` at
                        ``--input-size`` (64), 10 classes, ``lc.manage()``d,
                        ``model.dispose()``
    mobilenetv2         the same with ``MobileNetV2``
    plain-<model>       the same model unmanaged, dropped the usual way:
                        ``del model; keras.backend.clear_session(); gc.collect()``

For a managed model the child records the wall time of the ``dispose()`` call,
its ``DisposeReport.release_seconds``, the time Python's automatic collections
took inside the call (none, after settling, unless the call allocates enough to
start one), and the time the session's cleaner then needs to become idle: the
traced step functions that ``dispose()`` took off the model are destroyed on
the cleaner's thread, and the cleaner collects there once 128 MiB were released
(ResNet50 with Adam releases more than that, the MLP less).

Every child first disposes a tiny managed model (or drops a tiny plain one),
so TensorFlow's kernels for the release exist: the table shows a process that
has disposed before. Variants run in ``--rounds`` rounds (5 by default), one
fresh child per variant per round, the order rotating between rounds (mlp
resnet50 ..., then resnet50 ... mlp, ...), so that the machine's drift hits
every variant alike. The table shows medians over the rounds with their spread
(min-max); a model's ratio to the MLP (vs mlp) is taken within each round, where
drift cancels, and reported as the median of the per-round ratios (min-max).
The parent exits non-zero if a child fails, and names the failed children.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/dispose.py                       # 5 rounds, about 18 min
    python benchmarks/dispose.py --rounds 1 --variants mlp,resnet50 --input-size 32
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from loop_training import INPUT_DIM, mlp_params, units_for_mib

import _harness
from _harness import MIB

MODELS = ("mlp", "resnet50", "mobilenetv2")
VARIANTS = (*MODELS, *(f"plain-{name}" for name in MODELS))
APPLICATIONS = {"resnet50": "ResNet50", "mobilenetv2": "MobileNetV2"}
CLASSES = 10
BATCH = 8
# What the cleaner may take after a dispose: a collection of a large heap.
IDLE_TIMEOUT = 120.0


# --------------------------------------------------------------------------- child


def build(name: str, *, managed: bool, input_size: int, mlp_mb: float) -> tuple[Any, Any, Any]:
    """One compiled model with Adam, and a batch of random data for it."""
    import keras
    import numpy as np

    import lifecycle as lc
    from lifecycle.cli._soak_worker import build_mlp

    rng = np.random.default_rng(0)
    if name == "mlp":
        model = build_mlp(units_for_mib(mlp_mb), managed=managed)
        x = rng.standard_normal((BATCH, INPUT_DIM), dtype=np.float32)
    else:
        application = getattr(keras.applications, APPLICATIONS[name])
        model = application(weights=None, input_shape=(input_size, input_size, 3), classes=CLASSES)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(),
        )
        if managed:
            model = lc.manage(model)
        x = rng.standard_normal((BATCH, input_size, input_size, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=BATCH)
    return model, x, y


class AutoCollections:
    """Sums the time Python's collector ran, through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def settle() -> None:
    """Let the cleaner finish and collect once, so nothing owed lands in the timing."""
    import lifecycle as lc

    lc.current_session().cleaner.wait_idle(IDLE_TIMEOUT)
    gc.collect()


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import keras

    import lifecycle as lc

    managed = not variant.startswith("plain-")
    name = variant.removeprefix("plain-")
    # Warm-up: the kernels of a release (or of a plain drop) exist afterwards.
    tiny, x, y = build("mlp", managed=managed, input_size=args.input_size, mlp_mb=0.1)
    tiny.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    if managed:
        tiny.dispose()
    del tiny
    keras.backend.clear_session()
    settle()

    model, x, y = build(name, managed=managed, input_size=args.input_size, mlp_mb=args.mlp_mb)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    settle()
    collections = AutoCollections()
    result: dict[str, Any] = {"variant": variant, "params": int(model.count_params())}
    if not managed:
        started = time.perf_counter()
        del model
        keras.backend.clear_session()
        gc.collect()
        result["plain_ms"] = 1000 * (time.perf_counter() - started)
        return result
    started = time.perf_counter()
    report = model.dispose()
    returned = time.perf_counter()
    auto_gc = collections.seconds
    lc.current_session().cleaner.wait_idle(IDLE_TIMEOUT)
    result.update(
        dispose_ms=1000 * (returned - started),
        release_ms=1000 * report.release_seconds,
        auto_gc_ms=1000 * auto_gc,
        cleaner_ms=1000 * (time.perf_counter() - returned),
        variables=report.variables_released,
        released_mib=report.bytes_released / MIB,
    )
    return result


# -------------------------------------------------------------------------- parent


def table_rows(rounds: _harness.Rounds, variants: Sequence[str]) -> list[list[str]]:
    rows = []
    for name in MODELS:
        if name not in variants and f"plain-{name}" not in variants:
            continue
        rows.append(
            [
                name,
                _harness.fmt(median(rounds.values(name, "variables")), ".0f"),
                _harness.fmt(median(rounds.values(name, "released_mib")), ".0f"),
                rounds.cell(name, "dispose_ms", ".1f"),
                rounds.ratio_cell("dispose_ms", name, "mlp"),
                rounds.cell(name, "release_ms", ".1f"),
                rounds.ratio_cell("release_ms", name, "mlp"),
                rounds.cell(name, "auto_gc_ms", ".1f"),
                rounds.cell(name, "cleaner_ms", ".1f"),
                rounds.cell(f"plain-{name}", "plain_ms", ".1f"),
            ]
        )
    return rows


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def describe_run(args: argparse.Namespace) -> list[str]:
    units = units_for_mib(args.mlp_mb)
    return [
        *_harness.machine_lines(),
        f"models:   MLP {INPUT_DIM}-{units}-{units}-10 ({mlp_params(units):,} params, "
        f"{args.mlp_mb:g} MiB with Adam slots); ResNet50 and MobileNetV2 at "
        f"{args.input_size}x{args.input_size}x3, 10 classes; Adam, one fit step of batch {BATCH}",
        _harness.rounds_line(args.rounds),
    ]


def run_parent(args: argparse.Namespace) -> int:
    options = ["--input-size", str(args.input_size), "--mlp-mb", str(args.mlp_mb)]
    rounds = _harness.run_rounds(__file__, args.variants, args.rounds, options, args.timeout)
    header = [
        "model",
        "buffers",
        "MiB",
        "dispose() ms",
        "vs mlp",
        "release ms",
        "vs mlp",
        "auto gc ms",
        "cleaner ms",
        "plain drop ms",
    ]
    legend = [
        "dispose() ms: wall time of the model.dispose() call (what the caller waits for)",
        "release ms:   DisposeReport.release_seconds (release, purge, drop references)",
        "vs mlp:       this model's time over the MLP's in the same round, median of the",
        "              per-round ratios (min-max); other cells: median over the rounds (min-max)",
        "auto gc ms:   time of Python's automatic collections inside the call",
        "cleaner ms:   time until the session's cleaner is idle after the call: destroying the",
        "              traced step functions, and the collection (plus kernel-cache clear when",
        "              due) it runs once 128 MiB were allocated or released since its last one",
        "plain drop ms: del model; keras.backend.clear_session(); gc.collect() of the same",
        "              model unmanaged (frees none of its buffers: the leak stays pinned)",
    ]
    _harness.print_report(describe_run(args), header, table_rows(rounds, args.variants), legend)
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--input-size", type=int, default=64, help="image side of ResNet50 and MobileNetV2"
    )
    parser.add_argument(
        "--mlp-mb", type=float, default=100.0, help="MiB of the MLP's weights + Adam slots"
    )
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=600.0, rounds=5)
    args = parser.parse_args(argv)
    if args.mlp_mb <= 0 or args.timeout <= 0:
        parser.error("--mlp-mb and --timeout must be positive")
    if args.input_size < 32:
        parser.error(f"--input-size must be at least 32 (ResNet50's minimum): {args.input_size}")
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
