"""Hot-swap benchmark: serving through a ModelRegistry while versions are swapped.

A served MLP (Input(256) -> Dense(units, relu) -> Dense(units, relu) -> Dense(16),
no optimizer; ``--units 2048`` gives 4.76M params, 18.1 MiB of weights) answers
requests of batch 1 from ``--threads`` request threads (4 by default), back to
back, for ``--seconds`` seconds per variant. Each request is timed with
``time.perf_counter_ns``, and every exception a request raises is counted as a
failed request. The variants:

    direct          a plain ``keras.Model`` called through one
                    ``tf.function(input_signature=[TensorSpec([None, 256])])``,
                    called directly by every thread: the baseline.
    registry        the same model loaded into an ``lc.ModelRegistry`` (warmed up
                    with the request itself, so its serving function has the same
                    signature) and called through ``registry.predict(name, x)``.
    swaps           as ``registry``, while the main thread swaps versions
                    continuously (``AVAILABILITY_PRESERVING``, the default policy):
                    ``load(v + 1)`` -> ``promote(v + 1)`` -> ``unload(v)`` (without
                    ``wait``: the old version is disposed when its last lease
                    returns), for ``--seconds`` and at least ``--min-swaps`` times.
    tuned           as ``swaps``, in a process that called ``lc.tune_allocator()``
                    first (a fixed glibc mmap threshold, ``malloc_trim`` after the
                    cleaners' collections).
    frozen          as ``tuned``, with ``ModelRegistry(freeze_heap=True)``: the
                    objects alive before the first load are frozen, so the
                    collection after each swap scans only the newer ones.
    background      as ``frozen``, with ``ModelRegistry(loader_nice=19,
                    loader_gil_share=0.5)``: loads run on the registry's loader
                    thread at the lowest priority and pause after each 0.5 ms of
                    Python work while requests are in flight.

Every child samples its RSS (psutil) on a background thread every 2 ms. Its
baseline is the mean RSS over the last 0.5 s of a 1 s warm-up in which the
request threads already serve one loaded model; only the requests that start
after the warm-up are measured. In the swaps child:

* peak RSS / (old+new): the highest sample during the swaps divided by the
  baseline plus one model's bytes (``VersionStatus.bytes``), i.e. what the
  process holds with the old and the new version resident together;
* RSS after drain / one model: once the swaps stop (the request threads keep
  serving), the child waits until ``registry.status(name)`` lists a single
  version (every retired version disposed), then divides the mean RSS over the
  next 0.5 s by the baseline.

The notes under the tables give, per variant and for its last round, the full (generation 2) garbage
collections during the measurement (``gc.callbacks``: on which thread, how long)
and the p99 of the requests that overlapped none of them; for the swaps, the time
of each phase (load, promote, unload), how often a load started while the
previously retired version was still listed, the latency of requests by the
phase the main thread was in when they started, and RSS against the swap count.

Rounds: the run is ``--rounds`` rounds (3 by default); each round runs every
variant in a fresh child process (this script re-invoked with ``--variant``),
the order rotating between rounds (direct registry swaps ..., then registry
swaps ... direct, ...). The first table gives each measurement as the median
over the rounds (min-max); the second gives the ratios (vs direct, p99 vs
registry) taken within each round, so that the machine's drift between rounds
cancels, as the median of the per-round ratios (min-max). The parent exits
non-zero if a child fails or times out, and names the failed children under
the tables.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/hot_swap.py            # 3 rounds x 6 x 40 s (and 100 swaps), ~18 min
    python benchmarks/hot_swap.py --rounds 1 --seconds 3 --units 256 --min-swaps 3  # ~45 s
    python benchmarks/hot_swap.py --variants registry,swaps --threads 8
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import _harness
from _harness import MIB, fmt

if TYPE_CHECKING:
    import keras
    import numpy as np

    import lifecycle as lc

VARIANTS = ("direct", "registry", "swaps", "tuned", "frozen", "background")
# Variants that swap versions under traffic.
SWAPPING = ("swaps", "tuned", "frozen", "background")
# Variants in a process that called lc.tune_allocator().
TUNED = ("tuned", "frozen", "background")
# ModelRegistry options per variant.
REGISTRY_OPTIONS: dict[str, dict[str, Any]] = {
    "frozen": {"freeze_heap": True},
    "background": {"freeze_heap": True, "loader_nice": 19, "loader_gil_share": 0.5},
}
LABELS = {
    "direct": "direct: tf.function",
    "registry": "registry: predict()",
    "swaps": "registry-swaps: predict() + swaps",
    "tuned": "swaps + lc.tune_allocator()",
    "frozen": "swaps + tuned + freeze_heap=True",
    "background": "swaps + tuned + frozen + background loads",
}
HEADER = ["variant", "requests/s", "p50 µs", "p99 µs", "swaps", "failed requests"]
RATIO_HEADER = [
    "variant",
    "vs direct",
    "p99 vs registry",
    "peak RSS / (old+new)",
    "RSS after drain / one model",
]

INPUT_DIM = 256
OUTPUTS = 16
MODEL_NAME = "mlp"
# Seconds of unmeasured serving before the measurement; the RSS baseline is the
# mean over its last BASELINE_SECONDS.
WARMUP_SECONDS = 1.0
BASELINE_SECONDS = 0.5
# Seconds over which the RSS after the drain is averaged.
SETTLE_SECONDS = 0.5
SAMPLE_INTERVAL = 0.002
# Seconds to wait for the retired versions to be disposed after the swaps.
DRAIN_TIMEOUT = 120.0
# Seconds to wait for a request thread to finish its request and stop.
JOIN_TIMEOUT = 60.0
# Requests slower than this many ms are checked against full collections.
SLOW_MS = 20
# Error messages kept per child (every failure is counted).
ERRORS_KEPT = 5

# What the main thread is doing when a request starts (the swaps variant).
IDLE, LOAD, PROMOTE, UNLOAD = 0, 1, 2, 3
PHASES = {IDLE: "between swaps", LOAD: "load", PROMOTE: "promote", UNLOAD: "unload"}


def mlp_params(units: int) -> int:
    return (INPUT_DIM + 1) * units + (units + 1) * units + (units + 1) * OUTPUTS


# --------------------------------------------------------------------------- child


def build_mlp(units: int) -> keras.Model:
    import keras

    inputs = keras.Input((INPUT_DIM,))
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    hidden = keras.layers.Dense(units, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(OUTPUTS)(hidden))


class RssSampler:
    """Samples the process's RSS every ``interval`` seconds on a daemon thread."""

    def __init__(self, interval: float) -> None:
        import psutil

        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        # Parallel arrays: sample time (perf_counter seconds) and RSS (bytes).
        self.times = array("d")
        self.rss = array("q")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        memory_info, clock = self._process.memory_info, time.perf_counter
        while not self._stop.wait(self._interval):
            rss = memory_info().rss
            self.times.append(clock())
            self.rss.append(rss)

    def window(self, start: float, end: float) -> list[int]:
        """The samples taken between ``start`` and ``end`` (perf_counter seconds)."""
        # Read the length first: the sampler appends the time before the RSS.
        count = len(self.rss)
        return [self.rss[i] for i in range(count) if start <= self.times[i] < end]

    def now(self) -> int:
        return self._process.memory_info().rss


