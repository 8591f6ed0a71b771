"""Serving-call benchmark: what one call costs through each serving path.

A served MLP (Input(256) -> Dense(units, relu) -> Dense(units, relu) -> Dense(16);
``--units``, by default 64 and 2048, the 4.76M-parameter model of the hot-swap and
server benchmarks) answers one NumPy batch of ``--batch`` rows (1 by default, as a
server's requests), called back to back from one thread, each way:

    eager model(x)          ``model(x, training=False)``: no tracing at all
    tf.function             ``tf.function(lambda x: model(x, training=False),
                            input_signature=[spec])``: the usual hand-made path
    concrete function       that function's ``get_concrete_function()``, called
                            with the array: how serving functions called the
                            model before their fast path
    lc.serving_function     ``lc.serving_function(model, spec)``: guarded by the
                            model's lifecycle; arrays that fit the signature go
                            to the traced graph without TensorFlow's argument
                            binding
    registry.predict        ``registry.predict(name, x)``: a lease, the version's
                            serving function, the lease returned
    registry.predict, batched
                            the same to a version loaded with request batching
                            (``max_batch_size`` 32, allowed sizes 1 to 32): what
                            batching costs a lone caller, which leads its own
                            batch of one

Rounds: all in one process, every way ``--calls`` calls per round after a warm-up
round, the order rotating between rounds. Each way's time per call is compared
with ``tf.function``'s in the same round, where the machine's drift cancels, and
with the concrete function's (the path serving functions took before); the
table gives the medians of those per-round ratios (min-max) and the median time
per call over the rounds (min-max). What is measured is the Python and dispatch
cost around the graph, so the ratios depend on the model: the smaller the model,
the larger the share of the call that is not the model.

Run (from the repository root, with the package installed)::

    python benchmarks/serving_call.py                                   # about 2 min
    python benchmarks/serving_call.py --units 64 --rounds 2 --calls 100 # quick check
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable

import _harness

HEADER = ["model", "way", "µs per call", "vs tf.function", "vs concrete function"]
WAYS = (
    "eager model(x)",
    "tf.function",
    "concrete function",
    "lc.serving_function",
    "registry.predict",
    "registry.predict, batched",
)
REFERENCE = "tf.function"
# The path serving functions took before their fast path.
CONCRETE = "concrete function"


def build(units: int):
    import keras

    inputs = keras.Input((256,))
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    hidden = keras.layers.Dense(units, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(16)(hidden))


def inference(model):
    """``model(x, training=False)`` as a function of ``x`` alone, to trace."""

    def call(x):
        return model(x, training=False)

    return call


def measure(args: argparse.Namespace) -> dict[int, dict[str, list[float]]]:
    """Seconds per call, one per measured round, by model width and way."""
    import numpy as np
    import tensorflow as tf

    import lifecycle as lc

    x = np.random.default_rng(0).standard_normal((args.batch, 256)).astype("float32")
    spec = tf.TensorSpec([None, 256], tf.float32)
    policy = lc.BatchingPolicy(max_batch_size=32, allowed_batch_sizes=(1, 2, 4, 8, 16, 32))
    times: dict[int, dict[str, list[float]]] = {}
    with lc.ModelRegistry(name="bench") as registry:
        for units in args.units:
            model = lc.manage(build(units))
            function = tf.function(inference(model), input_signature=[spec])
            concrete = function.get_concrete_function()
            served = lc.serving_function(model, spec)
            registry.load("mlp", units, lambda u=units: build(u), warmup=x)
            registry.load("batched", units, lambda u=units: build(u), warmup=x, batching=policy)
            ways: dict[str, Callable[[], object]] = {
                "eager model(x)": lambda m=model: m(x, training=False),
                "tf.function": lambda f=function: f(x),
                "concrete function": lambda c=concrete: c(x),
                "lc.serving_function": lambda s=served: s(x),
                "registry.predict": lambda u=units: registry.predict("mlp", x, version=u),
                "registry.predict, batched": lambda u=units: registry.predict(
                    "batched", x, version=u
                ),
            }
            times[units] = {way: [] for way in WAYS}
            for round_ in range(args.rounds + 1):  # round 0 warms up
                for way in _harness.rotation(list(WAYS), round_):
                    call = ways[way]
                    started = time.perf_counter()
                    for _ in range(args.calls):
                        call()
                    if round_:
                        times[units][way].append((time.perf_counter() - started) / args.calls)
            registry.unload("mlp", units, wait=True)
            registry.unload("batched", units, wait=True)
            del served, concrete, function
            model.dispose()
    return times


def rows(times: dict[int, dict[str, list[float]]]) -> list[list[str]]:
    table = []
    for units, ways in times.items():
        for way in WAYS:
            table.append(
                [
                    f"MLP 256-{units}-{units}-16",
                    way,
                    _harness.fmt_spread([1e6 * t for t in ways[way]], ".0f"),
                    *(
                        _harness.fmt_spread(
                            _harness.per_round_ratios(ways[way], ways[other]), ".2f", "x"
                        )
                        for other in (REFERENCE, CONCRETE)
                    ),
                ]
            )
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--units",
        type=_harness.positive_ints,
        default=[64, 2048],
        help="comma-separated hidden widths, one model each",
    )
    parser.add_argument("--batch", type=_harness.positive_int, default=1, help="rows per call")
    parser.add_argument(
        "--calls", type=_harness.positive_int, default=1000, help="calls per way per round"
    )
    parser.add_argument(
        "--rounds", type=_harness.positive_int, default=7, help="measured rounds, after a warm-up"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.alarm(max(1, int(args.timeout)))  # SIGALRM ends a run that hangs
    times = measure(args)
    signal.alarm(0)
    description = [
        *_harness.machine_lines(),
        f"calls:    one thread, a NumPy float32 batch of {args.batch} row(s) per call, "
        f"{args.calls} calls per way per round",
        f"rounds:   {args.rounds} after a warm-up round, in one process, the order of the ways "
        "rotating between rounds",
    ]
    legend = [
        "µs per call:    median over the rounds (min-max)",
        "vs tf.function: time per call over tf.function's in the same round; median of the",
        "                per-round ratios (min-max); vs concrete function: the same against",
        "                the concrete function's",
    ]
    _harness.print_report(description, HEADER, rows(times), legend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
