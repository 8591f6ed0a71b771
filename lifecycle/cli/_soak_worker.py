"""The loop-training soak: one variant per child process, RSS reported per cycle.

Each cycle builds an MLP (Input(784) → Dense(units, relu) → Dense(units, relu) →
Dense(10)) with Adam, fits it for 2 steps of batch 64 on generated data, and
drops it the variant's way:

    a   ``del model``
    b   ``del model; keras.backend.clear_session(); gc.collect()``
    c   an ``lc.ManagedModel``: ``model.dispose(collect=True)``, then ``del model``

Run as ``python -m lifecycle.cli._soak_worker --variant c --cycles 12 --units 512``: prints
one JSON line per cycle (``{"cycle": 3, "rss_mib": 612.4, "seconds": 0.41}``).
``lifecycle soak`` runs the variants side by side and compares them.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

VARIANTS = {
    "a": "(a) del model",
    "b": "(b) del + clear_session() + gc",
    "c": "(c) ManagedModel.dispose()",
}
INPUT_DIM = 784
CLASSES = 10
BATCH_SIZE = 64
MiB = 2**20


def weights_mib(units: int) -> float:
    """MiB of weights and Adam slots of the soak's MLP."""
    params = INPUT_DIM * units + units + units * units + units + units * CLASSES + CLASSES
    return params * 4 * 3 / MiB


def build_mlp(units: int, *, managed: bool) -> Any:
    """The soak's MLP with Adam, compiled: an ``lc.ManagedModel`` or a plain ``keras.Model``."""
    import keras

    import lifecycle as lc

    inputs = keras.Input((INPUT_DIM,))
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    hidden = keras.layers.Dense(units, activation="relu")(hidden)
    outputs = keras.layers.Dense(CLASSES)(hidden)
    model = (lc.ManagedModel if managed else keras.Model)(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def run(variant: str, cycles: int, units: int) -> None:
    """Run the cycles, printing one JSON line each."""
    import keras
    import numpy as np

    import lifecycle as lc

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2 * BATCH_SIZE, INPUT_DIM), dtype=np.float32)
    y = rng.integers(0, CLASSES, 2 * BATCH_SIZE)
    for cycle in range(1, cycles + 1):
        started = time.perf_counter()
        model = build_mlp(units, managed=variant == "c")
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
        if variant == "c":
            model.dispose(collect=True)
        del model
        if variant == "b":
            keras.backend.clear_session()
            gc.collect()
        rss = lc.statistics(count_graphs=False).rss_bytes or 0
        line = {"cycle": cycle, "rss_mib": rss / MiB, "seconds": time.perf_counter() - started}
        print(json.dumps(line), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of a soak child."""
    parser = argparse.ArgumentParser(description="One variant of the lifecycle soak.")
    parser.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--units", type=int, default=512)
    args = parser.parse_args(argv)
    run(args.variant, args.cycles, args.units)
    return 0


if __name__ == "__main__":
    sys.exit(main())
