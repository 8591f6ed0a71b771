"""Stalls: the pauses the library adds to a serving thread while models train.

A serving thread calls a small traced model every ``--interval-ms`` while the
main thread trains ``--models`` ResNet50s (``--input-size``, Adam, ``--steps``
fit steps of batch 8); what is measured is the gap between the starts of
consecutive calls (beyond the interval, a stall). Plain Keras is the anchor: it
stalls the thread on its own (long stretches of Python holding the GIL, and
automatic collections).

    plain      plain Keras, ``del model`` (no ``clear_session()``, no ``gc.collect()``)
    library    each model ``lc.manage()``d in the default session; every other one
               ``dispose()``d, the others left for the library's cleaner
    session    plain Keras's loop, unchanged, inside ``with lc.LifecycleSession():``
               (the session owns every model; its cleaner frees the dropped ones)

The served model is a plain MLP 64-256-8 behind ``tf.function`` on a batch of 1.
A child reports the max, p99, p99.9 and median gap, the calls' latency, Python's
collections timed through ``gc.callbacks`` (off and on the library's threads,
and those inside the longest gap) and, for the library, ``lc.statistics()``:
the cleaner's collections, the longest, the time it held the GIL. Targets, for
each of the library's variants, each taken within a round: the longest gap at
most 20 ms over plain's in the median and at most 100 ms over it in every
round, and the p99 gap at most 1.1x plain's.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/stalls.py             # about 25 min on 2 cores
    python benchmarks/stalls.py --quick
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import _harness
from _harness import Metric, Option

CLASSES = 10
BATCH = 8
INPUT_DIM = 64
WAIT_SECONDS = 60.0  # for the serving thread's first call, and for it to stop
SERVING_THREAD = "serving"
LIBRARY_THREAD = "lifecycle-"  # the prefix of the library's threads
MAX_GAP_TARGET_MS = 20.0
MAX_GAP_ROUND_LIMIT_MS = 100.0
P99_RATIO_TARGET = 1.1
LIBRARY_VARIANTS = ("library", "session")


def serving_loop(
    serve: Callable[[], Any], interval: float, stop: threading.Event
) -> tuple[list[float], list[float]]:
    """Call ``serve`` every ``interval`` s (at once when late) until ``stop``; starts, latencies."""
    starts: list[float] = []
    latencies: list[float] = []
    clock = time.perf_counter
    deadline = clock()
    while not stop.is_set():
        starts.append(clock())
        serve()
        latencies.append(1000 * (clock() - starts[-1]))
        deadline = max(deadline + interval, clock())
        time.sleep(max(0.0, deadline - clock()))
    return starts, latencies


def train_models(variant: str, args: argparse.Namespace, x: Any, y: Any) -> None:
    """The main thread's workload: build, compile, fit and drop ``args.models`` ResNet50s."""
    if variant != "session":
        for index in range(args.models):
            train_one(variant, index, args.input_size, x, y)
        return
    import lifecycle as lc

    with lc.LifecycleSession():  # the plain loop, unchanged, in a session
        for index in range(args.models):
            train_one("plain", index, args.input_size, x, y)


