"""Dispose: how long ``model.dispose()`` takes for real architectures.

The user's path: a child builds a model with Adam, fits it one step (batch 8)
and disposes it at once, in the default session, ``--models`` times in a row
(no warm-up, no settling, no ``gc.collect()``). Variants:

    mlp             the MLP of ``loop_training.py`` holding ``--mlp-mb`` MiB with
                    Adam slots, ``lc.ManagedModel``
    resnet50        ``keras.applications.ResNet50(weights=None)`` at ``--input-size``,
                    ``lc.manage()``d
    mobilenetv2     the same with ``MobileNetV2``
    plain-<model>   the model unmanaged, dropped with ``del model;
                    keras.backend.clear_session(); gc.collect()``

Per managed child: the wall time of ``dispose()`` (median, and the first),
``DisposeReport.release_seconds``, the time collections ran during the call,
buffers and MiB released; then a *settled* dispose (after waiting for the
cleaner and ``gc.collect()``) and the time the cleaner needs to go idle after
it. A model is compared with the MLP; a plain drop with its managed model.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/dispose.py                  # 5 rounds, about 25 min
    python benchmarks/dispose.py --quick
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any

from loop_training import INPUT_DIM, units_for_mib

import _harness
from _harness import MIB, Metric, Option

MODELS = ("mlp", "resnet50", "mobilenetv2")
APPLICATIONS = {"resnet50": "ResNet50", "mobilenetv2": "MobileNetV2"}
CLASSES = 10
BATCH = 8
IDLE_TIMEOUT = 120.0  # what the cleaner may take after a dispose


def build(name: str, managed: bool, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """One compiled model with Adam, and a batch of random data for it."""
    import keras
    import numpy as np

    import lifecycle as lc
    from lifecycle.cli._soak_worker import build_mlp

    rng = np.random.default_rng(0)
    if name == "mlp":
        model = build_mlp(units_for_mib(args.mlp_mb), managed=managed)
        x = rng.standard_normal((BATCH, INPUT_DIM), dtype=np.float32)
    else:
        side = args.input_size
        application = getattr(keras.applications, APPLICATIONS[name])
        model = application(weights=None, input_shape=(side, side, 3), classes=CLASSES)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
        model = lc.manage(model) if managed else model
        x = rng.standard_normal((BATCH, side, side, 3), dtype=np.float32)
    return model, x, rng.integers(0, CLASSES, size=BATCH)


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import keras

    import lifecycle as lc

    managed = not variant.startswith("plain-")
    name = variant.removeprefix("plain-")
    collections = _harness.Collections()
    walls, releases, during, result = [], [], [], {}
    for _ in range(args.models):
        model, x, y = build(name, managed, args)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        result["params"] = model.count_params()
        before, started = len(collections.events), time.perf_counter()
        if managed:
            report = model.dispose()
            releases.append(1000 * report.release_seconds)
            result["buffers"] = report.variables_released
            result["released_mib"] = report.bytes_released / MIB
            del model
        else:
            del model
            keras.backend.clear_session()
            gc.collect()
        walls.append(1000 * (time.perf_counter() - started))
        during.append(sum(1000 * (e - s) for s, e, *_ in collections.events[before:]))
    result |= {"drop_ms": statistics.median(walls), "first_ms": walls[0]}
    result["gc_ms"] = statistics.median(during)
    result["collections"] = lc.statistics(count_graphs=False).collections  # the cleaner's
    if not managed:
        return result
    result["release_ms"] = statistics.median(releases)
    # Settled, second: what the release costs on a quiet process.
    model, x, y = build(name, True, args)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    cleaner = lc.current_session().cleaner
    cleaner.wait_idle(IDLE_TIMEOUT)
    gc.collect()
    started = time.perf_counter()
    model.dispose()
    returned = time.perf_counter()
    cleaner.wait_idle(IDLE_TIMEOUT)
    result["settled_ms"] = 1000 * (returned - started)
    result["cleaner_ms"] = 1000 * (time.perf_counter() - returned)
    return result


BENCHMARK = _harness.Benchmark(
    name="dispose",
    doc=__doc__,
    variants={
        **{name: f"{name}, managed, model.dispose()" for name in MODELS},
        **{f"plain-{name}": f"{name}, del + clear_session() + gc.collect()" for name in MODELS},
    },
    metrics=[
        Metric("params", "", ",.0f", "params", ratio=False),
        Metric("buffers", "", ".0f", "buffers", ratio=False),
        Metric("released_mib", "MiB", ".0f", "MiB", ratio=False),
        Metric("drop_ms", "ms", ".1f", "dispose()/drop ms"),
        Metric("first_ms", "ms", ".1f", "first ms", ratio=False),
        Metric("release_ms", "ms", ".1f", "release ms", ratio=False),
        Metric("gc_ms", "ms", ".1f", "gc ms", ratio=False),
        Metric("collections", "", ".0f", "cleaner gcs", ratio=False),
        Metric("settled_ms", "ms", ".1f", "settled ms", ratio=False),
        Metric("cleaner_ms", "ms", ".1f", "cleaner ms", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--input-size", 64, "image side of ResNet50 and MobileNetV2", _harness.image_side),
        Option("--mlp-mb", 100.0, "MiB of the MLP's weights + Adam slots", _harness.positive_float),
        Option("--models", 3, "models built, fitted, disposed per child", _harness.positive_int),
    ],
    quick={"input_size": 32, "mlp_mb": 8.0, "models": 2, "variants": "mlp,plain-mlp"},
    baseline=lambda variant: variant.removeprefix("plain-") if "-" in variant else "mlp",
    rounds=5,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
