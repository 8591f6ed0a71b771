"""CPU allocator: which setting gives memory back, at what cost.

With oneDNN's kernels on (TensorFlow's default on recent x86 CPUs), TensorFlow's
CPU allocator keeps every block of 4 KiB or more in a pool that never shrinks.
The settings that avoid it are read once when TensorFlow starts, so each
variant is a fresh child:

    pool          TensorFlow's defaults: oneDNN on, its pooling CPU allocator
    system        ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``: every block from glibc
    system-tuned  as ``system``, and ``lc.tuning.tune_allocator()``
    lc-system     ``LIFECYCLE_ALLOCATOR=system``: as ``system``, glibc kept from
                  mapping and unmapping large blocks on every step
    nodnn         ``TF_ENABLE_ONEDNN_OPTS=0``: neither oneDNN's kernels nor allocator

A child first drops a 64 MiB tensor and reads how much glibc still has mapped
(``mallinfo2``). Then, per model of ``--models`` (managed, on the user's path):
``resnet50`` (ResNet50 at ``--input-size``, batch ``--batch``) and ``mlp`` (the
100 MiB MLP of ``loop_training.py``, batch 64): the median of ``--steps``
``train_on_batch`` steps (and minor page faults per step) and of ``--calls``
traced calls on 1 and 32 rows; then ``dispose()`` and a 3 s wait: the share and
MiB of the RSS growth that came back, and ``cpu_pooled_bytes``. The child also
reports its peak RSS. Settings are compared with ``pool``.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/allocator.py             # 3 rounds x 5 variants, about 25 min
    python benchmarks/allocator.py --quick
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from loop_training import INPUT_DIM, units_for_mib
from sweep import NO_ONEDNN, SYSTEM_ALLOCATOR, libc, mallinfo, use_settings

import _harness
from _harness import MIB, Metric, Option

LIFECYCLE_ALLOCATOR = "LIFECYCLE_ALLOCATOR"
SETTINGS = {
    "pool": {},
    "system": {SYSTEM_ALLOCATOR: "1"},
    "system-tuned": {SYSTEM_ALLOCATOR: "1"},
    "lc-system": {LIFECYCLE_ALLOCATOR: "system"},
    "nodnn": {NO_ONEDNN: "0"},
}
MODELS = ("resnet50", "mlp")
INFER_BATCH = 32
RETURN_WAIT = 3.0  # seconds after dispose() before reading what came back
CLASSES = 10
MLP_MIB = 100.0
MLP_BATCH = 64


def median_ms(step: Callable[[], Any], count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timings(model: Any, x: Any, y: Any, args: argparse.Namespace) -> dict[str, float]:
    """Steady-state step and call times of ``model``, and page faults per step."""
    import numpy as np
    import tensorflow as tf

    for _ in range(2):  # traces the step, then grows the pool or the heap
        model.train_on_batch(x, y)
    infer = tf.function(lambda rows: model(rows, training=False))
    one, many = tf.constant(x[:1]), tf.constant(np.resize(x, (INFER_BATCH, *x.shape[1:])))
    for _ in range(3):
        infer(one).numpy()
        infer(many).numpy()
    faults = minor_faults()
    result = {"train_ms": median_ms(lambda: model.train_on_batch(x, y), args.steps)}
    result["faults"] = (minor_faults() - faults) / args.steps
    result["infer_ms"] = median_ms(lambda: infer(one).numpy(), args.calls)
    result["infer32_ms"] = median_ms(lambda: infer(many).numpy(), args.calls)
    return result


def measure_model(name: str, args: argparse.Namespace) -> dict[str, float]:
    """One model on the user's path: step and call times, then what dispose gave back."""
    import keras
    import numpy as np
    import psutil

    import lifecycle as lc
    from lifecycle.cli._soak_worker import build_mlp

    process = psutil.Process()
    rng = np.random.default_rng(0)
    before = process.memory_info().rss
    if name == "mlp":
        model = build_mlp(units_for_mib(MLP_MIB), managed=True)
        x = rng.standard_normal((MLP_BATCH, INPUT_DIM), dtype=np.float32)
    else:
        side = args.input_size
        model = lc.manage(
            keras.applications.ResNet50(weights=None, input_shape=(side, side, 3), classes=CLASSES)
        )
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
        x = rng.standard_normal((args.batch, side, side, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=len(x))
    result = timings(model, x, y, args)
    fitted = process.memory_info().rss
    model.dispose()
    del model
    time.sleep(RETURN_WAIT)
    after = process.memory_info().rss
    result["returned"] = (fitted - after) / max(1, fitted - before)
    result["returned_mib"] = (fitted - after) / MIB
    pooled = lc.statistics(count_graphs=False).cpu_pooled_bytes
    result["pooled_mib"] = -1.0 if pooled is None else pooled / MIB
    return result


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    os.environ.pop(LIFECYCLE_ALLOCATOR, None)
    use_settings(SETTINGS[variant])
    import tensorflow as tf

    import lifecycle as lc  # before TensorFlow: it reads LIFECYCLE_ALLOCATOR

    if variant == "system-tuned":
        lc.tuning.tune_allocator()
    allocator = lc.statistics(count_graphs=False).cpu_allocator
    lib = libc()
    before = mallinfo(lib)
    tensor = tf.ones([64 * MIB // 4], dtype=tf.float32)  # 64 MiB, dropped at once
    del tensor
    after = mallinfo(lib)
    process = {"onednn": int(allocator != "tensorflow")}
    if before and after:
        process["dropped_64mib_mapped_mib"] = after["mapped"] - before["mapped"]
    cases = {name: measure_model(name, args) for name in args.models}
    # ru_maxrss is in KiB on Linux.
    process["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"cases": {"process": process, **cases}, "allocator": allocator}


BENCHMARK = _harness.Benchmark(
    name="allocator",
    doc=__doc__,
    variants={
        "pool": "defaults (oneDNN on, its pooling CPU allocator)",
        "system": f"{SYSTEM_ALLOCATOR}=1 (glibc's malloc/free)",
        "system-tuned": f"{SYSTEM_ALLOCATOR}=1, lc.tuning.tune_allocator()",
        "lc-system": f"{LIFECYCLE_ALLOCATOR}=system (one arena, no per-block mappings)",
        "nodnn": f"{NO_ONEDNN}=0 (TensorFlow's own kernels and allocator)",
    },
    metrics=[
        Metric("train_ms", "ms", ",.1f", "train step ms"),
        Metric("faults", "faults/step", ",.0f", "page faults/step", ratio=False),
        Metric("infer_ms", "ms", ",.2f", "batch-1 call ms"),
        Metric("infer32_ms", "ms", ",.1f", "batch-32 call ms"),
        Metric("returned", "share", ".2f", "RSS returned", ratio=False),
        Metric("returned_mib", "MiB", ",.0f", "returned MiB", ratio=False),
        Metric("pooled_mib", "MiB", ",.0f", "pooled MiB", ratio=False),
        Metric("onednn", "on", ".0f", "oneDNN", ratio=False),
        Metric("dropped_64mib_mapped_mib", "MiB", ",.0f", "dropped 64 MiB mapped", ratio=False),
        Metric("peak_rss_mib", "MiB", ",.0f", "peak RSS MiB"),
    ],
    measure=measure,
    options=[
        Option("--models", ",".join(MODELS), "comma-separated subset", _harness.names(MODELS)),
        Option("--input-size", 64, "image side of ResNet50", _harness.image_side),
        Option("--batch", 16, "ResNet50 batch", _harness.positive_int),
        Option("--steps", 15, "timed training steps per model", _harness.positive_int),
        Option("--calls", 50, "timed inference calls per model", _harness.positive_int),
    ],
    quick={"models": "mlp", "steps": 2, "calls": 3, "variants": "pool,lc-system"},
    baseline="pool",
    notes=lambda runs, args: [
        f"{variant}: CPU allocator {result['allocator']}"
        for variant, result in (runs[-1].items() if runs else ())
        if result
    ],
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
