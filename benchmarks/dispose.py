"""Dispose benchmark: how long ``model.dispose()`` takes for real architectures.

The headline is the user's path: a child process builds a model with Adam, fits
it one step on random data (batch 8, so the optimizer's slots exist and the
training step is traced) and calls ``dispose()`` right away, in the default
session — ``--models`` times in a row (3 by default), with no warm-up, no
waiting for the session's cleaner and no ``gc.collect()``: what a user's
``fit(); dispose()`` costs, the process's first dispose included. Variants:

    mlp                 the 3-layer MLP of ``benchmarks/loop_training.py`` whose
                        weights + Adam slots hold ``--mlp-mb`` MiB (100 by
                        default), ``lc.ManagedModel``, ``model.dispose()``
    resnet50            ``keras.applications.ResNet50(weights=None)`` at
                        ``--input-size`` (64), 10 classes, ``lc.manage()``d,
                        ``model.dispose()``
    mobilenetv2         the same with ``MobileNetV2``
    plain-<model>       the same model unmanaged, dropped the usual way:
                        ``del model; keras.backend.clear_session(); gc.collect()``

For a managed model the child records, per dispose, the wall time of the
``dispose()`` call, its ``DisposeReport.release_seconds``, and the time
collections (Python's automatic ones, or the cleaner's) ran during the call.

Then, second and named as such, the *settled* figure of earlier versions of
this table: one more model is built and fitted, the child waits for the
session's cleaner and runs ``gc.collect()``, and only then times ``dispose()``
and the time the cleaner needs to become idle afterwards (it destroys the
traced step functions ``dispose()`` took off the model, and clears the kernel
cache when due). A user's code does not settle: that column shows what the
release itself costs on a quiet process.

Variants run in ``--rounds`` rounds (5 by default), one fresh child per variant
per round, the order rotating between rounds (mlp resnet50 ..., then resnet50
... mlp, ...), so that the machine's drift hits every variant alike. Cells are
medians over every dispose of every round (min-max over the rounds' medians);
a model's ratio to the MLP (vs mlp) is taken within each round, where drift
cancels. The parent exits non-zero if a child fails, and names the failed
children.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/dispose.py                       # 5 rounds, about 25 min
    python benchmarks/dispose.py --rounds 3 --variants mlp,resnet50,plain-resnet50
    python benchmarks/dispose.py --rounds 1 --models 2 --variants mlp,resnet50 --input-size 32
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
    """Sums the time collections ran on any thread, through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: dict[int, float] = {}
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        thread = threading.get_ident()
        if phase == "start":
            self._started[thread] = time.perf_counter()
        elif thread in self._started:
            self.seconds += time.perf_counter() - self._started.pop(thread)


def settle() -> None:
    """Let the cleaner finish and collect once, so nothing owed lands in the timing."""
    import lifecycle as lc

    lc.current_session().cleaner.wait_idle(IDLE_TIMEOUT)
    gc.collect()


def drop(model: Any, managed: bool) -> tuple[float, Any]:
    """Get rid of ``model`` the variant's way; its wall time and the dispose report."""
    import keras

    started = time.perf_counter()
    if managed:
        report = model.dispose()
        return time.perf_counter() - started, report
    del model
    keras.backend.clear_session()
    gc.collect()
    return time.perf_counter() - started, None


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import lifecycle as lc

    managed = not variant.startswith("plain-")
    name = variant.removeprefix("plain-")
    collections = AutoCollections()
    result: dict[str, Any] = {"variant": variant}
    walls, releases, during = [], [], []
    # The user's path: fit, then dispose at once; nothing before, nothing between.
    for _ in range(args.models):
        model, x, y = build(name, managed=managed, input_size=args.input_size, mlp_mb=args.mlp_mb)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        result["params"] = int(model.count_params())
        before = collections.seconds
        wall, report = drop(model, managed)
        del model
        walls.append(1000 * wall)
        during.append(1000 * (collections.seconds - before))
        if report is not None:
            releases.append(1000 * report.release_seconds)
            result.update(
                variables=report.variables_released, released_mib=report.bytes_released / MIB
            )
    key = "dispose" if managed else "plain"
    result.update(
        {f"{key}_ms": walls, f"first_{key}_ms": walls[0], "release_ms": releases, "gc_ms": during}
    )
    if not managed:
        return result
    # Settled, second: what the release costs on a quiet process.
    model, x, y = build(name, managed=True, input_size=args.input_size, mlp_mb=args.mlp_mb)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    settle()
    wall, _ = drop(model, managed=True)
    returned = time.perf_counter()
    lc.current_session().cleaner.wait_idle(IDLE_TIMEOUT)
    result.update(
        settled_ms=1000 * wall,
        cleaner_ms=1000 * (time.perf_counter() - returned),
        collections=lc.statistics(count_graphs=False).collections,
    )
    return result


