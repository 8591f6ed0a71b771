"""Allocator benchmark: which CPU allocator setting gives memory back, at what cost.

With oneDNN's kernels on (TensorFlow's default on x86 CPUs with AVX-512 VNNI,
BF16 or AMX), TensorFlow's CPU allocator keeps every block of 4 KiB or more in
a pool that grows to the largest working set and never shrinks, so memory a
disposed model released stays with the process. The settings that avoid it are
read once when TensorFlow starts; this measures each, one variant per fresh
child process:

    pool          TensorFlow's defaults: oneDNN on, its pooling CPU allocator
    system        ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1`` alone: oneDNN's kernels,
                  every block from glibc, freed when released
    system-tuned  as ``system``, and ``lc.tune_allocator()`` (a 64 KiB glibc
                  mmap threshold, a trim after every collection)
    lc-system     ``LIFECYCLE_ALLOCATOR=system``: as ``system``, with glibc kept
                  from mapping and unmapping large blocks on every step (one
                  arena, no per-block mappings, trims by the cleaners)
    nodnn         ``TF_ENABLE_ONEDNN_OPTS=0``: neither oneDNN's kernels nor its
                  allocator

Each child first checks what the setting did: it allocates a 64 MiB tensor,
drops it, and reads how many bytes glibc still has mapped on their own
(``mallinfo2``). Then, for each model, on the user's path (managed, fitted,
disposed, nothing settled):

    resnet50  ``keras.applications.ResNet50(weights=None)`` at ``--input-size``
              (64), 10 classes, Adam: ``train_on_batch`` on ``--batch`` (16)
              images; traced ``model(x, training=False)`` on 1 and 32 images
    mlp       the 3-layer MLP of ``benchmarks/loop_training.py`` whose weights
              and Adam slots hold 100 MiB: ``train_on_batch`` on 64 rows;
              traced calls on 1 and 32 rows

Each time is the median of ``--steps`` training steps (with the minor page
faults per step) and ``--calls`` inference calls, after a warm-up. Then the
model is disposed and the child waits 3 s: *returned* is the RSS that came
back, as a share of what the RSS grew by from before the model was built, and
*pooled* what ``lc.statistics().cpu_pooled_bytes`` reports. Models run in
order ``resnet50`` then ``mlp``, so the second starts where the first left
the process. The child also reports its peak RSS. Variants run in
``--rounds`` rounds (3 by default), a fresh child per variant per round, the
order rotating; cells are medians over the rounds (min-max), and a setting's
ratio to ``pool`` is taken within each round, then reported as the median of
those per-round ratios (min-max). The parent exits non-zero if a child fails,
and names the failed children.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/allocator.py                  # 3 rounds x 5 variants, about 25 min
    python benchmarks/allocator.py --rounds 1 --models mlp --variants pool,lc-system
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
from _harness import MIB

VARIANTS = ("pool", "system", "system-tuned", "lc-system", "nodnn")
LIFECYCLE_ALLOCATOR = "LIFECYCLE_ALLOCATOR"
SETTINGS = {
    "pool": {},
    "system": {SYSTEM_ALLOCATOR: "1"},
    "system-tuned": {SYSTEM_ALLOCATOR: "1"},
    "lc-system": {LIFECYCLE_ALLOCATOR: "system"},
    "nodnn": {NO_ONEDNN: "0"},
}
INFER_BATCH = 32
# How long a child waits after dispose() before reading what came back.
RETURN_WAIT = 3.0
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


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timings(name: str, model: Any, x: Any, y: Any, args: argparse.Namespace) -> dict[str, float]:
    """Steady-state step and call times of ``model``, and page faults per step."""
    import numpy as np
    import tensorflow as tf

    for _ in range(2):  # traces the step, then grows the pool or the heap
        model.train_on_batch(x, y)
    infer = tf.function(lambda rows: model(rows, training=False))
    one = tf.constant(x[:1])
    many = tf.constant(np.resize(x, (INFER_BATCH, *x.shape[1:])))
    for _ in range(3):
        infer(one).numpy()
        infer(many).numpy()
    faults = minor_faults()
    result = {f"{name}_train_ms": median_ms(lambda: model.train_on_batch(x, y), args.steps)}
    result[f"{name}_faults"] = (minor_faults() - faults) / args.steps
    result[f"{name}_infer_ms"] = median_ms(lambda: infer(one).numpy(), args.calls)
    result[f"{name}_infer32_ms"] = median_ms(lambda: infer(many).numpy(), args.calls)
    return result


def measure(name: str, args: argparse.Namespace) -> dict[str, float]:
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
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(),
        )
        x = rng.standard_normal((args.batch, side, side, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=len(x))
    result = timings(name, model, x, y, args)
    fitted = process.memory_info().rss
    model.dispose()
    del model
    time.sleep(RETURN_WAIT)
    after = process.memory_info().rss
    result[f"{name}_returned"] = (fitted - after) / max(1, fitted - before)
    result[f"{name}_returned_mib"] = (fitted - after) / MIB
    pooled = lc.statistics(count_graphs=False).cpu_pooled_bytes
    result[f"{name}_pooled_mib"] = -1.0 if pooled is None else pooled / MIB
    return result


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    os.environ.pop(LIFECYCLE_ALLOCATOR, None)
    use_settings(SETTINGS[variant])
    import lifecycle as lc  # before TensorFlow: it reads LIFECYCLE_ALLOCATOR

    if variant == "system-tuned":
        lc.tune_allocator()
    allocator = lc.statistics(count_graphs=False).cpu_allocator
    result: dict[str, Any] = {
        "onednn": allocator != "tensorflow",
        "cpu_allocator": allocator,
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
    "system-tuned": f"system-tuned: {SYSTEM_ALLOCATOR}=1, lc.tune_allocator()",
    "lc-system": f"lc-system: {LIFECYCLE_ALLOCATOR}=system",
    "nodnn": f"nodnn: {NO_ONEDNN}=0",
}
METRICS = tuple(
    (model, f"{model}_{key}", f"{label} {what}")
    for model, label in (("resnet50", "ResNet50"), ("mlp", "MLP"))
    for key, what in (
        ("train_ms", "train step ms"),
        ("faults", "page faults/step"),
        ("infer_ms", "batch-1 call ms"),
        ("infer32_ms", "batch-32 call ms"),
        ("returned", "RSS returned"),
        ("returned_mib", "returned MiB"),
        ("pooled_mib", "pooled MiB"),
    )
)
# Shares and counts get no ratio column: a ratio of shares reads as nonsense.
NO_RATIO = ("_returned", "_returned_mib", "_pooled_mib", "_faults")


def table_rows(rounds: _harness.Rounds, args: argparse.Namespace) -> list[list[str]]:
    """One row per measurement; per variant its median (min-max) and its ratio to pool."""
    rows = []
    others = [v for v in args.variants if v != "pool"]
    metrics = [(key, label) for model, key, label in METRICS if model in args.models]
    for key, label in [*metrics, ("peak_rss_mib", "peak RSS MiB")]:
        row = [label]
        spec = ",.2f" if key.endswith(("infer_ms", "_returned")) else ",.1f"
        if key.endswith("_faults"):
            spec = ",.0f"
        for variant in args.variants:
            row.append(rounds.cell(variant, key, spec))
        if "pool" in args.variants:
            if key.endswith(NO_RATIO):
                row += ["" for _ in others]
            else:
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
        f"({MLP_MIB:g} MiB with Adam slots), train batch {MLP_BATCH}; inference: 1 and "
        f"{INFER_BATCH} rows",
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
        "system-tuned: as system, with lc.tune_allocator() (64 KiB mmap threshold, trims)",
        f"lc-system: {LIFECYCLE_ALLOCATOR}=system (as system; glibc: one arena, no",
        "       per-block mappings, 1 GiB trim threshold; the cleaners trim)",
        f"nodnn:  {NO_ONEDNN}=0 (TensorFlow's own kernels and CPU allocator)",
        f"RSS returned: what came back within {RETURN_WAIT:g} s of dispose(), over what the",
        "       RSS grew by from before the model was built; pooled: cpu_pooled_bytes then",
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
    _harness.add_child_arguments(parser, VARIANTS, timeout=600.0, rounds=3)
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
