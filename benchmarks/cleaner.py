"""Cleaner-latency benchmark: what collecting dropped models costs a served model.

A small served model (MLP Input(64) -> Dense(256, relu) -> Dense(8), an
``lc.ManagedModel`` called through ``lc.serving_function(model,
tf.TensorSpec([None, 64], tf.float32))``) answers requests of batch 1, back to
back, on the main ("request") thread for ``--seconds`` seconds; each request's
latency is measured with ``time.perf_counter_ns``. Meanwhile a "churn" thread
builds, fits (2 steps of batch 32, Adam) and drops MLPs of a few MiB each
(Input(64) -> Dense(units) -> Dense(units) -> Dense(8), ``--churn-units``), in a
loop. The variants differ only in how the churned models are dropped and who
collects the garbage they leave; the request path is the same in all of them (in
the naive ones the served model lives in the default session, alone):

    naive       plain ``keras.Model``s, ``del model``; the request thread runs
                ``gc.collect()`` every N requests ("letting Python's collector
                run on the request thread"). N is calibrated in each run so
                that it collects about as often as the cleaner does: N = the
                requests served per churned model during the calibration x 2
                (the cleaner's threshold is 2 models' worth of pressure, below).
    naive-auto  plain ``keras.Model``s, ``del model``; only Python's automatic
                collector runs.
    bg          ``LifecycleSession(cleanup=IN_BACKGROUND)`` around everything.
    sp          ``ON_SAFE_POINTS``. Calls through a serving function reach no
                safe point (``ServingFunction.__call__`` only enters the call
                gate), so the cleanup runs on the churn thread, whose managed
                models reach safe points on creation, ``compile`` and ``fit``.
    close       ``ON_SESSION_CLOSE``: the cleaner runs nothing (no collection, no
                clean-up) before the session closes; Python's own collector
                still runs.
    bg-frozen   ``IN_BACKGROUND`` with ``freeze_heap=True``: one collection and
                ``gc.freeze()`` after the warm-up, so later full collections only
                scan objects created after it.

In the lifecycle variants the churn thread puts each model under the session
with ``lc.manage(keras.Model(...), session=session)``: a new thread starts in
the process-wide default session, not in the main thread's, so the session is
passed explicitly (simpler than a child session per thread, same strategy).
Every other churned model is released with ``model.dispose()`` (``collect=None``:
its garbage is left to the cleaner), the others are dropped without it, so the
finalizer path queues their cleanup. The session's ``pressure_threshold`` is
set to 2 churned models' worth of allocation plus release (4x the model's
weights + Adam slots), so the cleaner collects about every 2 churned models.

Each request's latency runs from the top of the loop iteration to the end of the
call, so a collection the request thread runs (explicitly or automatically) is
charged to the request it delays. The load is closed-loop (one request at a
time): a pause delays one measured request, not a queue of them, so the
percentiles understate what an open-loop server would see during a pause.

CPython's ``gc.collect()`` holds the GIL for the whole collection: a collection
on the cleaner or churn thread still stalls the request thread whenever it needs
the interpreter, and only the time it spends inside TensorFlow's C++ (GIL
released) overlaps with it. Even with no collection, two threads share one GIL,
so the request thread also waits for the churn thread's Python work (the
interpreter's switch interval is 5 ms).

Every variant runs in a fresh child process (this script re-invoked with
``--variant``), once per round of ``--rounds`` rounds (3 by default), the order
of the variants rotating between rounds (naive naive-auto bg ..., then
naive-auto bg ... naive, ...), with the same protocol: warm up (one churned model built and
dropped, 200 requests), start the churn thread, wait for its first model, serve
until it finishes the model it is on, then count the requests served while it
churns 2 more (calibration, not measured), then measure. Full (generation 2)
collections and the time spent in all collections are counted with
``gc.callbacks`` in every variant, and the lifecycle variants also report the
cleaner's own counters (``session.statistics().cleaner``). The parent prints
the machine and two tables (latency, then collections and RSS): each cell is
the median over the rounds (min-max), and p99 vs naive is taken within each
round, where the machine's drift cancels, then reported as the median of the
per-round ratios (min-max). The notes give each variant's last round. The
parent exits non-zero if a child fails or times out, and names the failed
children under the tables.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/cleaner.py                    # 3 rounds x 6 x 15 s, ~8 min
    python benchmarks/cleaner.py --rounds 1 --seconds 3 --variants naive,bg  # ~30 s
    python benchmarks/cleaner.py --churn-units 1024 --timeout 300
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import _harness
from _harness import MIB

if TYPE_CHECKING:
    import keras
    import numpy as np

    import lifecycle as lc

VARIANTS = ("naive", "naive-auto", "bg", "sp", "close", "bg-frozen")
# Lifecycle variants: the CleanupStrategy member each uses (by name: the parent
# never imports lifecycle, which imports TensorFlow).
STRATEGIES = {
    "bg": "IN_BACKGROUND",
    "sp": "ON_SAFE_POINTS",
    "close": "ON_SESSION_CLOSE",
    "bg-frozen": "IN_BACKGROUND",
}
LABELS = {
    "naive": "naive: gc.collect() on request thread",
    "naive-auto": "naive-auto: automatic gc only",
    "bg": "bg: IN_BACKGROUND",
    "sp": "sp: ON_SAFE_POINTS",
    "close": "close: ON_SESSION_CLOSE",
    "bg-frozen": "bg-frozen: IN_BACKGROUND + freeze_heap",
}

INPUT_DIM = 64
SERVED_UNITS = 256
OUTPUTS = 8
CHURN_BATCH = 32
CHURN_STEPS = 2
# Weights + the two Adam slots (m, v), float32.
BYTES_PER_PARAM = 4 * 3
# The cleaner collects after this many churned models' worth of byte pressure;
# the naive variant's N is calibrated to the same rate.
MODELS_PER_COLLECTION = 2
WARMUP_REQUESTS = 200
# Churned models over which the calibration counts requests.
CALIBRATION_MODELS = 2
# Seconds to wait for the churn thread's first model, and for it to stop.
CHURN_WAIT_SECONDS = 120.0
HEADER = ["variant", "requests", "p50 µs", "p99 µs", "p99.9 µs", "max ms", "p99 vs naive"]
GC_HEADER = [
    "variant",
    "full gcs",
    "cleaner gcs",
    "gc ms",
    "max gc ms",
    "final RSS MiB",
    "RSS growth MiB",
]
SESSION_NAME = "bench"
CLEANER_THREAD = f"lifecycle-cleaner-{SESSION_NAME}"
CHURN_THREAD = "churn"


def served_params() -> int:
    return (INPUT_DIM + 1) * SERVED_UNITS + (SERVED_UNITS + 1) * OUTPUTS


def churn_params(units: int) -> int:
    return (INPUT_DIM + 1) * units + (units + 1) * units + (units + 1) * OUTPUTS


def pressure_threshold(units: int) -> int:
    """Bytes of pressure for MODELS_PER_COLLECTION churned models.

    A managed model reports its buffers once as allocated (on creation and after
    ``fit`` builds the optimizer) and once as released (``dispose()`` or the
    cleaner's clean-up), so each churned model adds about twice its bytes.
    """
    return MODELS_PER_COLLECTION * 2 * churn_params(units) * BYTES_PER_PARAM


# --------------------------------------------------------------------------- child


def mlp(units: int, hidden: int) -> tuple[Any, Any]:
    """Inputs and outputs of an MLP Input(64) -> ``hidden`` x Dense(units) -> Dense(8)."""
    import keras

    inputs = keras.Input((INPUT_DIM,))
    x = inputs
    for _ in range(hidden):
        x = keras.layers.Dense(units, activation="relu")(x)
    return inputs, keras.layers.Dense(OUTPUTS)(x)


def build_churn_model(units: int, session: lc.LifecycleSession | None) -> keras.Model:
    import keras

    import lifecycle as lc

    model = keras.Model(*mlp(units, hidden=2))
    if session is not None:
        model = lc.manage(model, session=session)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


class GcWatch:
    """Counts collections and their duration through ``gc.callbacks``.

    Collections do not nest (the collector refuses to start while one runs), so
    one start time suffices. Only collections that end while ``active`` count.
    """

    def __init__(self) -> None:
        self.active = False
        self.collections = 0
        self.full_collections = 0
        self.seconds = 0.0
        self.max_seconds = 0.0
        # Thread name -> [full collections, seconds in them].
        self.full_by_thread: dict[str, list[float]] = {}
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if not self.active:
            return
        elapsed = time.perf_counter() - self._started
        self.collections += 1
        self.seconds += elapsed
        self.max_seconds = max(self.max_seconds, elapsed)
        if info["generation"] == 2:
            self.full_collections += 1
            entry = self.full_by_thread.setdefault(threading.current_thread().name, [0, 0.0])
            entry[0] += 1
            entry[1] += elapsed


@dataclass
class Churn:
    """The thread that builds, fits and drops models until stopped."""

    units: int
    session: lc.LifecycleSession | None
    x: np.ndarray
    y: np.ndarray
    models: int = 0
    disposed: int = 0
    cycle_seconds: list[float] = field(default_factory=list)
    error: str | None = None
    first_done: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=CHURN_THREAD, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to stop after its current model; whether it stopped in time."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                model = build_churn_model(self.units, self.session)
                model.fit(self.x, self.y, batch_size=CHURN_BATCH, epochs=1, verbose=0)
                if self.session is not None and self.models % 2 == 0:
                    model.dispose()
                    self.disposed += 1
                del model
                self.models += 1
                self.cycle_seconds.append(time.perf_counter() - started)
                self.first_done.set()
        except BaseException as error:  # reported by the main thread
            self.error = f"{type(error).__name__}: {error}"
            self.first_done.set()


def serve_requests(
    serve: Callable[[Any], Any], request: Any, seconds: float, gc_every: int
) -> list[int]:
    """Latencies (ns) of back-to-back requests for ``seconds``.

    With ``gc_every``, ``gc.collect()`` runs before every ``gc_every``-th request,
    inside its measured latency.
    """
    latencies: list[int] = []
    append = latencies.append
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    count = 0
    while True:
        started = clock()
        if started >= deadline:
            return latencies
        count += 1
        if gc_every and count % gc_every == 0:
            gc.collect()
        serve(request)
        append(clock() - started)


def serve_until(serve: Callable[[Any], Any], request: Any, churn: Churn, models: int) -> int:
    """Serve back to back until the churn thread has finished ``models`` models.

    Returns:
        The number of requests served.

    Raises:
        RuntimeError: The churn thread failed, or took longer than CHURN_WAIT_SECONDS.
    """
    deadline = time.perf_counter() + CHURN_WAIT_SECONDS
    count = 0
    while churn.models < models:
        if churn.error or time.perf_counter() > deadline:
            raise RuntimeError(f"churn thread stalled during calibration: {churn.error}")
        serve(request)
        count += 1
    return count


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # Imported here so the parent never loads TensorFlow.
    import numpy as np
    import psutil

    import lifecycle as lc

    process = psutil.Process()
    rng = np.random.default_rng(0)
    samples = CHURN_BATCH * CHURN_STEPS
    x = rng.standard_normal((samples, INPUT_DIM), dtype=np.float32)
    y = rng.integers(0, OUTPUTS, size=samples)

    # Warm-up outside any session: the first model built and fitted pays for
    # imports and one-time tracing. Dropped plainly; it leaks the same in every variant.
    warm = build_churn_model(args.churn_units, None)
    warm.fit(x, y, batch_size=CHURN_BATCH, epochs=1, verbose=0)
    del warm

    session: lc.LifecycleSession | None = None
    if variant in STRATEGIES:
        session = lc.LifecycleSession(
            cleanup=lc.CleanupStrategy[STRATEGIES[variant]],
            name=SESSION_NAME,
            pressure_threshold=pressure_threshold(args.churn_units),
            freeze_heap=variant == "bg-frozen",
        )
    with session if session is not None else contextlib.nullcontext():
        result = measure(variant, session, args.seconds, args.churn_units, x, y, process)
        closing = time.perf_counter()
    if session is not None:
        result["close_ms"] = 1000 * (time.perf_counter() - closing)
        result["rss_after_close_mib"] = process.memory_info().rss / MIB
        final = session.statistics()
        result["models_disposed"] = final.models_disposed
        result["models_cleaned"] = final.models_cleaned
        result["cleaner_collections_total"] = final.cleaner.collections
    return result


def measure(
    variant: str,
    session: lc.LifecycleSession | None,
    seconds: float,
    churn_units: int,
    x: np.ndarray,
    y: np.ndarray,
    process: Any,
) -> dict[str, Any]:
    import numpy as np
    import tensorflow as tf

    import lifecycle as lc

    # The served model belongs to the session (or, for the naive variants, to
    # the default session, where nothing else lives): same request path everywhere.
    model = lc.ManagedModel(*mlp(SERVED_UNITS, hidden=1))
    serve = lc.serving_function(model, tf.TensorSpec([None, INPUT_DIM], tf.float32))
    request = tf.constant(x[:1])
    for _ in range(WARMUP_REQUESTS):
        serve(request)

    churn = Churn(churn_units, session, x, y)
    churn.start()
    if not churn.first_done.wait(CHURN_WAIT_SECONDS) or churn.error:
        raise RuntimeError(f"churn thread failed to build its first model: {churn.error}")

    # Calibration (not measured): serve until the churn thread finishes its
    # current model, then count the requests served while it churns
    # CALIBRATION_MODELS more: both rates under contention.
    models_before = churn.models
    serve_until(serve, request, churn, models_before + 1)
    started = time.perf_counter()
    calibration_requests = serve_until(
        serve, request, churn, models_before + 1 + CALIBRATION_MODELS
    )
    elapsed = time.perf_counter() - started
    requests_per_model = calibration_requests / CALIBRATION_MODELS
    gc_every = 0
    if variant == "naive":
        gc_every = max(1, round(requests_per_model * MODELS_PER_COLLECTION))

    watch = GcWatch()
    gc.callbacks.append(watch)
    cleaner_before = session.statistics().cleaner if session is not None else None
    models_at_start = churn.models
    rss_start = process.memory_info().rss / MIB
    watch.active = True
    try:
        latencies = serve_requests(serve, request, seconds, gc_every)
    finally:
        watch.active = False
        gc.callbacks.remove(watch)
    rss_end = process.memory_info().rss / MIB
    models_during = churn.models - models_at_start
    cleaner_after = session.statistics().cleaner if session is not None else None

    stopped = churn.stop(CHURN_WAIT_SECONDS)
    if churn.error:
        raise RuntimeError(f"churn thread failed: {churn.error}")
    if not stopped:
        raise RuntimeError(f"churn thread did not stop within {CHURN_WAIT_SECONDS:g} s")

    values = np.asarray(latencies, dtype=np.float64) / 1000.0  # µs
    p50, p99, p999 = np.percentile(values, [50, 99, 99.9])
    result: dict[str, Any] = {
        "variant": variant,
        "requests": len(latencies),
        "p50_us": float(p50),
        "p99_us": float(p99),
        "p999_us": float(p999),
        "max_ms": float(values.max()) / 1000.0,
        "mean_us": float(values.mean()),
        "gc_every": gc_every,
        "calibration_requests_per_second": calibration_requests / elapsed,
        "calibration_requests_per_model": requests_per_model,
        "calibration_seconds_per_model": elapsed / CALIBRATION_MODELS,
        "churn_models": models_during,
        "churn_models_total": churn.models,
        "churn_disposed_total": churn.disposed,
        "gc_collections": watch.collections,
        "gc_full_collections": watch.full_collections,
        "gc_ms": 1000 * watch.seconds,
        "gc_max_ms": 1000 * watch.max_seconds,
        "gc_full_by_thread": {
            name: {"collections": int(n), "ms": 1000 * s}
            for name, (n, s) in watch.full_by_thread.items()
        },
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_end,
    }
    if cleaner_before is not None and cleaner_after is not None:
        result["cleaner_collections"] = cleaner_after.collections - cleaner_before.collections
        result["cleaner_ms"] = 1000 * (
            cleaner_after.collection_seconds - cleaner_before.collection_seconds
        )
        result["cleaner_tasks_run"] = cleaner_after.tasks_run - cleaner_before.tasks_run
        result["cleaner_queued_at_end"] = cleaner_after.queued
        result["pressure_bytes"] = cleaner_after.bytes_allocated + cleaner_after.bytes_released
    return result


# -------------------------------------------------------------------------- parent


def child_options(args: argparse.Namespace) -> list[str]:
    return ["--seconds", str(args.seconds), "--churn-units", str(args.churn_units)]


def describe_run(args: argparse.Namespace) -> list[str]:
    params = churn_params(args.churn_units)
    units = args.churn_units
    return [
        *_harness.machine_lines(),
        f"served:   MLP {INPUT_DIM}-{SERVED_UNITS}-{OUTPUTS} ({served_params():,} params) "
        f"through lc.serving_function, batch 1, back to back for {args.seconds:g} s",
        f"churn:    MLP {INPUT_DIM}-{units}-{units}-{OUTPUTS} + Adam, {params:,} params "
        f"({params * BYTES_PER_PARAM / MIB:.1f} MiB weights + slots), {CHURN_STEPS} fit steps "
        f"of batch {CHURN_BATCH}, then dropped; lifecycle variants dispose() every other one",
        f"cleaner:  pressure_threshold {pressure_threshold(units) / MIB:.1f} MiB "
        f"(about one collection per {MODELS_PER_COLLECTION} churned models)",
        _harness.rounds_line(args.rounds),
    ]


def table_rows(rounds: _harness.Rounds) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        if not rounds.succeeded(variant):
            rows.append([LABELS[variant], "FAILED", *["-"] * (len(HEADER) - 2)])
            continue
        rows.append(
            [
                LABELS[variant],
                rounds.cell(variant, "requests", ",.0f"),
                rounds.cell(variant, "p50_us", ".0f"),
                rounds.cell(variant, "p99_us", ".0f"),
                rounds.cell(variant, "p999_us", ".0f"),
                rounds.cell(variant, "max_ms", ".1f"),
                rounds.ratio_cell("p99_us", variant, "naive"),
            ]
        )
    return rows


def gc_rows(rounds: _harness.Rounds) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        if not rounds.succeeded(variant):
            continue
        rows.append(
            [
                LABELS[variant],
                rounds.cell(variant, "gc_full_collections", ".0f"),
                rounds.cell(variant, "cleaner_collections", ".0f"),
                rounds.cell(variant, "gc_ms", ".0f"),
                rounds.cell(variant, "gc_max_ms", ".0f"),
                rounds.cell(variant, "rss_end_mib", ".0f"),
                rounds.cell(variant, lambda r: r["rss_end_mib"] - r["rss_start_mib"], "+.0f"),
            ]
        )
    return rows


def thread_role(name: str) -> str:
    if name == "MainThread":
        return "request"
    if name == CLEANER_THREAD:
        return "cleaner"
    return name


def variant_notes(rounds: _harness.Rounds) -> list[str]:
    notes = []
    for variant in rounds.variants:
        result = rounds.last_result(variant)
        if result is None:
            continue
        where = ", ".join(
            f"{entry['collections']} on {thread_role(name)} ({entry['ms']:.0f} ms)"
            for name, entry in sorted(result["gc_full_by_thread"].items())
        )
        parts = [
            f"{result['churn_models']} models churned",
            f"full gcs: {where or 'none'}",
        ]
        if result["gc_every"]:
            parts.append(f"gc.collect() every {result['gc_every']} requests")
        if "cleaner_collections" in result:
            parts.append(
                f"cleaner: collections {result['cleaner_collections']} "
                f"({result['cleaner_ms']:.0f} ms), tasks run {result['cleaner_tasks_run']}, "
                f"tasks queued at the end {result['cleaner_queued_at_end']}"
            )
            parts.append(
                f"close() {result['close_ms']:.0f} ms, "
                f"then RSS {result['rss_after_close_mib']:.0f} MiB"
            )
        notes.append(f"  {variant}, last round: " + "; ".join(parts))
    return notes


def run_parent(args: argparse.Namespace) -> int:
    rounds = _harness.run_rounds(
        __file__, args.variants, args.rounds, child_options(args), args.timeout
    )

    legend = [
        "each cell: median over the rounds (min-max); p99 vs naive: p99 over naive's p99",
        "             in the same round, median of the per-round ratios (min-max)",
    ]
    _harness.print_report(describe_run(args), HEADER, table_rows(rounds), legend)
    legend = [
        "full gcs:    generation-2 collections during the measurement, on any thread",
        "cleaner gcs: of those, run by the session's cleaner (session.statistics().cleaner)",
        "gc ms:       time in all collections (every generation, any thread); max gc ms:",
        "             the longest one. RSS growth: from the start to the end of measurement",
        "per variant:",
        *variant_notes(rounds),
    ]
    _harness.print_table(GC_HEADER, gc_rows(rounds), legend)
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="measured seconds of requests per variant"
    )
    _harness.add_variants_argument(parser, VARIANTS)
    parser.add_argument(
        "--churn-units",
        type=int,
        default=512,
        help="hidden width of the churned MLPs (512: 3.4 MiB of weights + Adam slots)",
    )
    _harness.add_child_arguments(parser, VARIANTS, timeout=600.0, rounds=3)
    args = parser.parse_args(argv)

    if args.seconds <= 0 or args.churn_units < 1 or args.timeout <= 0:
        parser.error("--seconds, --churn-units and --timeout must be positive")
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