# -------------------------------------------------------------------------- parent


def median_of(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    """A metric: the median of a child's list ``key`` (None if it has none)."""

    def read(result: Mapping[str, Any]) -> float | None:
        values = result.get(key)
        return statistics.median(values) if values else None

    return read


DISPOSE_MS = median_of("dispose_ms")


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
                rounds.cell(name, DISPOSE_MS, ".1f"),
                rounds.ratio_cell(DISPOSE_MS, name, "mlp"),
                rounds.cell(name, "first_dispose_ms", ".1f"),
                rounds.cell(name, median_of("release_ms"), ".1f"),
                rounds.cell(name, median_of("gc_ms"), ".1f"),
                rounds.cell(name, "settled_ms", ".1f"),
                rounds.cell(name, "cleaner_ms", ".1f"),
                rounds.cell(f"plain-{name}", median_of("plain_ms"), ".1f"),
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
        f"path:     per child, {args.models} x (build, fit, dispose at once) in the default "
        "session, then one settled dispose",
        _harness.rounds_line(args.rounds),
    ]


def run_parent(args: argparse.Namespace) -> int:
    options = ["--input-size", str(args.input_size), "--mlp-mb", str(args.mlp_mb)]
    options += ["--models", str(args.models)]
    rounds = _harness.run_rounds(__file__, args.variants, args.rounds, options, args.timeout)
    header = [
        "model",
        "buffers",
        "MiB",
        "dispose() ms",
        "vs mlp",
        "first ms",
        "release ms",
        "gc ms",
        "settled ms",
        "cleaner ms",
        "plain drop ms",
    ]
    legend = [
        "dispose() ms: wall time of model.dispose() right after fit(), the user's path (median",
        "              of a child's disposes; cells: median over the rounds (min-max))",
        "vs mlp:       over the MLP's in the same round, median of the per-round ratios",
        "first ms:     the process's first dispose()",
        "release ms:   DisposeReport.release_seconds (release, purge, drop references)",
        "gc ms:        collections (Python's automatic ones or the cleaner's) during the call",
        "settled ms:   SETTLED, not the user's path: dispose() after waiting for the cleaner",
        "              and gc.collect(), as earlier versions of this table reported",
        "cleaner ms:   after the settled dispose, until the cleaner is idle: destroying the",
        "              traced step functions, clearing the kernel cache when due",
        "plain drop ms: del model; keras.backend.clear_session(); gc.collect() of the same",
        "              model unmanaged, right after fit() (frees none of its buffers)",
    ]
    _harness.print_report(describe_run(args), header, table_rows(rounds, args.variants), legend)
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    _harness.add_input_size_argument(parser, "ResNet50 and MobileNetV2")
    parser.add_argument(
        "--mlp-mb", type=float, default=100.0, help="MiB of the MLP's weights + Adam slots"
    )
    parser.add_argument(
        "--models",
        type=_harness.positive_int,
        default=3,
        help="models built, fitted and disposed in a row per child (the user's path)",
    )
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=600.0, rounds=5)
    args = parser.parse_args(argv)
    if args.mlp_mb <= 0 or args.timeout <= 0:
        parser.error("--mlp-mb and --timeout must be positive")
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
