"""Stall benchmark: the pauses the library adds to a serving thread while a model trains.

A serving thread calls a small traced model every ``--interval-ms`` (2 ms) while
the main thread trains a series of models; what is measured is how regularly the
serving thread gets to run: the gap between the starts of consecutive calls.
Without any contention the gap is the interval (plus the sleep's overshoot);
anything beyond it is a stall.

Plain Keras is the anchor, not an idle process: Keras stalls the serving thread
on its own. Building a model and tracing its training step is long stretches of
Python on the main thread, and the serving thread, waking from its sleep, waits
for the interpreter lock (GIL) until the main thread gives it up (the switch
interval is 5 ms). Python's automatic collections stall it too: CPython's
collector holds the GIL for the whole collection, whichever thread runs it. The
library's work (``lc.manage``, ``dispose()``, and its cleaner thread, which runs
``gc.collect()`` and the clean-up of models dropped without ``dispose()``) holds
the GIL the same way; the question is how much it adds on top of what plain
Keras already costs. The targets: the longest gap at most 20 ms longer than plain
Keras's, and the p99 gap at most 1.2x plain Keras's (each taken within a round).

Two variants, each in a fresh child process:

    plain       plain Keras: ``--models`` times (6), build
                ``keras.applications.ResNet50(weights=None)`` at ``--input-size``
                (64), 10 classes, compile with Adam(1e-3) and sparse categorical
                crossentropy, fit ``--steps`` steps (2) of batch 8 on random data,
                ``del model``: the plain way, no ``clear_session()``, no
                ``gc.collect()``
    library     the same, each model ``lc.manage()``d after ``compile``, in the
                default session (what a user's code gets); even-numbered models
                (the first, third, ...) are released with ``model.dispose()``
                before ``del``, odd-numbered ones only ``del``eted, left for the
                library's cleaner to find

The serving side is the same in both: a plain (unmanaged) MLP Input(64) ->
Dense(256, relu) -> Dense(8), called through ``tf.function`` with
``input_signature=[tf.TensorSpec([None, 64], tf.float32)]`` on a batch of 1. Its
warm-up is only what a user's code does: the imports, building the model, tracing
the function and calling it a few times; no ``gc.collect()``, no settling, no
warm-up model on the main thread. The serving thread then calls it in a loop,
each call starting at a deadline (``time.sleep`` until it; the next deadline one
interval later, or at once if the call is already late), recording each call's
start and latency with ``time.perf_counter()``. The measured window is the whole
workload: the serving thread starts before the first model is built and stops
when the last one is deleted (work the cleaner still has queued then is not in
the window; the notes give what was left). Python's collections during the window
are timed through ``gc.callbacks``, those on the library's threads (named
``lifecycle-...``) apart from the others; the library variant also reports
``lc.statistics()``: the cleaner's collections, the longest of them, and the time
the library's work held the GIL.

Rounds: ``--rounds`` rounds (3 by default), each running both variants in fresh
children, the order rotating between rounds (plain library, then library plain,
...). The table gives each variant's medians over the rounds (min-max); the two
target columns are taken within each round, where the machine's drift cancels,
and reported as the median of the per-round values (min-max). The parent exits
non-zero if a child fails, and names the failed children.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/stalls.py                                       # about 25 min, 2 cores
    python benchmarks/stalls.py --rounds 1 --models 3 --input-size 32  # about 5 min

With ``--models 2`` the cleaner has nothing to collect: it collects once models
dropped without ``dispose()`` and superseded by a newer one hold 128 MiB, and
the only such model, the second, is the last.
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import _harness

VARIANTS = ("plain", "library")
ANCHOR = "plain"
LABELS = {"plain": "plain Keras", "library": "lc.manage + dispose()/cleaner"}
CLASSES = 10
BATCH = 8
INPUT_DIM = 64
SERVED_UNITS = 256
OUTPUTS = 8
# Calls of the traced serving function before measuring: tracing plus a few.
WARMUP_CALLS = 5
# Seconds to wait for the serving thread's first call, and for it to stop.
SERVING_WAIT_SECONDS = 60.0
# Thread names: the serving thread's, and the prefix of the library's threads.
SERVING_THREAD = "serving"
LIBRARY_THREAD_PREFIX = "lifecycle-"
# The targets: the longest gap at most this many ms over plain's, in the same
# round; the p99 gap at most this ratio of plain's.
MAX_GAP_TARGET_MS = 20.0
P99_RATIO_TARGET = 1.2
HEADER = [
    "variant",
    "max gap ms",
    "p99 gap ms",
    "p99.9 gap ms",
    "median gap ms",
    "py gc max ms",
    "lib gc max ms",
    "lib blocking s",
    "max gap - plain ms",
    "p99 / plain",
]


# --------------------------------------------------------------------------- child


class GcWatch:
    """Times Python's collections through ``gc.callbacks``, by the thread that ran them.

    Collections do not nest (the collector refuses to start while one runs, on any
    thread), so one start time suffices. Only collections that end while
    ``active`` count. A collection's time is not all time the GIL was held: the
    finalizers it runs are Python code (and TensorFlow's C++), which can let
    other threads run.
    """

    def __init__(self) -> None:
        self.active = False
        # (start, end, thread name) of each collection, perf_counter seconds.
        self.events: list[tuple[float, float, str]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self.active:
            name = threading.current_thread().name
            self.events.append((self._started, time.perf_counter(), name))

    def summary(self) -> dict[str, Any]:
        """Count, total and longest collection (ms) of each group of threads.

        ``gc_*``: every thread but the library's; ``lib_gc_*``: the library's;
        ``serving_gc_*``: the serving thread (also in ``gc_*``).
        """
        groups: dict[str, Callable[[str], bool]] = {
            "gc": lambda name: not name.startswith(LIBRARY_THREAD_PREFIX),
            "lib_gc": lambda name: name.startswith(LIBRARY_THREAD_PREFIX),
            "serving_gc": lambda name: name == SERVING_THREAD,
        }
        result: dict[str, Any] = {}
        for prefix, member in groups.items():
            durations = [1000 * (end - start) for start, end, name in self.events if member(name)]
            result[f"{prefix}_collections"] = len(durations)
            result[f"{prefix}_total_ms"] = sum(durations)
            result[f"{prefix}_max_ms"] = max(durations, default=0.0)
        return result

    def inside(self, start: float, end: float) -> tuple[float, str | None]:
        """Milliseconds of collections inside ``[start, end]``, and the thread that ran most."""
        by_thread: dict[str, float] = {}
        for s, e, name in self.events:
            overlap = min(end, e) - max(start, s)
            if overlap > 0:
                by_thread[name] = by_thread.get(name, 0.0) + 1000 * overlap
        most = max(by_thread, key=by_thread.__getitem__, default=None)
        return sum(by_thread.values()), most


@dataclass
class ServingLoop:
    """The thread that calls the served function at a fixed interval until stopped."""

    serve: Callable[[Any], Any]
    request: Any
    interval: float
    starts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    error: str | None = None
    first_call: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=SERVING_THREAD, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to stop after its current call; whether it stopped in time."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        clock = time.perf_counter
        try:
            deadline = clock()
            while not self._stop.is_set():
                started = clock()
                self.serve(self.request)
                finished = clock()
                self.starts.append(started)
                self.latencies.append(finished - started)
                self.first_call.set()
                deadline += self.interval
                if deadline < finished:  # late: the next call starts at once
                    deadline = finished
                time.sleep(max(0.0, deadline - clock()))
        except BaseException as error:  # reported by the main thread
            self.error = f"{type(error).__name__}: {error}"
            self.first_call.set()


def gap_summary(starts: Sequence[float], latencies: Sequence[float]) -> dict[str, Any]:
    """The gaps between consecutive call starts, and the calls' latencies, in ms.

    Args:
        starts: Each call's start, in seconds, in order.
        latencies: Each call's duration, in seconds.

    Returns:
        ``calls``; ``max_gap_ms``, ``p99_gap_ms``, ``p999_gap_ms``,
        ``median_gap_ms`` and ``max_gap_index`` (the call that ended the longest
        gap); ``median_latency_ms``, ``p99_latency_ms``, ``max_latency_ms``.

    Raises:
        ValueError: With fewer than 2 calls there is no gap.
    """
    import numpy as np

    if len(starts) < 2:
        raise ValueError(f"need at least 2 calls to measure a gap; got {len(starts)}")
    gaps = np.diff(np.asarray(starts, dtype=np.float64)) * 1000
    p50, p99, p999 = np.percentile(gaps, [50, 99, 99.9])
    lat50, lat99 = np.percentile(np.asarray(latencies, dtype=np.float64) * 1000, [50, 99])
    return {
        "calls": len(starts),
        "max_gap_ms": float(gaps.max()),
        "p99_gap_ms": float(p99),
        "p999_gap_ms": float(p999),
        "median_gap_ms": float(p50),
        "max_gap_index": int(gaps.argmax()) + 1,
        "median_latency_ms": float(lat50),
        "p99_latency_ms": float(lat99),
        "max_latency_ms": 1000 * float(max(latencies)),
    }


def build_serving(request: Any) -> Callable[[Any], Any]:
    """The served MLP behind a traced ``tf.function``, traced and called a few times."""
    import keras
    import tensorflow as tf

    model = keras.Sequential(
        [
            keras.Input((INPUT_DIM,)),
            keras.layers.Dense(SERVED_UNITS, activation="relu"),
            keras.layers.Dense(OUTPUTS),
        ]
    )

    @tf.function(input_signature=[tf.TensorSpec([None, INPUT_DIM], tf.float32)])
    def serve(x: Any) -> Any:
        return model(x, training=False)

    for _ in range(WARMUP_CALLS):
        serve(request)
    return serve


def train_models(variant: str, args: argparse.Namespace, x: Any, y: Any) -> None:
    """The main thread's workload: build, compile, fit and drop ``args.models`` ResNet50s."""
    import keras

    managed = variant == "library"
    if managed:
        import lifecycle as lc
    side = args.input_size
    for index in range(args.models):
        model = keras.applications.ResNet50(
            weights=None, input_shape=(side, side, 3), classes=CLASSES
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(),
        )
        if managed:
            model = lc.manage(model)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        if managed and index % 2 == 0:
            model.dispose()
        del model


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # Imported here so the parent never loads TensorFlow; the plain variant never
    # imports the library, the library variant before the window, as a user's code.
    import numpy as np
    import tensorflow as tf

    if variant == "library":
        import lifecycle  # noqa: F401

    rng = np.random.default_rng(0)
    request = tf.constant(rng.standard_normal((1, INPUT_DIM), dtype=np.float32))
    serve = build_serving(request)
    samples = BATCH * args.steps
    side = args.input_size
    x = rng.standard_normal((samples, side, side, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=samples)

    watch = GcWatch()
    gc.callbacks.append(watch)
    serving = ServingLoop(serve, request, args.interval_ms / 1000)
    serving.start()
    if not serving.first_call.wait(SERVING_WAIT_SECONDS) or serving.error:
        raise RuntimeError(f"the serving thread failed to make its first call: {serving.error}")
    watch.active = True
    started = time.perf_counter()
    try:
        train_models(variant, args, x, y)
    finally:
        workload = time.perf_counter() - started
        stopped = serving.stop(SERVING_WAIT_SECONDS)
        watch.active = False
        gc.callbacks.remove(watch)
    if serving.error:
        raise RuntimeError(f"the serving thread failed: {serving.error}")
    if not stopped:
        raise RuntimeError(f"the serving thread did not stop within {SERVING_WAIT_SECONDS:g} s")

    result: dict[str, Any] = {
        "variant": variant,
        "models": args.models,
        "workload_s": workload,
        **gap_summary(serving.starts, serving.latencies),
        **watch.summary(),
    }
    index = result["max_gap_index"]
    gap_start, gap_end = serving.starts[index - 1], serving.starts[index]
    result["max_gap_at_s"] = gap_start - started
    result["gc_in_max_gap_ms"], result["gc_in_max_gap_thread"] = watch.inside(gap_start, gap_end)
    if variant == "library":
        result.update(library_statistics())
    return result


def library_statistics() -> dict[str, Any]:
    """What ``lc.statistics()`` says of the library's work (the served model is not managed)."""
    import lifecycle as lc

    stats = lc.statistics(count_graphs=False)
    return {
        "collections": stats.collections,
        "max_collection_seconds": stats.max_collection_seconds,
        "blocking_seconds": stats.blocking_seconds,
        "models_cleaned": stats.models_cleaned,
        "models_disposed": stats.models_disposed,
        "cleaner_queue": stats.cleaner_queue,
    }


# -------------------------------------------------------------------------- parent


def per_round_differences(
    over: Sequence[float | None], under: Sequence[float | None]
) -> list[float]:
    """``over[i] - under[i]`` for each round ``i`` where both were measured.

    Args:
        over: The value in each round (None: not measured).
        under: The value subtracted, in the same rounds.

    Returns:
        The differences, in round order.

    Raises:
        ValueError: If the two sequences differ in length.
    """
    if len(over) != len(under):
        raise ValueError(f"one value per round on each side; got {len(over)} and {len(under)}")
    return [a - b for a, b in zip(over, under, strict=True) if a is not None and b is not None]


def max_gap_differences(rounds: _harness.Rounds, variant: str) -> list[float]:
    """Per round, ``variant``'s longest gap minus plain Keras's, in ms."""
    return per_round_differences(
        rounds.per_round(variant, "max_gap_ms"), rounds.per_round(ANCHOR, "max_gap_ms")
    )


def milliseconds(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    """A metric: a result's ``key``, in seconds, as milliseconds (None if absent)."""

    def metric(result: Mapping[str, Any]) -> float | None:
        value = result.get(key)
        return None if value is None else 1000 * float(value)

    return metric


def table_rows(rounds: _harness.Rounds) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        if not rounds.succeeded(variant):
            rows.append([LABELS[variant], "FAILED", *["-"] * (len(HEADER) - 2)])
            continue
        rows.append(
            [
                LABELS[variant],
                rounds.cell(variant, "max_gap_ms", ".1f"),
                rounds.cell(variant, "p99_gap_ms", ".1f"),
                rounds.cell(variant, "p999_gap_ms", ".1f"),
                rounds.cell(variant, "median_gap_ms", ".2f"),
                rounds.cell(variant, "gc_max_ms", ".1f"),
                rounds.cell(variant, milliseconds("max_collection_seconds"), ".1f"),
                rounds.cell(variant, "blocking_seconds", ".2f"),
                _harness.fmt_spread(max_gap_differences(rounds, variant), "+.1f"),
                rounds.ratio_cell("p99_gap_ms", variant, ANCHOR),
            ]
        )
    return rows


def target_lines(rounds: _harness.Rounds) -> list[str]:
    """Whether the library variant meets each target, by the median of the per-round values."""
    if "library" not in rounds.variants or ANCHOR not in rounds.variants:
        return ["  not judged: needs both variants"]
    checks = [
        (
            f"max gap library - plain <= +{MAX_GAP_TARGET_MS:g} ms",
            _harness.spread_of(max_gap_differences(rounds, "library")),
            MAX_GAP_TARGET_MS,
            "+.1f",
            " ms",
        ),
        (
            f"p99 gap library / plain <= {P99_RATIO_TARGET:g}x",
            _harness.spread_of(rounds.ratios("p99_gap_ms", "library", ANCHOR)),
            P99_RATIO_TARGET,
            ".2f",
            "x",
        ),
    ]
    lines = []
    for label, found, bound, spec, suffix in checks:
        if found is None:
            lines.append(f"  {label}: not measured")
            continue
        verdict = "met" if found.median <= bound else "MISSED"
        median = _harness.fmt(found.median, spec, suffix)
        lines.append(f"  {label}: {verdict} (median {median}, {found.count} rounds)")
    return lines


def variant_notes(rounds: _harness.Rounds) -> list[str]:
    notes = []
    for variant in rounds.variants:
        result = rounds.last_result(variant)
        if result is None:
            continue
        parts = [
            f"{result['calls']:,} calls in {result['workload_s']:.1f} s",
            f"latency p50 {result['median_latency_ms']:.2f} ms, "
            f"p99 {result['p99_latency_ms']:.2f} ms, max {result['max_latency_ms']:.1f} ms",
            f"longest gap {result['max_gap_ms']:.1f} ms at {result['max_gap_at_s']:.1f} s, "
            f"{result['gc_in_max_gap_ms']:.1f} ms of collections inside it"
            + (
                f" (mostly on thread {result['gc_in_max_gap_thread']})"
                if result["gc_in_max_gap_thread"]
                else ""
            ),
            f"gc off the library's threads: {result['gc_collections']} "
            f"({result['gc_total_ms']:.0f} ms), of them on the serving thread "
            f"{result['serving_gc_collections']} (longest {result['serving_gc_max_ms']:.1f} ms)",
            f"on them: {result['lib_gc_collections']} ({result['lib_gc_total_ms']:.0f} ms, "
            f"longest {result['lib_gc_max_ms']:.1f} ms)",
        ]
        if "collections" in result:
            parts.append(
                f"cleaner: {result['collections']} collections, models disposed "
                f"{result['models_disposed']}, cleaned {result['models_cleaned']}, "
                f"tasks queued at the end {result['cleaner_queue']}"
            )
        notes.append(f"  {variant}, last round: " + "; ".join(parts))
    return notes


def describe_run(args: argparse.Namespace) -> list[str]:
    side = args.input_size
    return [
        *_harness.machine_lines(),
        f"serving:  MLP {INPUT_DIM}-{SERVED_UNITS}-{OUTPUTS} (plain) through tf.function, "
        f"batch 1, a call every {args.interval_ms:g} ms on its own thread",
        f"workload: {args.models} x ResNet50 at {side}x{side}x3, {CLASSES} classes, Adam, "
        f"{args.steps} fit steps of batch {BATCH}, then del; library: lc.manage, dispose() "
        "of every other one",
        _harness.rounds_line(args.rounds),
    ]


def child_options(args: argparse.Namespace) -> list[str]:
    return [
        *("--models", str(args.models), "--steps", str(args.steps)),
        *("--input-size", str(args.input_size), "--interval-ms", str(args.interval_ms)),
    ]


def run_parent(args: argparse.Namespace) -> int:
    rounds = _harness.run_rounds(
        __file__, args.variants, args.rounds, child_options(args), args.timeout
    )
    legend = [
        "gap:            time between the starts of two consecutive serving calls; the",
        f"                stall is the gap minus the {args.interval_ms:g} ms interval",
        "max/p99/p99.9/median gap ms: over every call of the workload",
        "py gc max ms:   longest automatic Python collection on any thread but the",
        "                library's (gc.callbacks); it can exceed the max gap: the finalizers",
        "                a collection runs can let other threads take the GIL",
        "lib gc max ms:  longest collection the library's cleaner ran",
        "                (lc.statistics().max_collection_seconds)",
        "lib blocking s: time the library's work held the GIL off the caller's thread",
        "                (lc.statistics().blocking_seconds)",
        "max gap - plain ms: longest gap minus plain Keras's in the same round",
        "p99 / plain:    p99 gap over plain Keras's in the same round",
        "cells: median over the rounds (min-max); the last two: median of the per-round",
        "                values (min-max)",
        "targets (median of the per-round values):",
        *target_lines(rounds),
        "per variant:",
        *variant_notes(rounds),
    ]
    _harness.print_report(describe_run(args), HEADER, table_rows(rounds), legend)
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--models", type=_harness.positive_int, default=6, help="ResNet50s trained per child"
    )
    parser.add_argument(
        "--steps", type=_harness.positive_int, default=2, help="fit steps of each model"
    )
    _harness.add_input_size_argument(parser)
    parser.add_argument(
        "--interval-ms", type=float, default=2.0, help="ms between the serving calls' starts"
    )
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=900.0, rounds=3)
    args = parser.parse_args(argv)
    if args.interval_ms <= 0 or args.timeout <= 0:
        parser.error("--interval-ms and --timeout must be positive")
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
