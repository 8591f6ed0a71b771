"""Ray Serve multiplexing: a replica's memory over 50 evictions, Ray's decorator and ours.

One Ray Serve deployment (one replica, ``max_num_models_per_replica=2``) on a
local Ray started by the child (``ray.init(num_cpus=2)``, Serve without its
HTTP proxy) serves one model per model id: an MLP 256 -> ``--units`` x 2 -> 16
(2400 units: 6.42M params, 24.5 MiB of float32 weights) whose first output is
its own id, built by the deployment's ``async`` loader on the replica. Each
request is one row, through a ``DeploymentHandle`` with
``multiplexed_model_id``; the replica answers ``model(x)``. Two variants, the
same loader, models and requests:

    plain    ``ray.serve.multiplexed``, the user's code as written: no lifecycle
             anywhere in the replica (the replica reports ``sys.modules``)
    managed  ``lifecycle.integrations.ray.multiplexed``: evicted models are
             disposed once the requests holding them end

``--callers`` threads send requests back to back to the ids the replica keeps.
Each new id is one load and one eviction: the callers are narrowed to the newer
kept id, the older one's requests end, the driver touches the newer one and
then asks for the new id (so the least recently used model, the one evicted,
is the older one, and no id is loaded twice); then the callers ask both kept
ids for ``--dwell`` s. ``--warmup-ids`` ids go through the same steps
unmeasured. The replica's RSS (psutil, read in the replica) is taken after the
warm-up and right after the last of ``--evictions`` further ids, as a user
reads it: no settling, no collection. A settled figure follows, labelled: once
the managed replica reports every evicted model disposed, and ``--settle`` s
on. Reported: the RSS growth over the evictions (and the RSS after each new
id, as the ``series``), the callers' latencies over the eviction phase (p50,
p99, max) and those of the requests that started while a load was in flight,
failed requests (an exception or an answer from another model's id), the
loads, the median time of a new id's request (its eviction and load), and
for ``managed`` the models evicted and disposed.

Targets (issue #32): managed's growth <= 10 % of plain's (within each round)
and <= one model's bytes; the p99 during evictions is reported with its ratio
to plain's; no request fails.

Run (from the repository root, with the package, Ray Serve and psutil installed)::

    python benchmarks/ray_serve.py            # 3 rounds x 2 x 50 evictions, ~6.5 min
    python benchmarks/ray_serve.py --quick
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from typing import Any

import _harness
from _harness import MIB, Metric, Option, load

INPUT_DIM = 256
OUTPUTS = 16
KEPT = 2  # max_num_models_per_replica
GROWTH_TARGET = 0.10  # managed's growth over plain's, within a round
REQUEST_TIMEOUT = 120.0  # seconds one request may take
DRAIN_TIMEOUT = 60.0  # seconds the older id's requests, or the disposals, may take
LOADING = 1  # the callers' phase while a new id's request (eviction + load) is in flight


def model_params(units: int) -> int:
    return (INPUT_DIM + 1) * units + (units + 1) * units + (units + 1) * OUTPUTS


def build_model(model_id: str, units: int) -> Any:
    """The loader's model: every row's first output is ``float(model_id)``."""
    import keras

    inputs = keras.Input((INPUT_DIM,))
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    hidden = keras.layers.Dense(units, activation="relu")(hidden)
    answer = keras.layers.Dense(
        OUTPUTS,
        kernel_initializer="zeros",
        bias_initializer=keras.initializers.Constant(float(model_id)),
    )
    return keras.Model(inputs, answer(hidden))


def deployment(variant: str, units: int) -> Any:
    """The variant's deployment class; the plain one refers to nothing of lifecycle."""
    from ray import serve

    class Plain:
        def __init__(self) -> None:
            self.loads = 0

        @serve.multiplexed(max_num_models_per_replica=KEPT)
        async def get_model(self, model_id: str) -> Any:
            self.loads += 1
            return build_model(model_id, units)

        async def __call__(self, x: Any) -> float:
            import numpy as np

            model = await self.get_model(serve.get_multiplexed_model_id())
            return float(np.asarray(model(x))[0, 0])

        def probe(self) -> dict[str, Any]:
            import psutil

            return {
                "rss": psutil.Process().memory_info().rss,
                "loads": self.loads,
                "lifecycle_imported": "lifecycle" in sys.modules,
            }

    if variant == "plain":
        chosen: type = Plain
    else:
        from lifecycle.integrations.ray import multiplexed, multiplexed_statistics

        class Managed(Plain):
            @multiplexed(max_num_models_per_replica=KEPT)
            async def get_model(self, model_id: str) -> Any:
                self.loads += 1
                return build_model(model_id, units)

            def probe(self) -> dict[str, Any]:
                found = multiplexed_statistics(self)
                return {
                    **super().probe(),
                    "evicted": found.models_evicted,
                    "disposed": found.models_disposed,
                    "draining": found.models_draining,
                    "bytes_held": found.bytes_held,
                }

        chosen = Managed
    options = {"ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": 32}
    return serve.deployment(**options)(chosen)


