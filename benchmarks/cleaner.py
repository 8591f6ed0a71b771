"""Cleaner latency: what collecting dropped models costs a served model.

A small served model (``lc.ManagedModel`` MLP 64-256-8 through
``lc.serving_function``) answers batch-1 requests back to back on the main
thread for ``--seconds``, each request's latency measured; meanwhile a "churn"
thread builds, fits (2 steps of batch 32, Adam) and drops MLPs
(64-``--churn-units`` x 2-8) in a loop. The variants differ in who collects:

    naive       plain models, ``del model``; the request thread runs
                ``gc.collect()`` every N requests, N calibrated so that it collects
                as often as the cleaner does (every 2 churned models)
    naive-auto  plain models, ``del model``; only Python's automatic collector
    bg          ``LifecycleSession(cleanup=IN_BACKGROUND)``
    sp          ``ON_SAFE_POINTS`` (the churn thread reaches the safe points)
    close       ``ON_SESSION_CLOSE``: the cleaner runs nothing before close
    bg-frozen   ``IN_BACKGROUND`` with ``freeze_heap=True``

In the lifecycle variants every other churned model is ``dispose()``d, the
others dropped for the finalizer path, and ``pressure_threshold`` is 2 churned
models' worth. Protocol per child: warm up, start the churn, calibrate (requests
per churned model), then measure: request latency percentiles, collections
(``gc.callbacks``: full ones, time, longest, by thread), the cleaner's counters,
RSS, and for a session the time ``close()`` takes and the RSS after it. The load
is closed-loop, so the percentiles understate what an open-loop server would see.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/cleaner.py          # 3 rounds x 6 x 15 s, ~8 min
    python benchmarks/cleaner.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import _harness
from _harness import MIB, Metric, Option

# The lifecycle variants' CleanupStrategy members, by name (the parent imports no TensorFlow).
STRATEGIES = {
    "bg": "IN_BACKGROUND",
    "sp": "ON_SAFE_POINTS",
    "close": "ON_SESSION_CLOSE",
    "bg-frozen": "IN_BACKGROUND",
}
INPUT_DIM = 64
OUTPUTS = 8
CHURN_BATCH = 32
CHURN_STEPS = 2
BYTES_PER_PARAM = 4 * 3  # weights + the two Adam slots, float32
MODELS_PER_COLLECTION = 2  # the cleaner's pressure threshold, and naive's N, in models
WARMUP_REQUESTS = 200
CALIBRATION_MODELS = 2
CHURN_WAIT_SECONDS = 120.0
CLEANER_THREAD = "lifecycle-cleaner-bench"


def mlp(units: int, hidden: int, session: Any = None, compiled: bool = False) -> Any:
    """An MLP 64 -> ``hidden`` x Dense(units) -> 8, managed under ``session`` if given."""
    import keras

    import lifecycle as lc

    inputs = x = keras.Input((INPUT_DIM,))
    for _ in range(hidden):
        x = keras.layers.Dense(units, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(OUTPUTS)(x))
    model = lc.manage(model, session=session) if session is not None else model
    if compiled:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    return model


class Churn(threading.Thread):
    """Builds, fits and drops models until stopped; disposes every other one in a session."""

    def __init__(self, units: int, session: Any, x: Any, y: Any) -> None:
        super().__init__(name="churn", daemon=True)
        self.units, self.session, self.x, self.y = units, session, x, y
        self.models = 0
        self.error: str | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                model = mlp(self.units, 2, self.session, compiled=True)
                model.fit(self.x, self.y, batch_size=CHURN_BATCH, epochs=1, verbose=0)
                if self.session is not None and self.models % 2 == 0:
                    model.dispose()
                del model
                self.models += 1
        except BaseException as error:  # reported by the main thread
            self.error = f"{type(error).__name__}: {error}"

    def serve_until(self, serve: Callable[[], Any], models: int) -> int:
        """Serve back to back until ``models`` models are done; the requests served."""
        deadline, count = time.perf_counter() + CHURN_WAIT_SECONDS, 0
        while self.models < models:
            if self.error or time.perf_counter() > deadline:
                raise RuntimeError(f"churn thread stalled: {self.error}")
            serve()
            count += 1
        return count


def serve_requests(serve: Callable[[], Any], seconds: float, gc_every: int) -> list[float]:
    """Latencies (µs) of back-to-back requests; ``gc.collect()`` inside every ``gc_every``-th."""
    latencies: list[float] = []
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    while (started := clock()) < deadline:
        if gc_every and len(latencies) % gc_every == gc_every - 1:
            gc.collect()
        serve()
        latencies.append((clock() - started) / 1000)
    return latencies


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import psutil
    import tensorflow as tf

    import lifecycle as lc

    process = psutil.Process()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((CHURN_BATCH * CHURN_STEPS, INPUT_DIM), dtype=np.float32)
    y = rng.integers(0, OUTPUTS, size=len(x))
    # Warm-up outside any session: the first model pays for imports and tracing.
    mlp(args.churn_units, 2, compiled=True).fit(x, y, batch_size=CHURN_BATCH, verbose=0)

    session, result = None, {}
    if variant in STRATEGIES:
        units = args.churn_units
        params = (INPUT_DIM + 1) * units + (units + 1) * units + (units + 1) * OUTPUTS
        session = lc.LifecycleSession(
            cleanup=lc.CleanupStrategy[STRATEGIES[variant]],
            name="bench",
            # Each managed model reports its bytes once allocated and once released.
            pressure_threshold=MODELS_PER_COLLECTION * 2 * params * BYTES_PER_PARAM,
            freeze_heap=variant == "bg-frozen",
        )
        result["pressure_threshold_mib"] = session.pressure_threshold / MIB
    with session if session is not None else contextlib.nullcontext():
        # The served model belongs to the session (or alone in the default one).
        plain = mlp(256, 1)
        model = lc.ManagedModel(plain.inputs, plain.outputs)
        function = lc.serving_function(model, tf.TensorSpec([None, INPUT_DIM], tf.float32))
        request = tf.constant(x[:1])

        def serve() -> Any:
            return function(request)

        for _ in range(WARMUP_REQUESTS):
            serve()
        churn = Churn(args.churn_units, session, x, y)
        churn.start()
        churn.serve_until(serve, 1)
        # Calibration: requests served per churned model, under contention.
        churn.serve_until(serve, churn.models + 1)
        per_model = churn.serve_until(serve, churn.models + CALIBRATION_MODELS) / 2
        gc_every = max(1, round(per_model * MODELS_PER_COLLECTION)) if variant == "naive" else 0

        watch = _harness.Collections(active=False)
        before = session.statistics().cleaner if session is not None else None
        models, rss_start = churn.models, process.memory_info().rss / MIB
        watch.active = True
        latencies = serve_requests(serve, args.seconds, gc_every)
        watch.active = False
        watch.close()
        churn.stopping.set()
        churn.join(CHURN_WAIT_SECONDS)
        if churn.error or churn.is_alive():
            raise RuntimeError(f"churn thread failed or did not stop: {churn.error}")
        p50, p99, p999 = _harness.percentiles(latencies, 50, 99, 99.9)
        result |= {"requests": len(latencies), "p50_us": p50, "p99_us": p99, "p999_us": p999}
        result |= {"max_ms": max(latencies) / 1000, "gc_every": gc_every}
        result |= {"churn_models": churn.models - models, "churn_models_total": churn.models}
        result |= {"mean_us": sum(latencies) / len(latencies), "requests_per_model": per_model}
        result |= watch.summary("gc", lambda generation, thread: True)
        full = [thread for *_, generation, thread in watch.events if generation == 2]
        result |= {"full_gcs": len(full), "full_gcs_request": full.count("MainThread")}
        result |= {
            "full_gcs_cleaner": full.count(CLEANER_THREAD),
            "full_gcs_churn": full.count("churn"),
        }
        result |= {"rss_mib": process.memory_info().rss / MIB}
        result["rss_growth_mib"] = result["rss_mib"] - rss_start
        if session is not None and before is not None:
            after = session.statistics().cleaner
            result["cleaner_gcs"] = after.collections - before.collections
            result["cleaner_ms"] = 1000 * (after.collection_seconds - before.collection_seconds)
            result["cleaner_tasks"] = after.tasks_run - before.tasks_run
            result["cleaner_queued"] = after.queued
        closing = time.perf_counter()
    if session is not None:
        result["close_ms"] = 1000 * (time.perf_counter() - closing)
        result["rss_after_close_mib"] = process.memory_info().rss / MIB
    return result


BENCHMARK = _harness.Benchmark(
    name="cleaner",
    doc=__doc__,
    variants={
        "naive": "gc.collect() on the request thread",
        "naive-auto": "automatic gc only",
        "bg": "IN_BACKGROUND",
        "sp": "ON_SAFE_POINTS",
        "close": "ON_SESSION_CLOSE",
        "bg-frozen": "IN_BACKGROUND + freeze_heap",
    },
    metrics=[
        Metric("requests", "", ",.0f", "requests", ratio=False),
        Metric("mean_us", "µs", ".0f", "mean µs", ratio=False),
        Metric("p50_us", "µs", ".0f", "p50 µs", ratio=False),
        Metric("p99_us", "µs", ".0f", "p99 µs"),
        Metric("p999_us", "µs", ".0f", "p99.9 µs", ratio=False),
        Metric("max_ms", "ms", ".1f", "max ms", ratio=False),
        Metric("full_gcs", "", ".0f", "full gcs", ratio=False),
        Metric("full_gcs_request", "", ".0f", "on request thread", ratio=False),
        Metric("full_gcs_cleaner", "", ".0f", "on cleaner", ratio=False),
        Metric("full_gcs_churn", "", ".0f", "on churn", ratio=False),
        Metric("gc_collections", "", ".0f", "gcs", ratio=False),
        Metric("gc_total_ms", "ms", ".0f", "gc ms", ratio=False),
        Metric("gc_max_ms", "ms", ".0f", "max gc ms", ratio=False),
        Metric("cleaner_gcs", "", ".0f", "cleaner gcs", ratio=False),
        Metric("cleaner_ms", "ms", ".0f", "cleaner gc ms", ratio=False),
        Metric("cleaner_tasks", "", ".0f", "cleaner tasks", ratio=False),
        Metric("cleaner_queued", "", ".0f", "queued at end", ratio=False),
        Metric("churn_models", "", ".0f", "models churned", ratio=False),
        Metric("churn_models_total", "", ".0f", "churned in all", ratio=False),
        Metric("requests_per_model", "", ",.0f", "requests/churned model", ratio=False),
        Metric("pressure_threshold_mib", "MiB", ".1f", "pressure threshold MiB", ratio=False),
        Metric("gc_every", "requests", ".0f", "gc.collect() every", ratio=False),
        Metric("rss_mib", "MiB", ".0f", "final RSS MiB", ratio=False),
        Metric("rss_growth_mib", "MiB", "+.0f", "RSS growth MiB", ratio=False),
        Metric("close_ms", "ms", ".0f", "close() ms", ratio=False),
        Metric("rss_after_close_mib", "MiB", ".0f", "RSS after close", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--seconds", 15.0, "measured seconds of requests", _harness.positive_float),
        Option(
            "--churn-units", 512, "width of the churned MLPs (512: 3.4 MiB)", _harness.positive_int
        ),
    ],
    quick={"seconds": 2.0, "churn_units": 64, "variants": "naive,bg"},
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