def train_one(variant: str, index: int, side: int, x: Any, y: Any) -> None:
    """One ResNet50 built, compiled, fitted and dropped; ``library`` manages it."""
    import keras

    model = keras.applications.ResNet50(weights=None, input_shape=(side, side, 3), classes=CLASSES)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    if variant == "library":
        import lifecycle as lc

        model = lc.manage(model)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    if variant == "library" and index % 2 == 0:
        model.dispose()
    del model


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import keras
    import numpy as np
    import tensorflow as tf

    if variant in LIBRARY_VARIANTS:  # imported before the window, as a user's code does
        import lifecycle as lc

    rng = np.random.default_rng(0)
    request = tf.constant(rng.standard_normal((1, INPUT_DIM), dtype=np.float32))
    served = keras.Sequential(
        [
            keras.Input((INPUT_DIM,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(8),
        ]
    )
    function = tf.function(
        lambda x: served(x, training=False),
        input_signature=[tf.TensorSpec([None, INPUT_DIM], tf.float32)],
    )
    for _ in range(5):
        function(request)
    side = args.input_size
    x = rng.standard_normal((BATCH * args.steps, side, side, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=len(x))

    watch, stop, found = _harness.Collections(), threading.Event(), {}

    def serve() -> None:
        found["calls"] = serving_loop(lambda: function(request), args.interval_ms / 1000, stop)

    serving = threading.Thread(target=serve, name=SERVING_THREAD, daemon=True)
    started = time.perf_counter()
    serving.start()
    try:
        train_models(variant, args, x, y)
    finally:
        workload = time.perf_counter() - started
        stop.set()
        serving.join(WAIT_SECONDS)
        watch.close()
    starts, latencies = found.get("calls", ([], []))
    if not starts or len(starts) < 2:
        raise RuntimeError("the serving thread failed or did not stop; see its traceback above")
    gaps = [1000 * (b - a) for a, b in itertools.pairwise(starts)]
    p50, p99, p999 = _harness.percentiles(gaps, 50, 99, 99.9)
    longest = max(range(len(gaps)), key=gaps.__getitem__)
    result: dict[str, Any] = {
        "calls": len(starts),
        "latency_p50_ms": _harness.percentiles(latencies, 50)[0],
        "latency_p99_ms": _harness.percentiles(latencies, 99)[0],
        "latency_max_ms": max(latencies),
        "workload_s": workload,
        "max_gap_ms": gaps[longest],
        "p99_gap_ms": p99,
        "p999_gap_ms": p999,
        "median_gap_ms": p50,
        "max_gap_at_s": starts[longest] - started,
        "gc_in_max_gap_ms": watch.inside(starts[longest], starts[longest + 1]),
        **watch.summary("gc", lambda generation, name: not name.startswith(LIBRARY_THREAD)),
        **watch.summary("lib_gc", lambda generation, name: name.startswith(LIBRARY_THREAD)),
        **watch.summary("serving_gc", lambda generation, name: name == SERVING_THREAD),
    }
    if variant in LIBRARY_VARIANTS:
        stats = lc.statistics(count_graphs=False)
        result["collections"] = stats.collections
        result["max_collection_ms"] = 1000 * stats.max_collection_seconds
        result["blocking_ms"] = 1000 * stats.blocking_seconds
        result["models_cleaned"] = stats.models_cleaned
        result["models_disposed"] = stats.models_disposed
        result["cleaner_queue"] = stats.cleaner_queue
    return result


def targets(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """The targets of each library variant that ran, judged on the per-round values."""
    lines = []
    for variant in LIBRARY_VARIANTS:
        pairs = [(r[variant], r["plain"]) for r in runs if r.get(variant) and r.get("plain")]
        if variant != "library" and not pairs:
            continue
        lines.extend(variant_targets(variant, pairs))
    return lines


def variant_targets(variant: str, pairs: list[tuple[dict, dict]]) -> list[str]:
    over = [lib["max_gap_ms"] - plain["max_gap_ms"] for lib, plain in pairs]
    gap = _harness.spread_of(over)
    p99 = _harness.spread_of(lib["p99_gap_ms"] / plain["p99_gap_ms"] for lib, plain in pairs)
    lines = []
    for label, found, bound, spec in (
        (f"max gap {variant} - plain <= +{MAX_GAP_TARGET_MS:g} ms", gap, MAX_GAP_TARGET_MS, "+.1f"),
        (f"p99 gap {variant} / plain <= {P99_RATIO_TARGET:g}x", p99, P99_RATIO_TARGET, ".2f"),
    ):
        verdict = "not measured" if found is None else "met" if found.median <= bound else "MISSED"
        median = "" if found is None else f" (median {found.median:{spec}})"
        lines.append(f"target: {label}: {verdict}{median}")
    if over:
        verdict = "met" if max(over) <= MAX_GAP_ROUND_LIMIT_MS else "MISSED"
        lines.append(
            f"target: max gap {variant} - plain <= +{MAX_GAP_ROUND_LIMIT_MS:g} ms in every "
            f"round: {verdict} (largest {max(over):+.1f})"
        )
    per_round = ", ".join(f"{value:+.1f}" for value in over)
    return [*lines, f"max gap {variant} - plain by round (ms): {per_round or '-'}"]


ms = "ms"
BENCHMARK = _harness.Benchmark(
    name="stalls",
    doc=__doc__,
    variants={
        "plain": "plain Keras",
        "library": "lc.manage + dispose()/cleaner",
        "session": "plain Keras inside a LifecycleSession",
    },
    metrics=[
        Metric("max_gap_ms", ms, ".1f", "max gap ms"),
        Metric("p99_gap_ms", ms, ".1f", "p99 gap ms"),
        Metric("p999_gap_ms", ms, ".1f", "p99.9 gap ms", ratio=False),
        Metric("median_gap_ms", ms, ".2f", "median gap ms", ratio=False),
        Metric("gc_max_ms", ms, ".1f", "py gc max ms", ratio=False),
        Metric("gc_in_max_gap_ms", ms, ".1f", "gc in max gap ms", ratio=False),
        Metric("calls", "", ",.0f", "calls", ratio=False),
        Metric("latency_p50_ms", ms, ".2f", "call p50 ms", ratio=False),
        Metric("latency_p99_ms", ms, ".2f", "call p99 ms", ratio=False),
        Metric("latency_max_ms", ms, ".1f", "call max ms", ratio=False),
        Metric("max_gap_at_s", "s", ".1f", "max gap at s", ratio=False),
        Metric("gc_collections", "", ".0f", "py gcs", ratio=False),
        Metric("gc_total_ms", ms, ".0f", "py gc ms", ratio=False),
        Metric("serving_gc_collections", "", ".0f", "serving-thread gcs", ratio=False),
        Metric("serving_gc_max_ms", ms, ".1f", "serving gc max ms", ratio=False),
        Metric("lib_gc_collections", "", ".0f", "lib-thread gcs", ratio=False),
        Metric("lib_gc_max_ms", ms, ".1f", "lib gc max ms", ratio=False),
        Metric("max_collection_ms", ms, ".1f", "cleaner gc max ms", ratio=False),
        Metric("blocking_ms", ms, ".0f", "lib GIL held ms", ratio=False),
        Metric("models_disposed", "", ".0f", "disposed", ratio=False),
        Metric("models_cleaned", "", ".0f", "cleaned", ratio=False),
        Metric("cleaner_queue", "", ".0f", "queued at end", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--models", 6, "ResNet50s trained per child", _harness.positive_int),
        Option("--steps", 2, "fit steps of each model", _harness.positive_int),
        Option("--input-size", 64, "image side of ResNet50", _harness.image_side),
        Option("--interval-ms", 2.0, "ms between serving calls", _harness.positive_float),
    ],
    quick={"models": 2, "steps": 1, "input_size": 32},
    timeout=900.0,
    notes=targets,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