class Callers:
    """The request threads' targets: the kept ids, round robin, and requests in flight."""

    def __init__(self, ask: Any, count: int) -> None:
        self.ask = ask
        self.ids: list[str] = []
        self.in_flight: dict[str, int] = {}
        self.changed = threading.Condition()
        self.open = threading.Event()
        self.open.set()
        self._turn = itertools.count()
        self.threads = load.RequestThreads(self.call, count)

    def call(self, phase: int) -> None:
        self.open.wait()
        with self.changed:
            if not self.ids:
                self.changed.wait(0.01)
                return
            model_id = self.ids[next(self._turn) % len(self.ids)]
            self.in_flight[model_id] = self.in_flight.get(model_id, 0) + 1
        try:
            answer = self.ask(model_id)
        finally:
            with self.changed:
                self.in_flight[model_id] -= 1
                self.changed.notify_all()
        if answer != float(model_id):
            raise AssertionError(f"model id {model_id!r} answered {answer!r}")

    def target(self, ids: list[str]) -> None:
        with self.changed:
            self.ids = list(ids)

    def drained(self, model_id: str) -> None:
        """Wait until no request for ``model_id`` is in flight."""
        with self.changed:
            if not self.changed.wait_for(
                lambda: self.in_flight.get(model_id, 0) == 0, DRAIN_TIMEOUT
            ):
                raise RuntimeError(f"requests for model id {model_id!r} still in flight")

    def pause(self) -> None:
        """Callers start no request; returns once none is in flight."""
        self.open.clear()
        with self.changed:
            if not self.changed.wait_for(lambda: not any(self.in_flight.values()), DRAIN_TIMEOUT):
                raise RuntimeError(f"requests still in flight: {self.in_flight}")


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import ray
    from ray import serve

    child_started = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=100 * MIB,
        configure_logging=False,
    )
    try:
        serve.start(proxy_location="Disabled")
        app = deployment(variant, args.units).bind()
        handle = serve.run(app, name="multiplexing", route_prefix=None)
        return drive(handle, variant, args, np, child_started)
    finally:
        serve.shutdown()
        ray.shutdown()


