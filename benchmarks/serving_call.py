"""Serving call: what one call costs through each serving path.

A served MLP (256 -> ``--units`` x 2 -> 16; by default 64 and 2048, the
4.76M-parameter model of the hot-swap and server benchmarks) answers one NumPy
batch of ``--batch`` rows, called back to back from one thread, each way:

    eager                ``model(x, training=False)``
    tf.function          ``tf.function(..., input_signature=[spec])``, the usual path
    concrete function    its ``get_concrete_function()`` (the old serving path)
    serving_function     ``lc.serving_function(model, spec)``
    registry.predict     a lease, the version's serving function, the lease returned
    registry.batched     the same to a version loaded with request batching (what
                         batching costs a lone caller)

All in one process: every way ``--calls`` calls per round after a warm-up round,
the order rotating between rounds; each way is compared with ``tf.function``.
What is measured is the Python and dispatch cost around the graph: the smaller
the model, the larger its share.

Run (from the repository root, with the package installed)::

    python benchmarks/serving_call.py          # about 2 min
    python benchmarks/serving_call.py --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import _harness
from _harness import Metric, Option


def build(units: int) -> Any:
    import keras

    inputs = keras.Input((256,))
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    hidden = keras.layers.Dense(units, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(16)(hidden))


def inference(model: Any) -> Callable[[Any], Any]:
    """``model(x, training=False)`` as a function of ``x`` alone, to trace."""
    return lambda x: model(x, training=False)


def per_call(call: Callable[[], object], calls: int) -> Callable[[], dict[str, float]]:
    def measure() -> dict[str, float]:
        started = time.perf_counter()
        for _ in range(calls):
            call()
        return {"us": 1e6 * (time.perf_counter() - started) / calls}

    return measure


def collect(args: argparse.Namespace) -> _harness.Runs:
    import numpy as np
    import tensorflow as tf

    import lifecycle as lc

    x = np.random.default_rng(0).standard_normal((args.batch, 256)).astype("float32")
    spec = tf.TensorSpec([None, 256], tf.float32)
    policy = lc.BatchingPolicy(max_batch_size=32, allowed_batch_sizes=(1, 2, 4, 8, 16, 32))
    runs: _harness.Runs = [{} for _ in range(args.rounds)]
    with lc.ModelRegistry(name="bench") as registry:
        for units in args.units:
            model = lc.manage(build(units))
            function = tf.function(inference(model), input_signature=[spec])
            concrete = function.get_concrete_function()
            served = lc.serving_function(model, spec)
            registry.load("mlp", units, lambda u=units: build(u), warmup=x)
            registry.load("batched", units, lambda u=units: build(u), warmup=x, batching=policy)
            ways = {
                "eager": lambda m=model: m(x, training=False),
                "tf.function": lambda f=function: f(x),
                "concrete function": lambda c=concrete: c(x),
                "serving_function": lambda s=served: s(x),
                "registry.predict": lambda u=units: registry.predict("mlp", x, version=u),
                "registry.batched": lambda u=units: registry.predict("batched", x, version=u),
            }
            chosen = {way: per_call(ways[way], args.calls) for way in args.variants}
            case = f"MLP 256-{units}-{units}-16"
            for run, measured in zip(runs, _harness.interleave(chosen, args.rounds), strict=True):
                for way, result in measured.items():
                    run.setdefault(way, {"cases": {}})["cases"][case] = result
            registry.unload("mlp", units, wait=True)
            registry.unload("batched", units, wait=True)
            del served, concrete, function
            model.dispose()
    return runs


def versus_concrete(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """The serving function's time per call over the concrete function's, per model."""
    lines = []
    for case in dict.fromkeys(c for run in runs for r in run.values() for c in r["cases"]):
        found = _harness.ratio_over_rounds(
            runs, "us", "serving_function", "concrete function", case
        )
        if found is not None:
            lines.append(
                f"{case}: serving_function vs concrete function: {_harness.spread_text(found)}"
            )
    return lines


BENCHMARK = _harness.Benchmark(
    name="serving_call",
    doc=__doc__,
    variants={
        "eager": "model(x, training=False)",
        "tf.function": "tf.function with an input signature",
        "concrete function": "its concrete function",
        "serving_function": "lc.serving_function(model, spec)",
        "registry.predict": "registry.predict(name, x)",
        "registry.batched": "registry.predict to a version with request batching",
    },
    metrics=[Metric("us", "µs", ".0f", "µs per call")],
    collect=collect,
    options=[
        Option("--units", "64,2048", "comma-separated hidden widths", _harness.positive_ints),
        Option("--batch", 1, "rows per call", _harness.positive_int),
        Option("--calls", 1000, "calls per way per round", _harness.positive_int),
    ],
    quick={"units": "8", "calls": 20, "rounds": 2},
    baseline="tf.function",
    rounds=7,
    timeout=900.0,
    notes=versus_concrete,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