@dataclass
class Worker:
    """One request thread's measurements."""

    # Start (perf_counter_ns), latency (ns) and swap phase of each measured request.
    starts: array[int] = field(default_factory=lambda: array("q"))
    latencies: array[int] = field(default_factory=lambda: array("q"))
    phases: array[int] = field(default_factory=lambda: array("b"))
    # The phase each failed request started in, measured or not.
    failed_phases: array[int] = field(default_factory=lambda: array("b"))
    requests: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)


class RequestThreads:
    """``count`` threads calling ``serve()`` back to back until stopped.

    Every call is counted; it is measured (latency and the value of ``phase``
    when it started) only while ``recording`` is set when it starts. Every
    exception a call raises counts as a failed request, and the thread goes on.
    With ``by_phase``, ``serve`` is called with that value of ``phase``, so a
    call is made and measured under the same phase.
    """

    def __init__(self, serve: Callable[..., object], count: int, *, by_phase: bool = False) -> None:
        self.serve = serve
        self.by_phase = by_phase
        self.recording = False
        self.phase = IDLE
        self.workers = [Worker() for _ in range(count)]
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(w,), name=f"request-{i}", daemon=True)
            for i, w in enumerate(self.workers)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            raise RuntimeError(
                f"request threads still in a request after {JOIN_TIMEOUT:g} s: {stuck}"
            )

    def _run(self, worker: Worker) -> None:
        serve, clock, stopped = self.serve, time.perf_counter_ns, self._stop.is_set
        if not self.by_phase:
            serve = lambda _phase, unphased=serve: unphased()  # noqa: E731
        starts, latencies, phases = worker.starts, worker.latencies, worker.phases
        while not stopped():
            recording, phase = self.recording, self.phase
            started = clock()
            try:
                serve(phase)
            except Exception as error:
                worker.failures += 1
                worker.failed_phases.append(phase)
                if len(worker.errors) < ERRORS_KEPT:
                    worker.errors.append(f"{type(error).__name__}: {error}"[:300])
            elapsed = clock() - started
            worker.requests += 1
            if recording:
                starts.append(started)
                latencies.append(elapsed)
                phases.append(phase)