def drive(
    handle: Any, variant: str, args: argparse.Namespace, np: Any, child_started: float
) -> dict[str, Any]:
    """The workload on a running deployment: warm-up, the evictions, the reads."""
    x = np.random.default_rng(0).standard_normal((1, INPUT_DIM), dtype=np.float32)

    def ask(model_id: str) -> float:
        response = handle.options(multiplexed_model_id=model_id).remote(x)
        return response.result(timeout_s=REQUEST_TIMEOUT)

    def probe() -> dict[str, Any]:
        return handle.probe.remote().result(timeout_s=REQUEST_TIMEOUT)

    first = ask("0")
    if first != 0.0:
        raise AssertionError(f"model id '0' answered {first!r}")
    callers = Callers(ask, args.callers)
    callers.target(["0"])
    load_ms: list[float] = []
    rss_mib: list[float] = []

    def new_id(number: int) -> None:
        older, newer, new = str(number - 2), str(number - 1), str(number)
        # The callers leave the older id; the driver's touch makes it the least recently used.
        callers.target([newer])
        callers.drained(older)
        if ask(newer) != float(newer):
            raise AssertionError(f"model id {newer!r} answered another model's id")
        callers.threads.phase = LOADING
        started = time.perf_counter()
        answer = ask(new)
        load_ms.append(1000 * (time.perf_counter() - started))
        callers.threads.phase = 0
        if answer != float(new):
            raise AssertionError(f"model id {new!r} answered {answer!r}")
        callers.target([newer, new])

    try:
        for number in range(1, args.warmup_ids):
            new_id(number)
            time.sleep(args.dwell)
        callers.pause()
        warm = probe()
        callers.open.set()
        load_ms.clear()
        callers.threads.recording = True
        started = time.perf_counter()
        for number in range(args.warmup_ids, args.warmup_ids + args.evictions):
            new_id(number)
            rss_mib.append(probe()["rss"] / MIB)
            time.sleep(args.dwell)
        ended = time.perf_counter()
        callers.threads.recording = False
    finally:
        callers.threads.stop()
    after = probe()  # right after the last request, as a user reads it
    settle_started = time.perf_counter()
    if variant != "plain":
        while (found := probe())["disposed"] < found["evicted"]:
            if time.perf_counter() - settle_started > DRAIN_TIMEOUT:
                break
            time.sleep(0.1)
    time.sleep(args.settle)
    settled = probe()

    records = callers.threads.recorded()
    latencies = [latency / 1e6 for _, latency, _ in records]
    loading = [latency / 1e6 for _, latency, phase in records if phase == LOADING]
    p50, p99 = _harness.percentiles(latencies, 50, 99)
    (p99_loading,) = _harness.percentiles(loading, 99)
    result: dict[str, Any] = {
        "growth_mib": (after["rss"] - warm["rss"]) / MIB,
        "growth_settled_mib": (settled["rss"] - warm["rss"]) / MIB,
        "rss_warm_mib": warm["rss"] / MIB,
        "model_mib": 4 * model_params(args.units) / MIB,
        "rss_mib": rss_mib,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": max(latencies, default=None),
        "p99_loading_ms": p99_loading,
        "requests": len(latencies),
        "requests_loading": len(loading),
        "failed_requests": sum(map(len, callers.threads.failed)),
        "errors": callers.threads.errors,
        "loads": after["loads"],
        "expected_loads": args.warmup_ids + args.evictions,
        "load_ms": statistics.median(load_ms),
        "eviction_phase_s": ended - started,
        "child_s": time.perf_counter() - child_started,
        "lifecycle_imported": after["lifecycle_imported"],
    }
    if variant != "plain":
        result |= {
            "models_evicted": after["evicted"],
            "models_disposed": after["disposed"],
            "models_disposed_settled": settled["disposed"],
            "models_draining": after["draining"],
            "held_mib": after["bytes_held"] / MIB,
        }
    return result


