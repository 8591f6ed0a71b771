"""See lifecycle problems: statistics, a leak trend, a leak report, Prometheus metrics.

A short training loop runs twice: once disposing every model, once "forgetting"
to — keeping each disposed model in a module-level cache, the way a debugging
helper or a cache of "last model" does. It shows:

- the Keras callback putting memory numbers into ``History`` (and running the
  session's safe points);
- the leak trend monitor's verdict over the cycles, with its confidence interval;
- the leak report naming who holds the cached models;
- ``lifecycle.testing.no_leaks()`` passing around the clean loop (in a test suite,
  the ``no_leaks`` pytest fixture or marker does the same);
- the Prometheus exposition of the process's statistics.

Run::

    python examples/monitoring.py --cycles 8
"""

from __future__ import annotations

import argparse
import sys
import types

import numpy as np

MiB = 2**20


def train_cycles(cycles: int, units: int, cache: list | None) -> object:
    """Train and dispose ``cycles`` models; returns the trend of RSS over them."""
    import keras

    import lifecycle as lc
    from lifecycle.monitoring import LeakTrendMonitor, LifecycleCallback

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 64), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    monitor = LeakTrendMonitor(warmup=2, tolerance=0.5 * MiB)
    for cycle in range(cycles):
        inputs = keras.Input((64,))
        hidden = keras.layers.Dense(units, activation="relu")(inputs)
        model = lc.ManagedModel(inputs, keras.layers.Dense(1)(hidden), name=f"model_{cycle}")
        model.compile("adam", "mse")
        history = model.fit(x, y, epochs=1, verbose=0, callbacks=[LifecycleCallback()])
        model.dispose(collect=cache is None)
        if cache is not None:
            cache.append(model)  # the leak: disposed, but kept reachable
        del model
        monitor.sample()
    print(
        f"  last epoch's logs: rss {history.history['lifecycle_rss_mib'][-1]:.0f} MiB, "
        f"live models {history.history['lifecycle_live_models'][-1]:.0f}"
    )
    return monitor.trend()


def main(argv: list[str] | None = None) -> None:
    """Run both loops and print what the monitoring tools see."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--units", type=int, default=256)
    args = parser.parse_args(argv)

    import lifecycle as lc

    print("disposing every model:")
    with lc.testing.no_leaks():  # raises AssertionError with the report on a leak
        print("  trend:", train_cycles(args.cycles, args.units, cache=None))
    print("  leak report:", lc.find_leaks())

    debug = types.ModuleType("app.debug")  # a module-level cache
    debug.LAST_MODELS = []
    sys.modules["app.debug"] = debug
    print("keeping every disposed model in app.debug.LAST_MODELS:")
    train_cycles(args.cycles, args.units, cache=debug.LAST_MODELS)
    report = lc.find_leaks(max_chains=2)
    print("  leak report:", report, sep="\n")

    try:
        from prometheus_client import CollectorRegistry, generate_latest
    except ImportError:
        print('Prometheus: pip install "keras-lifecycle[prometheus]" to see the metrics')
        return
    registry = CollectorRegistry()
    lc.monitoring.register_prometheus(registry)
    exposition = generate_latest(registry).decode()
    print("Prometheus exposition (excerpt):")
    for line in exposition.splitlines():
        if line.startswith(
            (
                "lifecycle_models_disposed_total",
                "lifecycle_released_bytes_total",
                "lifecycle_live_models",
                "lifecycle_process_resident",
            )
        ):
            print("  " + line)


if __name__ == "__main__":
    main()
