"""Loop training: does memory come back when a model is dropped?

Builds, fits (2 steps of batch 64 on synthetic data) and drops the MLP of
``lifecycle soak`` (Input(784) -> Dense(units) x 2 -> Dense(10), Adam) for
``--cycles`` cycles, one variant per way of dropping it:

    a        ``del model``
    b        ``del model; keras.backend.clear_session(); gc.collect()``
    c        ``lc.ManagedModel`` + ``model.dispose()``, then ``del model``
    dispose  ``dispose()`` of a wider MLP holding ``--dispose-mb`` MiB of weights
             and Adam slots, built and fitted one step, three times

Per child: RSS growth per cycle (least-squares slope after ``--warmup``
cycles), mean seconds per cycle and per drop, the final RSS and its growth
over the measured cycles, and for ``c``/``dispose`` the median
``DisposeReport.release_seconds`` and bytes released.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/loop_training.py                 # 3 rounds, 2.6M-param MLP, 30 cycles
    python benchmarks/loop_training.py --quick
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from typing import Any

import _harness
from _harness import MIB, Metric, Option

INPUT_DIM = 784
CLASSES = 10
BATCH_SIZE = 64
STEPS_PER_CYCLE = 2
DISPOSE_REPEATS = 3
BYTES_PER_PARAM = 4 * 3  # weights + the two Adam slots, float32


def mlp_params(units: int) -> int:
    return (INPUT_DIM + 1) * units + (units + 1) * units + (units + 1) * CLASSES


def units_for_mib(mib: float) -> int:
    """Smallest width whose weights + Adam slots hold at least ``mib`` MiB."""
    params = mib * MIB / BYTES_PER_PARAM
    b = INPUT_DIM + 2 + CLASSES  # params(u) = u**2 + b*u + CLASSES
    return max(1, math.ceil((-b + math.sqrt(b * b + 4 * (params - CLASSES))) / 2))


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import keras
    import numpy as np
    import psutil

    from lifecycle.cli._soak_worker import build_mlp

    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH_SIZE * STEPS_PER_CYCLE, INPUT_DIM), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=len(x))
    if variant == "dispose":
        releases, released = [], []
        for _ in range(DISPOSE_REPEATS):
            model = build_mlp(units_for_mib(args.dispose_mb), managed=True)
            model.fit(x[:BATCH_SIZE], y[:BATCH_SIZE], batch_size=BATCH_SIZE, verbose=0)
            report = model.dispose()
            releases.append(1000 * report.release_seconds)
            released.append(report.bytes_released / MIB)
            del model
        return {"release_ms": statistics.median(releases), "released_mib": max(released)}

    process = psutil.Process()
    rss, cycles, drops, releases, released, collects = [], [], [], [], [], []
    warmup = max(0, min(args.warmup, args.cycles // 3))
    rss_start = process.memory_info().rss / MIB
    for _ in range(args.cycles):
        started = time.perf_counter()
        model = build_mlp(args.units, managed=variant == "c")
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
        fitted = time.perf_counter()
        if variant == "c":
            report = model.dispose()
            releases.append(1000 * report.release_seconds)
            released.append(report.bytes_released / MIB)
        del model
        if variant == "b":
            keras.backend.clear_session()
            collecting = time.perf_counter()
            gc.collect()
            collects.append(1000 * (time.perf_counter() - collecting))
        dropped = time.perf_counter()
        cycles.append(dropped - started)
        drops.append(1000 * (dropped - fitted))
        rss.append(process.memory_info().rss / MIB)
    result = {
        "growth_mib_per_cycle": _harness.slope(rss[warmup:]),
        "seconds_per_cycle": statistics.fmean(cycles[warmup:]),
        "drop_ms": statistics.fmean(drops[warmup:]),
        "final_rss_mib": rss[-1],
        "growth_mib": rss[-1] - (rss[warmup - 1] if warmup else rss_start),
        "rss_mib": rss,
    }
    if collects:
        result["collect_ms"] = statistics.fmean(collects[warmup:])
    if releases:
        result["release_ms"] = statistics.median(releases[warmup:])
        result["released_mib"] = statistics.median(released[warmup:])
    return result


def versus_b(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """(c)'s time per cycle over (b)'s, the naive way that clears the session."""
    found = _harness.ratio_over_rounds(runs, "seconds_per_cycle", "c", "b")
    return [f"s/cycle c vs b: {_harness.spread_text(found)}"] if found else []


BENCHMARK = _harness.Benchmark(
    name="loop_training",
    doc=__doc__,
    variants={
        "a": "del model",
        "b": "del model + clear_session() + gc.collect()",
        "c": "ManagedModel + dispose()",
        "dispose": "dispose() of a --dispose-mb MiB model",
    },
    metrics=[
        Metric("growth_mib_per_cycle", "MiB", "+.2f", "RSS growth MiB/cycle", False, "rss_mib"),
        Metric("seconds_per_cycle", "s", ".3f", "s/cycle"),
        Metric("drop_ms", "ms", ".1f", "drop ms"),
        Metric("collect_ms", "ms", ".1f", "gc.collect() ms", ratio=False),
        Metric("release_ms", "ms", ".1f", "dispose ms", ratio=False),
        Metric("released_mib", "MiB", ".1f", "released MiB", ratio=False),
        Metric("final_rss_mib", "MiB", ".0f", "final RSS MiB", ratio=False),
        Metric("growth_mib", "MiB", "+.1f", "growth MiB", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--cycles", 30, "build-fit-drop cycles", _harness.positive_int),
        Option("--warmup", 5, "cycles left out of slope and means (at most cycles // 3)"),
        Option("--units", 1264, "hidden width (1264: 2.6M params)", _harness.positive_int),
        Option("--dispose-mb", 100.0, "MiB the dispose variant disposes", _harness.positive_float),
    ],
    quick={"cycles": 6, "warmup": 2, "units": 256, "dispose_mb": 8.0},
    rounds=3,
    timeout=1200.0,
    notes=versus_b,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