def targets(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """The issue's targets, judged within each round, and the p99 ratio."""
    growth = _harness.ratio_over_rounds(runs, "growth_mib", "managed", "plain")
    lines = [_harness.judge(f"managed growth <= {GROWTH_TARGET:.0%} of plain's", growth, 0.10)]
    over_model = [
        r["growth_mib"] / r["model_mib"] for run in runs if (r := run.get("managed")) is not None
    ]
    lines.append(
        _harness.judge(
            "managed growth <= one model's bytes (growth / model)",
            _harness.spread_of(over_model),
            1.0,
        )
    )
    p99 = _harness.ratio_over_rounds(runs, "p99_ms", "managed", "plain")
    lines.append(f"p99 during evictions, managed / plain: {_harness.spread_text(p99)}")
    loading = _harness.ratio_over_rounds(runs, "p99_loading_ms", "managed", "plain")
    lines.append(f"p99 of requests during a load, managed / plain: {_harness.spread_text(loading)}")
    child = [r["child_s"] for run in runs for r in run.values() if r]
    if child:
        seconds = f"{min(child):.0f}-{max(child):.0f}"
        lines.append(f"  seconds per child (Ray's start included): {seconds}")
    return lines


def problems(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """Failed requests, extra loads, or lifecycle in the plain replica."""
    found = []
    for number, run in enumerate(runs, 1):
        for variant, result in run.items():
            if result is None:
                continue
            where = f"round {number}, {variant}"
            if result["failed_requests"]:
                found.append(f"{where}: {result['failed_requests']} failed: {result['errors']}")
            if result["loads"] != result["expected_loads"]:
                found.append(f"{where}: {result['loads']} loads, {result['expected_loads']} ids")
            if variant == "plain" and result["lifecycle_imported"]:
                found.append(f"{where}: the plain replica imported lifecycle")
    return found


BENCHMARK = _harness.Benchmark(
    name="ray_serve",
    doc=__doc__,
    variants={
        "plain": "ray.serve.multiplexed",
        "managed": "lifecycle.integrations.ray.multiplexed",
    },
    metrics=[
        Metric("growth_mib", "MiB", "+.1f", "RSS growth MiB", series="rss_mib"),
        Metric("growth_settled_mib", "MiB", "+.1f", "settled growth MiB", ratio=False),
        Metric("p50_ms", "ms", ".1f", "p50 ms", ratio=False),
        Metric("p99_ms", "ms", ".1f", "p99 ms"),
        Metric("max_ms", "ms", ".0f", "max ms", ratio=False),
        Metric("p99_loading_ms", "ms", ".1f", "p99 during a load ms"),
        Metric("failed_requests", "", ".0f", "failed", ratio=False),
        Metric("models_disposed", "", ".0f", "disposed", ratio=False),
        Metric("models_disposed_settled", "", ".0f", "disposed, settled", ratio=False),
        Metric("models_evicted", "", ".0f", "evicted", ratio=False),
        Metric("loads", "", ".0f", "loads", ratio=False),
        Metric("load_ms", "ms", ".0f", "new id ms"),
        Metric("requests", "", ",.0f", "requests", ratio=False),
        Metric("rss_warm_mib", "MiB", ".0f", "RSS after warm-up MiB", ratio=False),
        Metric("model_mib", "MiB", ".1f", "model MiB", ratio=False),
        Metric("eviction_phase_s", "s", ".0f", "eviction phase s", ratio=False),
    ],
    measure=measure,
    options=[
        Option(
            "--evictions",
            50,
            "new ids after the warm-up (a load + an eviction each)",
            _harness.positive_int,
        ),
        Option(
            "--warmup-ids",
            4,
            "ids through the same steps before the first RSS read",
            _harness.checked(int, lambda value: value >= KEPT + 1, f"at least {KEPT + 1}"),
        ),
        Option("--callers", 4, "request threads", _harness.positive_int),
        Option(
            "--units", 2400, "hidden width (2400: 6.42M params, 24.5 MiB)", _harness.positive_int
        ),
        Option(
            "--dwell",
            0.5,
            "seconds the callers ask both kept ids between new ids",
            _harness.positive_float,
        ),
        Option("--settle", 2.0, "seconds before the settled RSS read", _harness.positive_float),
    ],
    quick={"evictions": 3, "warmup_ids": 3, "callers": 2, "units": 32, "dwell": 0.1, "settle": 0.2},
    rounds=3,
    timeout=900.0,
    notes=targets,
    check=problems,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
