"""Hot swap: serving through a ModelRegistry while versions are swapped.

A served MLP (256 -> ``--units`` x 2 -> 16, no optimizer; 2048 units: 4.76M
params, 18.1 MiB) answers batch-1 requests from ``--threads`` threads back to
back for ``--seconds``; every request is timed, every exception counted as a
failed request. Variants:

    direct      a plain ``keras.Model`` through one ``tf.function`` (the baseline)
    registry    the model in an ``lc.ModelRegistry``, ``registry.predict(name, x)``
    swaps       as registry, while the main thread swaps versions continuously:
                ``load(v + 1)``, ``promote(v + 1)``, ``unload(v)`` (no wait), for
                ``--seconds`` and at least ``--min-swaps`` times
    tuned       as swaps, after ``lc.tuning.tune_allocator()``
    frozen      as tuned, ``ModelRegistry(freeze_heap=True)``
    background  as frozen, ``loader_nice=19, loader_gil_share=0.5``

A child samples its RSS every 2 ms; the baseline is the mean over the last
0.5 s of a 1 s warm-up with one model served. Swapping children report the peak
RSS over (baseline + one model), the RSS once one version is left over the
baseline, each phase's median time (load, promote, unload), how often a load
started with the retired version still listed, the RSS growth per swap, and
requests by the phase they started in (cases ``phase: ...``); every swap's phase
times and RSS at its load go into the JSON as ``series``. Every child reports the
full collections (``gc.callbacks``) and the p99 of the requests that overlapped
none, and requests over 20 ms (and those of them inside a collection). The
report also gives the swapping variants' p99 over the steady registry's.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/hot_swap.py            # 3 rounds x 6 x 40 s (100 swaps), ~18 min
    python benchmarks/hot_swap.py --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import _harness
from _harness import MIB, Metric, Option, load

SWAPPING = ("swaps", "tuned", "frozen", "background")
TUNED = ("tuned", "frozen", "background")
REGISTRY_OPTIONS: dict[str, dict[str, Any]] = {
    "frozen": {"freeze_heap": True},
    "background": {"freeze_heap": True, "loader_nice": 19, "loader_gil_share": 0.5},
}
INPUT_DIM = 256
OUTPUTS = 16
MODEL_NAME = "mlp"
WARMUP_SECONDS = 1.0  # unmeasured serving; the RSS baseline is its last BASELINE_SECONDS
BASELINE_SECONDS = 0.5
SETTLE_SECONDS = 0.5  # over which the RSS after the drain is averaged
DRAIN_TIMEOUT = 120.0
SLOW_MS = 20
PHASES = ("between swaps", "load", "promote", "unload")  # what the main thread does


def mlp_params(units: int) -> int:
    return (INPUT_DIM + 1) * units + (units + 1) * units + (units + 1) * OUTPUTS


def build_mlp(units: int) -> Any:
    import keras

    inputs = keras.Input((INPUT_DIM,))
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    hidden = keras.layers.Dense(units, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(OUTPUTS)(hidden))


def latency_us(latencies_ns: Sequence[int]) -> dict[str, float | None]:
    """Count, p50, p99, p99.9 (µs) and max (ms) of request latencies in ns."""
    p50, p99, p999 = _harness.percentiles(latencies_ns, 50, 99, 99.9)
    top = max(latencies_ns, default=None)
    return {
        "count": len(latencies_ns),
        "p50_us": p50 and p50 / 1000,
        "p99_us": p99 and p99 / 1000,
        "p999_us": p999 and p999 / 1000,
        "max_ms": top and top / 1e6,
    }


def swap_loop(
    registry: Any,
    factory: Callable[[], Any],
    request: Any,
    threads: load.RequestThreads,
    args: argparse.Namespace,
    sampler: load.RssSampler,
) -> dict[str, list[float]]:
    """Swap versions until ``--seconds`` passed and ``--min-swaps`` were made."""
    found: dict[str, list[float]] = {"load": [], "promote": [], "unload": [], "resident": []}
    found["rss_mib"] = []
    deadline, version = time.perf_counter() + args.seconds, 1
    while time.perf_counter() < deadline or len(found["load"]) < args.min_swaps:
        found["resident"].append(len(registry.status(MODEL_NAME)))
        found["rss_mib"].append(sampler.memory_info().rss / MIB)
        steps = (
            ("load", lambda v=version: registry.load(MODEL_NAME, v + 1, factory, warmup=request)),
            ("promote", lambda v=version: registry.promote(MODEL_NAME, v + 1)),
            ("unload", lambda v=version: registry.unload(MODEL_NAME, v)),
        )
        for name, step in steps:
            threads.phase = PHASES.index(name)
            started = time.perf_counter()
            step()
            found[name].append(1000 * (time.perf_counter() - started))
        threads.phase, version = 0, version + 1
    return found


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    if args.no_onednn:  # read by TensorFlow at import: its plain CPU allocator
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    import numpy as np
    import tensorflow as tf

    import lifecycle as lc

    if variant in TUNED:
        lc.tuning.tune_allocator()
    request = tf.constant(np.random.default_rng(0).standard_normal((1, INPUT_DIM), "float32"))
    sampler = load.RssSampler()
    registry = None
    factory = lambda: build_mlp(args.units)  # noqa: E731
    if variant == "direct":
        model = build_mlp(args.units)
        spec = tf.TensorSpec([None, INPUT_DIM], tf.float32)
        function = tf.function(lambda x: model(x, training=False), input_signature=[spec])
        function(request)  # traced before the threads start
        model_bytes = sum(v.numpy().nbytes for v in model.weights)
        threads = load.RequestThreads(lambda _: function(request), args.threads)
    else:
        registry = lc.ModelRegistry(name="bench", **REGISTRY_OPTIONS.get(variant, {}))
        model_bytes = registry.load(MODEL_NAME, 1, factory, warmup=request).bytes
        threads = load.RequestThreads(lambda _: registry.predict(MODEL_NAME, request), args.threads)
    time.sleep(WARMUP_SECONDS)
    now = time.perf_counter()
    baseline = statistics.fmean(sampler.window(now - BASELINE_SECONDS, now)) / MIB

    watch = _harness.Collections()
    threads.recording = True
    started = time.perf_counter()
    swaps = None
    if variant in SWAPPING:
        swaps = swap_loop(registry, factory, request, threads, args, sampler)
    else:
        time.sleep(args.seconds)
    ended = time.perf_counter()
    threads.recording = False
    watch.close()
    peak = max(sampler.window(started, ended)) / MIB
    result: dict[str, Any] = {}
    if swaps is not None:
        drained = time.perf_counter()
        while len(registry.status(MODEL_NAME)) > 1:  # request threads keep serving
            if time.perf_counter() - drained > DRAIN_TIMEOUT:
                raise RuntimeError(f"retired versions not disposed in {DRAIN_TIMEOUT:g} s")
            time.sleep(0.005)
        settled = time.perf_counter()
        result["drain_ms"] = 1000 * (settled - drained)
        time.sleep(SETTLE_SECONDS)
        after = statistics.fmean(sampler.window(settled, time.perf_counter())) / MIB
        result["peak_over_old_new"] = peak / (baseline + model_bytes / MIB)
        result["drained_over_one"] = after / baseline
        result["swaps"] = len(swaps["load"])
        for name in ("load", "promote", "unload"):
            result[f"{name}_ms"] = statistics.median(swaps[name])
            result[f"{name}_ms_per_swap"] = swaps[name]
        result["rss_mib_at_load"] = swaps["rss_mib"]
        result["loads_with_retired_listed"] = sum(n > 1 for n in swaps["resident"])
        result["rss_mib_per_swap"] = _harness.slope(swaps["rss_mib"][9:])
    threads.stop()
    sampler.stopping.set()
    if registry is not None:
        registry.close()
    records = threads.recorded()
    latencies = [latency for _, latency, _ in records]
    # Full collections, in ns: the requests that overlapped none of them.
    full = [(1e9 * s, 1e9 * e, name) for s, e, generation, name in watch.events if generation == 2]
    in_gc = [any(s < at + lat and e > at for s, e, _ in full) for at, lat, _ in records]
    clear = [lat for lat, inside in zip(latencies, in_gc, strict=True) if not inside]
    slow_in_gc = sum(g and lat > SLOW_MS * 1e6 for lat, g in zip(latencies, in_gc, strict=True))
    durations = [(e - s) / 1e6 for s, e, _ in full]
    result |= latency_us(latencies)
    result |= {
        "requests_per_second": len(latencies) / (ended - started),
        "failed_requests": sum(map(len, threads.failed)),
        "p99_outside_gc_us": latency_us(clear)["p99_us"],
        "full_gcs": len(durations),
        "full_gc_max_ms": max(durations, default=0.0),
        "full_gcs_off_request_threads": sum(not n.startswith("request") for *_, n in full),
        "requests_in_gc": len(latencies) - len(clear),
        "slow_requests": sum(lat > SLOW_MS * 1e6 for lat in latencies),
        "slow_requests_in_gc": slow_in_gc,
        "rss_baseline_mib": baseline,
        "rss_peak_mib": peak,
        "errors": threads.errors,
    }
    by_phase = {
        f"phase: {name}": latency_us([lat for _, lat, p in records if p == code])
        for code, name in enumerate(PHASES)
        if swaps is not None
    }
    return {"cases": {"serving": result, **by_phase}}


def versus_registry(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """The swapping variants' p99 over the steady registry's, within each round."""
    return [
        f"p99 {variant} vs registry: {_harness.spread_text(found)}"
        for variant in SWAPPING
        if (found := _harness.ratio_over_rounds(runs, "p99_us", variant, "registry", "serving"))
    ]


BENCHMARK = _harness.Benchmark(
    name="hot_swap",
    doc=__doc__,
    variants={
        "direct": "tf.function",
        "registry": "registry.predict()",
        "swaps": "registry.predict() + swaps",
        "tuned": "swaps + lc.tuning.tune_allocator()",
        "frozen": "swaps + tuned + freeze_heap=True",
        "background": "swaps + tuned + frozen + background loads",
    },
    metrics=[
        Metric("requests_per_second", "req/s", ",.0f", "requests/s"),
        Metric("p50_us", "µs", ".0f", "p50 µs", ratio=False),
        Metric("p99_us", "µs", ".0f", "p99 µs"),
        Metric("failed_requests", "", ".0f", "failed", ratio=False),
        Metric("swaps", "", ".0f", "swaps", False, "rss_mib_at_load"),  # RSS at each load
        Metric("peak_over_old_new", "x", ".3f", "peak RSS / (old+new)", ratio=False),
        Metric("drained_over_one", "x", ".3f", "RSS drained / one model", ratio=False),
        Metric("load_ms", "ms", ".0f", "load ms", False, "load_ms_per_swap"),
        Metric("promote_ms", "ms", ".1f", "promote ms", False, "promote_ms_per_swap"),
        Metric("unload_ms", "ms", ".1f", "unload ms", False, "unload_ms_per_swap"),
        Metric("drain_ms", "ms", ".0f", "drain ms", ratio=False),
        Metric("loads_with_retired_listed", "", ".0f", "loads, retired listed", ratio=False),
        Metric("rss_mib_per_swap", "MiB", "+.2f", "RSS MiB/swap", ratio=False),
        Metric("p999_us", "µs", ".0f", "p99.9 µs", ratio=False),
        Metric("max_ms", "ms", ".1f", "max ms", ratio=False),
        Metric("p99_outside_gc_us", "µs", ".0f", "p99 outside gc µs", ratio=False),
        Metric("full_gcs", "", ".0f", "full gcs", ratio=False),
        Metric("full_gcs_off_request_threads", "", ".0f", "off request threads", ratio=False),
        Metric("full_gc_max_ms", "ms", ".0f", "longest gc ms", ratio=False),
        Metric("requests_in_gc", "", ",.0f", "requests in a gc", ratio=False),
        Metric("slow_requests", "", ",.0f", f"over {SLOW_MS} ms", ratio=False),
        Metric("slow_requests_in_gc", "", ",.0f", f"over {SLOW_MS} ms in a gc", ratio=False),
        Metric("rss_baseline_mib", "MiB", ".0f", "RSS one model MiB", ratio=False),
        Metric("rss_peak_mib", "MiB", ".0f", "peak RSS MiB", ratio=False),
        Metric("count", "", ",.0f", "requests", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--seconds", 40.0, "measured seconds per variant", _harness.positive_float),
        Option("--threads", 4, "request threads", _harness.positive_int),
        Option("--min-swaps", 100, "swaps at least, however long they take"),
        Option("--units", 2048, "hidden width (2048: 4.76M params)", _harness.positive_int),
        Option("--no-onednn", False, "TF_ENABLE_ONEDNN_OPTS=0 in every child"),
    ],
    quick={"seconds": 2.0, "units": 32, "min_swaps": 2, "variants": "direct,swaps"},
    baseline="direct",
    timeout=900.0,
    notes=versus_registry,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