class FullGcWatch:
    """Records each full (generation 2) collection: start, end (ns) and thread.

    Installed in ``gc.callbacks``; collections do not nest, so one start time
    suffices. Only collections that end while ``active`` are kept.
    """

    def __init__(self) -> None:
        self.active = False
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.threads: list[str] = []
        self._started = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter_ns()
        elif self.active:
            self.starts.append(self._started)
            self.ends.append(time.perf_counter_ns())
            self.threads.append(threading.current_thread().name)

    def overlapping(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Which of the intervals [starts, ends) overlap a recorded collection."""
        import numpy as np

        if not self.starts:
            return np.zeros(starts.shape, dtype=bool)
        gc_starts = np.asarray(self.starts, dtype=np.int64)
        gc_ends = np.asarray(self.ends, dtype=np.int64)
        # Collections run one at a time, so both arrays are sorted: the last
        # collection starting before a request ends overlaps it iff it ends after
        # the request starts.
        last = np.searchsorted(gc_starts, ends, side="left") - 1
        found = last >= 0
        overlap = np.zeros(starts.shape, dtype=bool)
        overlap[found] = gc_ends[last[found]] > starts[found]
        return overlap

    def summary(self) -> dict[str, Any]:
        durations = [(e - s) / 1e6 for s, e in zip(self.starts, self.ends, strict=True)]
        by_thread: dict[str, int] = {}
        for name in self.threads:
            by_thread[name] = by_thread.get(name, 0) + 1
        return {
            "full_gcs": len(durations),
            "full_gc_ms": sum(durations),
            "full_gc_max_ms": max(durations, default=0.0),
            "full_gcs_by_thread": by_thread,
        }


@dataclass
class Swaps:
    """The main thread's swap loop and what it recorded."""

    load_seconds: list[float] = field(default_factory=list)
    promote_seconds: list[float] = field(default_factory=list)
    unload_seconds: list[float] = field(default_factory=list)
    # Versions listed by status() when each load started.
    resident: list[int] = field(default_factory=list)
    # RSS (bytes) when each load started.
    rss_at_start: list[int] = field(default_factory=list)
    version: int = 1

    def run(
        self,
        registry: lc.ModelRegistry,
        factory: Callable[[], keras.Model],
        warmup: Any,
        requests: RequestThreads,
        sampler: RssSampler,
        deadline: float,
        min_swaps: int,
    ) -> None:
        clock = time.perf_counter
        while clock() < deadline or len(self.load_seconds) < min_swaps:
            new = self.version + 1
            self.resident.append(len(registry.status(MODEL_NAME)))
            self.rss_at_start.append(sampler.now())
            requests.phase = LOAD
            started = clock()
            registry.load(MODEL_NAME, new, factory, warmup=warmup)
            requests.phase = PROMOTE
            loaded = clock()
            registry.promote(MODEL_NAME, new)
            requests.phase = UNLOAD
            promoted = clock()
            registry.unload(MODEL_NAME, self.version)
            requests.phase = IDLE
            unloaded = clock()
            self.load_seconds.append(loaded - started)
            self.promote_seconds.append(promoted - loaded)
            self.unload_seconds.append(unloaded - promoted)
            self.version = new


def wait_for_one_version(registry: lc.ModelRegistry) -> float:
    """Wait until ``registry.status(MODEL_NAME)`` lists one version; the seconds it took."""
    started = time.perf_counter()
    deadline = started + DRAIN_TIMEOUT
    while True:
        versions = registry.status(MODEL_NAME)
        if len(versions) == 1:
            return time.perf_counter() - started
        if time.perf_counter() > deadline:
            listed = [(s.version, s.state.value, s.leases) for s in versions]
            raise RuntimeError(
                f"retired versions not disposed {DRAIN_TIMEOUT:g} s after the swaps "
                f"(version, state, leases): {listed}"
            )
        time.sleep(0.005)


def percentiles_us(latencies_ns: np.ndarray) -> dict[str, float]:
    import numpy as np

    if latencies_ns.size == 0:
        return {"count": 0}
    p50, p99, p999 = np.percentile(latencies_ns / 1000.0, [50, 99, 99.9])
    return {
        "count": int(latencies_ns.size),
        "p50_us": float(p50),
        "p99_us": float(p99),
        "p999_us": float(p999),
        "max_ms": float(latencies_ns.max()) / 1e6,
    }


def make_server(
    variant: str, units: int, request: Any
) -> tuple[Callable[[], object], lc.ModelRegistry | None, Callable[[], keras.Model], int]:
    """The request call of a variant, its registry (or None), the factory, the model's bytes."""
    import tensorflow as tf

    import lifecycle as lc

    def factory() -> keras.Model:
        return build_mlp(units)

    if variant == "direct":
        model = factory()
        function = tf.function(
            lambda x: model(x, training=False),
            input_signature=[tf.TensorSpec([None, INPUT_DIM], tf.float32)],
        )
        function(request)

        def serve_direct() -> object:
            return function(request)

        return serve_direct, None, factory, sum(v.numpy().nbytes for v in model.weights)

    registry = lc.ModelRegistry(name="bench", **REGISTRY_OPTIONS.get(variant, {}))
    model_bytes = registry.load(MODEL_NAME, 1, factory, warmup=request).bytes
    predict = registry.predict

    def serve_registry() -> object:
        return predict(MODEL_NAME, request)

    return serve_registry, registry, factory, model_bytes


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    # Imported here so the parent never loads TensorFlow.
    import gc
    import os

    if args.no_onednn:
        # Read by TensorFlow at import: its plain CPU allocator instead of oneDNN's.
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

    import numpy as np
    import tensorflow as tf

    import lifecycle as lc

    if variant in TUNED:
        lc.tune_allocator()
    rng = np.random.default_rng(0)
    request = tf.constant(rng.standard_normal((1, INPUT_DIM), dtype=np.float32))
    sampler = RssSampler(SAMPLE_INTERVAL)
    sampler.start()
    serve, registry, factory, model_bytes = make_server(variant, args.units, request)

    requests = RequestThreads(serve, args.threads)
    requests.start()
    time.sleep(WARMUP_SECONDS)
    now = time.perf_counter()
    baseline = sampler.window(now - BASELINE_SECONDS, now)

    watch = FullGcWatch()
    gc.callbacks.append(watch)
    watch.active = requests.recording = True
    started = time.perf_counter()
    swaps = Swaps()
    if registry is not None and variant in SWAPPING:
        swaps.run(
            registry, factory, request, requests, sampler, started + args.seconds, args.min_swaps
        )
    else:
        time.sleep(args.seconds)
    ended = time.perf_counter()
    watch.active = requests.recording = False
    gc.callbacks.remove(watch)
    during = sampler.window(started, ended)

    result: dict[str, Any] = {"variant": variant}
    if registry is not None and variant in SWAPPING:
        # The request threads keep serving through the drain and the settle.
        result["drain_seconds"] = wait_for_one_version(registry)
        settled = time.perf_counter()
        time.sleep(SETTLE_SECONDS)
        after = sampler.window(settled, time.perf_counter())
        result["rss_after_drain_mib"] = float(np.mean(after)) / MIB
    requests.stop()
    sampler.stop()
    if registry is not None:
        registry.close()

    workers = requests.workers
    starts = np.concatenate([np.frombuffer(w.starts, dtype=np.int64) for w in workers])
    latencies = np.concatenate([np.frombuffer(w.latencies, dtype=np.int64) for w in workers])
    phases = np.concatenate([np.frombuffer(w.phases, dtype=np.int8) for w in workers])
    in_gc = watch.overlapping(starts, starts + latencies)
    slow = latencies > SLOW_MS * 1_000_000
    result.update(
        {
            "seconds": ended - started,
            "requests_per_second": latencies.size / (ended - started),
            **percentiles_us(latencies),
            "p99_outside_gc_us": percentiles_us(latencies[~in_gc]).get("p99_us"),
            "requests_in_gc": int(in_gc.sum()),
            "slow_requests": int(slow.sum()),
            "slow_requests_in_gc": int((slow & in_gc).sum()),
            **watch.summary(),
            "failed_requests": sum(w.failures for w in workers),
            "requests_total": sum(w.requests for w in workers),
            "errors": [e for w in workers for e in w.errors][:ERRORS_KEPT],
            "model_bytes": model_bytes,
            "rss_baseline_mib": float(np.mean(baseline)) / MIB,
            "rss_peak_mib": max(during) / MIB,
        }
    )
    if variant in SWAPPING:
        result.update(
            {
                "swaps": len(swaps.load_seconds),
                "load_ms": [1000 * s for s in swaps.load_seconds],
                "promote_ms": [1000 * s for s in swaps.promote_seconds],
                "unload_ms": [1000 * s for s in swaps.unload_seconds],
                "resident_at_load": swaps.resident,
                "rss_at_load_mib": [r / MIB for r in swaps.rss_at_start],
                "by_phase": {
                    PHASES[code]: percentiles_us(latencies[phases == code]) for code in PHASES
                },
            }
        )
    return result


# -------------------------------------------------------------------------- parent


def child_options(args: argparse.Namespace) -> list[str]:
    return [
        "--seconds",
        str(args.seconds),
        "--threads",
        str(args.threads),
        "--units",
        str(args.units),
        "--min-swaps",
        str(args.min_swaps),
        *(["--no-onednn"] if args.no_onednn else []),
    ]


def describe_run(args: argparse.Namespace) -> list[str]:
    params = mlp_params(args.units)
    return [
        *_harness.machine_lines(),
        f"served:   MLP {INPUT_DIM}-{args.units}-{args.units}-{OUTPUTS}, {params:,} params "
        f"({params * 4 / MIB:.1f} MiB weights), batch 1, {args.threads} request threads back "
        f"to back for {args.seconds:g} s per variant (after {WARMUP_SECONDS:g} s of warm-up; "
        f"the swapping variants also until {args.min_swaps} swaps)",
        "swaps:    load(v+1) -> promote(v+1) -> unload(v) in a loop on the main thread, "
        "AVAILABILITY_PRESERVING; RSS sampled every "
        f"{SAMPLE_INTERVAL * 1000:g} ms in every child",
        "oneDNN:   "
        + ("off (TF_ENABLE_ONEDNN_OPTS=0) in every child" if args.no_onednn else "on (default)"),
        _harness.rounds_line(args.rounds),
    ]


def peak_ratio(result: Mapping[str, Any]) -> float | None:
    """Peak RSS during the swaps over (RSS with one model + one model's bytes)."""
    if "rss_after_drain_mib" not in result:
        return None
    return result["rss_peak_mib"] / (result["rss_baseline_mib"] + result["model_bytes"] / MIB)


def drain_ratio(result: Mapping[str, Any]) -> float | None:
    """RSS once one version is left over RSS with one model."""
    if "rss_after_drain_mib" not in result:
        return None
    return result["rss_after_drain_mib"] / result["rss_baseline_mib"]


def table_rows(rounds: _harness.Rounds) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        results = [r for r in rounds.results(variant) if r is not None]
        if not results:
            rows.append([LABELS[variant], "FAILED", *["-"] * (len(HEADER) - 2)])
            continue
        rows.append(
            [
                LABELS[variant],
                rounds.cell(variant, "requests_per_second", ",.0f"),
                rounds.cell(variant, "p50_us", ".0f"),
                rounds.cell(variant, "p99_us", ".0f"),
                rounds.cell(variant, "swaps", ".0f"),
                str(sum(r["failed_requests"] for r in results)),
            ]
        )
    return rows


def ratio_rows(rounds: _harness.Rounds) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        if not rounds.succeeded(variant):
            continue
        rows.append(
            [
                LABELS[variant],
                rounds.ratio_cell("requests_per_second", variant, "direct"),
                rounds.ratio_cell("p99_us", variant, "registry"),
                rounds.cell(variant, peak_ratio, ".3f"),
                rounds.cell(variant, drain_ratio, ".3f"),
            ]
        )
    return rows


def slope(values: list[float]) -> float | None:
    import statistics

    if len(values) < 2:
        return None
    return statistics.linear_regression(range(len(values)), values).slope


def gc_note(result: dict[str, Any]) -> str:
    threads = ", ".join(
        f"{count} on {name}" for name, count in sorted(result["full_gcs_by_thread"].items())
    )
    return (
        f"    full gcs: {result['full_gcs']} ({threads or 'none'}), "
        f"{result['full_gc_ms']:.0f} ms in all, longest {result['full_gc_max_ms']:.0f} ms; "
        f"requests overlapping one: {result['requests_in_gc']:,}, p99 of the others "
        f"{fmt(result['p99_outside_gc_us'], '.0f')} µs; requests over {SLOW_MS} ms: "
        f"{result['slow_requests']:,}, {result['slow_requests_in_gc']:,} of them overlapping one"
    )


def spread(values: list[float]) -> str:
    """``median (min-max)`` of a list of milliseconds."""
    return _harness.fmt_spread(values, ".0f")


def swap_notes(result: dict[str, Any]) -> list[str]:
    model_mib = result["model_bytes"] / MIB
    excess = result["rss_peak_mib"] - result["rss_baseline_mib"] - model_mib
    drained = result["rss_after_drain_mib"] - result["rss_baseline_mib"]
    rss_at_load = result["rss_at_load_mib"]
    resident = result["resident_at_load"]
    total = [
        a + b + c
        for a, b, c in zip(
            result["load_ms"], result["promote_ms"], result["unload_ms"], strict=True
        )
    ]
    notes = [
        f"    swap ms, median (min-max): total {spread(total)}, load {spread(result['load_ms'])}, "
        f"promote {spread(result['promote_ms'])}, unload {spread(result['unload_ms'])}",
        f"    loads that started with the retired version still listed: "
        f"{sum(n > 1 for n in resident)} of {len(resident)}; after the last swap, "
        f"{1000 * result['drain_seconds']:.0f} ms until one version was left",
        f"    peak RSS - (old+new) = {excess:+.1f} MiB ({excess / model_mib:+.2f} models of "
        f"{model_mib:.1f} MiB); after drain - one model = {drained:+.1f} MiB "
        f"({drained / model_mib:+.2f} models)",
    ]
    if rss_at_load:
        notes.append(
            f"    RSS when a load started: first {rss_at_load[0]:.0f} MiB, 10th "
            f"{rss_at_load[min(9, len(rss_at_load) - 1)]:.0f} MiB, last {rss_at_load[-1]:.0f} MiB; "
            f"slope after the 10th {fmt(slope(rss_at_load[9:]), '+.2f')} MiB/swap"
        )
    notes.append("    requests by the swap phase they started in: count, p50 / p99 / max")
    for phase, stats in result["by_phase"].items():
        if stats["count"]:
            notes.append(
                f"      {phase:<14} {stats['count']:>7,}  {stats['p50_us']:>6.0f} / "
                f"{stats['p99_us']:>6.0f} µs / {stats['max_ms']:.1f} ms"
            )
    return notes


def variant_notes(rounds: _harness.Rounds) -> list[str]:
    notes = []
    for variant in rounds.variants:
        result = rounds.last_result(variant)
        if result is None:
            continue
        line = (
            f"  {variant}, last round: {result['count']:,} requests measured, p99.9 "
            f"{result['p999_us']:.0f} µs, max {result['max_ms']:.1f} ms; RSS one model "
            f"{result['rss_baseline_mib']:.0f} MiB, peak {result['rss_peak_mib']:.0f} MiB"
        )
        if result["errors"]:
            line += f"; errors: {result['errors']}"
        notes += [line, gc_note(result)]
        if variant in SWAPPING:
            notes += swap_notes(result)
    return notes


def run_parent(args: argparse.Namespace) -> int:
    rounds = _harness.run_rounds(
        __file__, args.variants, args.rounds, child_options(args), args.timeout
    )

    legend = [
        "each cell: median over the rounds (min-max); failed requests: exceptions, any time,",
        "summed over the rounds",
    ]
    _harness.print_report(describe_run(args), HEADER, table_rows(rounds), legend)
    legend = [
        "ratios: taken within each round, then their median (min-max)",
        "vs direct: requests/s over direct's; p99 vs registry: p99 over the steady",
        "           registry variant's",
        "peak RSS / (old+new): highest RSS during the swaps / (RSS with one model + its bytes)",
        "RSS after drain / one model: RSS once one version is left / RSS with one model",
        "per variant:",
        *variant_notes(rounds),
    ]
    _harness.print_table(RATIO_HEADER, ratio_rows(rounds), legend)
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--seconds",
        type=float,
        default=40.0,
        help="measured seconds per variant (the swaps variant swaps for as long)",
    )
    parser.add_argument("--threads", type=int, default=4, help="request threads")
    parser.add_argument(
        "--min-swaps",
        type=int,
        default=100,
        help="the swapping variants go on after --seconds until this many swaps",
    )
    parser.add_argument(
        "--units", type=int, default=2048, help="hidden width (2048 gives 4.76M params)"
    )
    parser.add_argument(
        "--no-onednn",
        action="store_true",
        help="run every child with TF_ENABLE_ONEDNN_OPTS=0 (TensorFlow's plain CPU allocator)",
    )
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=600.0, rounds=3)
    args = parser.parse_args(argv)

    if args.seconds <= 0 or args.threads < 1 or args.units < 1 or args.timeout <= 0:
        parser.error("--seconds, --threads, --units and --timeout must be positive")
    if args.min_swaps < 0:
        parser.error("--min-swaps must be 0 or more")
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
