"""A model fine-tuned once a day for weeks: yesterday's generation goes, memory stays flat.

The situation of a recommender retrained every night in a long-lived process:
each "day" a fresh model is built, restored from yesterday's checkpoint (weights,
Adam slots and step counter), fine-tuned on the day's data, checkpointed, and
the old generation disposed. Without disposal, every generation stays resident
and the process runs out of memory after a few weeks; with it, memory is flat.

It prints the process's RSS per day and the growth per generation (the
least-squares slope over the days after the first few, which warm up
TensorFlow's caches). Run::

    python examples/daily_incremental_training.py --days 20
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

MiB = 2**20
WARMUP_DAYS = 3


def rss_mib() -> float:
    """Resident set size of this process, in MiB (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def build(features: int, units: int):
    """A fresh, untrained model: the same architecture every day."""
    import keras

    import lifecycle as lc

    inputs = keras.Input((features,))
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    hidden = keras.layers.Dense(units, activation="relu")(hidden)
    model = lc.ManagedModel(inputs, keras.layers.Dense(1)(hidden))
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


def day_of_data(day: int, features: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The day's interactions: generated, with a slowly drifting target."""
    rng = np.random.default_rng(day)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    weights = np.linspace(-1.0, 1.0, features, dtype=np.float32) * (1 + 0.02 * day)
    return x, (x @ weights)[:, None].astype(np.float32)


def slope(values: list[float]) -> float:
    """Least-squares growth per step."""
    steps = np.arange(len(values), dtype=float)
    return float(np.polyfit(steps, np.asarray(values), 1)[0]) if len(values) > 1 else 0.0


def main(argv: list[str] | None = None) -> float:
    """Run the days; returns the RSS growth per generation in MiB."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--units", type=int, default=512, help="hidden width (model size)")
    parser.add_argument("--rows", type=int, default=2048, help="training rows per day")
    args = parser.parse_args(argv)
    features = 64

    import lifecycle as lc

    lc.tuning.tune_allocator()  # let released buffers go back to the system
    with tempfile.TemporaryDirectory() as base:
        directory = os.path.join(base, "recommender")
        rss: list[float] = []
        for day in range(1, args.days + 1):
            model = build(features, args.units)
            keeper = model.checkpoints(directory, max_to_keep=3)
            if keeper.latest is not None:
                keeper.restore()  # yesterday's weights, slots and step counter
            x, y = day_of_data(day, features, args.rows)
            history = model.fit(x, y, batch_size=128, epochs=1, verbose=0)
            keeper.save(step=day)
            # Flushes the keeper, releases weights and slots, and collects the
            # generation's Python side (traced graphs) now rather than later.
            model.dispose(collect=True)
            del model, keeper
            rss.append(rss_mib())
            print(
                f"day {day:2d}: loss {history.history['loss'][-1]:8.4f}  RSS {rss[-1]:7.1f} MiB",
                flush=True,
            )
    model_mib = (features * args.units + args.units**2 + args.units * 3 + 1) * 4 * 3 / MiB
    growth = slope(rss[WARMUP_DAYS:])
    print(
        f"RSS growth per generation after day {WARMUP_DAYS}: {growth:+.2f} MiB "
        f"(one generation is {model_mib:.1f} MiB of weights and Adam slots)"
    )
    return growth


if __name__ == "__main__":
    main()
