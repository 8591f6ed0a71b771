"""Allocator benchmark: what oneDNN's CPU allocator settings cost in training and inference.

With oneDNN's kernels on (TensorFlow's default on x86 Linux), TensorFlow's
CPU allocator keeps every block of 4 KiB or more in a pool that grows to the
largest working set and never shrinks, so memory a disposed model released
stays with the process (``benchmarks/sweep.py``). Two settings, read once when
TensorFlow starts, avoid the pool; this measures what they cost, one variant
per fresh child process:

    pool      TensorFlow's defaults: oneDNN on, its pooling CPU allocator
    system    ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``: oneDNN's kernels, every
              block from the system allocator (glibc), freed when released
    nodnn     ``TF_ENABLE_ONEDNN_OPTS=0``: neither oneDNN's kernels nor its
              allocator (what ``lifecycle serve`` sets unless told otherwise)

Each child first checks what the setting did: it allocates a 64 MiB tensor,
drops it, and reads how many bytes glibc still has mapped on their own
(``mallinfo2``): with the pool they stay mapped, without it they are gone.
Then, for two models, it times steady-state steps after a warm-up (the traced
functions built, the pool or the heap grown):

    resnet50  ``keras.applications.ResNet50(weights=None)`` at ``--input-size``
              (64), 10 classes, Adam: ``train_on_batch`` on ``--batch`` (16)
              images, and a traced ``model(x, training=False)`` on 1 image
    mlp       the 3-layer MLP of ``benchmarks/loop_training.py`` whose weights
              and Adam slots hold 100 MiB: ``train_on_batch`` on 64 rows, and a
              traced call on 1 row

Each time is the median of ``--steps`` training steps and ``--calls``
inference calls. The child also reports its peak RSS. Variants run in
``--rounds`` rounds (5 by default), a fresh child per variant per round, the
order rotating between rounds; cells are medians over the rounds (min-max),
and a setting's ratio to ``pool`` is taken within each round, then reported
as the median of those per-round ratios (min-max). The parent exits non-zero
if a child fails, and names the failed children.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/allocator.py                  # 5 rounds x 3 variants, about 10 min
    python benchmarks/allocator.py --rounds 1 --models mlp --variants pool,system
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from loop_training import INPUT_DIM, units_for_mib
from sweep import NO_ONEDNN, SYSTEM_ALLOCATOR, libc, mallinfo, use_settings

import _harness
from _harness import MIB

VARIANTS = ("pool", "system", "nodnn")
SETTINGS = {"pool": {}, "system": {SYSTEM_ALLOCATOR: "1"}, "nodnn": {NO_ONEDNN: "0"}}
MODELS = ("resnet50", "mlp")
CLASSES = 10
MLP_MIB = 100.0
MLP_BATCH = 64
# The tensor a child allocates and drops to see whether its bytes stay mapped.
PROBE_BYTES = 64 * MIB


# --------------------------------------------------------------------------- child


def released_tensor_mapped() -> float | None:
    """MiB of a dropped 64 MiB tensor still mapped: about 64 with the pool, 0 without."""
    import tensorflow as tf

    lib = libc()
    before = mallinfo(lib)
    tensor = tf.ones([PROBE_BYTES // 4], dtype=tf.float32)
    del tensor
    after = mallinfo(lib)
    return None if before is None or after is None else (after["mapped"] - before["mapped"]) / MIB


def median_ms(step: Callable[[], Any], count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def measure(name: str, args: argparse.Namespace) -> dict[str, float]:
    """Steady-state training step and batch-1 inference times of one model, in ms."""
    import keras
    import numpy as np
    import tensorflow as tf

    from lifecycle.cli._soak_worker import build_mlp

    rng = np.random.default_rng(0)
    if name == "mlp":
        model = build_mlp(units_for_mib(MLP_MIB), managed=False)
        x = rng.standard_normal((MLP_BATCH, INPUT_DIM), dtype=np.float32)
    else:
        side = args.input_size
        model = keras.applications.ResNet50(
            weights=None, input_shape=(side, side, 3), classes=CLASSES
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(),
        )
        x = rng.standard_normal((args.batch, side, side, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=len(x))
    for _ in range(2):  # traces the step, then grows the pool or the heap
        model.train_on_batch(x, y)
    infer = tf.function(lambda rows: model(rows, training=False))
    one = tf.constant(x[:1])
    for _ in range(3):
        infer(one).numpy()
    return {
        f"{name}_train_ms": median_ms(lambda: model.train_on_batch(x, y), args.steps),
        f"{name}_infer_ms": median_ms(lambda: infer(one).numpy(), args.calls),
    }


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    use_settings(SETTINGS[variant])
    from tensorflow.python.util import _pywrap_util_port

    result: dict[str, Any] = {
        "onednn": bool(_pywrap_util_port.IsMklEnabled()),
        "released_mapped_mib": released_tensor_mapped(),
    }
    for name in args.models:
        result.update(measure(name, args))
    # ru_maxrss is in KiB on Linux.
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


# -------------------------------------------------------------------------- parent

LABELS = {
    "pool": "pool: defaults",
    "system": f"system: {SYSTEM_ALLOCATOR}=1",
    "nodnn": f"nodnn: {NO_ONEDNN}=0",
}
METRICS = (
    ("resnet50", "resnet50_train_ms", "ResNet50 train step ms"),
    ("resnet50", "resnet50_infer_ms", "ResNet50 batch-1 call ms"),
    ("mlp", "mlp_train_ms", "MLP train step ms"),
    ("mlp", "mlp_infer_ms", "MLP batch-1 call ms"),
)


def table_rows(rounds: _harness.Rounds, args: argparse.Namespace) -> list[list[str]]:
    """One row per measurement; per variant its median (min-max) and its ratio to pool."""
    rows = []
    others = [v for v in args.variants if v != "pool"]
    metrics = [(key, label) for model, key, label in METRICS if model in args.models]
    for key, label in [*metrics, ("peak_rss_mib", "peak RSS MiB")]:
        row = [label]
        for variant in args.variants:
            row.append(rounds.cell(variant, key, ",.2f" if key.endswith("infer_ms") else ",.1f"))
        if "pool" in args.variants:
            row += [rounds.ratio_cell(key, variant, "pool") for variant in others]
        rows.append(row)
    return rows


def notes(rounds: _harness.Rounds) -> list[str]:
    lines = []
    for variant in rounds.variants:
        result = rounds.last_result(variant)
        if result is None:
            continue
        mapped = result.get("released_mapped_mib")
        kept = "unknown (no mallinfo2)" if mapped is None else f"{mapped:,.0f} MiB"
        lines.append(
            f"  {LABELS[variant]}: oneDNN {'on' if result['onednn'] else 'off'}; "
            f"of a dropped 64 MiB tensor still mapped: {kept}"
        )
    return lines


def describe_run(args: argparse.Namespace) -> list[str]:
    side = args.input_size
    return [
        *_harness.machine_lines(),
        f"models:   ResNet50 at {side}x{side}x3, 10 classes, Adam, train batch {args.batch}; "
        f"MLP {INPUT_DIM}-{units_for_mib(MLP_MIB)}-{units_for_mib(MLP_MIB)}-10 "
        f"({MLP_MIB:g} MiB with Adam slots), train batch {MLP_BATCH}; inference: 1 row",
        f"times:    median of {args.steps} training steps and {args.calls} inference calls, "
        "after a warm-up",
        _harness.rounds_line(args.rounds),
    ]


def run_parent(args: argparse.Namespace) -> int:
    options = ["--models", ",".join(args.models), "--input-size", str(args.input_size)]
    options += ["--batch", str(args.batch), "--steps", str(args.steps)]
    options += ["--calls", str(args.calls)]
    rounds = _harness.run_rounds(__file__, args.variants, args.rounds, options, args.timeout)
    others = [v for v in args.variants if v != "pool"]
    header = ["measurement", *args.variants]
    if "pool" in args.variants:
        header += [f"{variant}/pool" for variant in others]
    legend = [
        "cells: median over the rounds (min-max); <variant>/pool: the variant's value over",
        "       pool's in the same round, median of the per-round ratios (min-max)",
        "pool:   TensorFlow's defaults (oneDNN on, its pooling CPU allocator)",
        f"system: {SYSTEM_ALLOCATOR}=1 (oneDNN's kernels, glibc's malloc/free)",
        f"nodnn:  {NO_ONEDNN}=0 (TensorFlow's own kernels and CPU allocator)",
    ]
    _harness.print_report(
        describe_run(args), header, table_rows(rounds, args), legend, notes(rounds)
    )
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}"
    )
    _harness.add_input_size_argument(parser)
    parser.add_argument("--batch", type=_harness.positive_int, default=16, help="ResNet50 batch")
    parser.add_argument(
        "--steps", type=_harness.positive_int, default=15, help="timed training steps per model"
    )
    parser.add_argument(
        "--calls", type=_harness.positive_int, default=50, help="timed inference calls per model"
    )
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=600.0, rounds=5)
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    args.models = _harness.parse_variants(parser, args.models, MODELS, "--models")
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
