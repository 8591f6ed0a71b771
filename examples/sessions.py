"""A hyper-parameter sweep where each trial runs in its own short session.

Each trial's session owns the models built in it. Trial models are disposed
explicitly, except one that is "forgotten" on purpose: the session's cleaner
cleans up after it and a ResourceWarning names it. That session's close
collects to find it, then trims: the C heap's free memory goes back to the
system. The other sessions hand the bytes their models released to the default
session's cleaner, which trims once 32 MiB went by.

Run: python examples/sessions.py
"""

from __future__ import annotations

import gc
import warnings

import keras
import numpy as np

import lifecycle as lc


def build(units: int) -> lc.ManagedModel:
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(units, activation="relu")(inputs)
    model = lc.ManagedModel(inputs, keras.layers.Dense(1)(hidden), name=f"trial_{units}")
    model.compile(optimizer="adam", loss="mse")
    return model


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = x[:, :1] * 2.0
    warnings.simplefilter("always", ResourceWarning)
    for units in (16, 64, 256):
        with lc.LifecycleSession(
            cleanup=lc.CleanupStrategy.ON_SESSION_CLOSE,
            name=f"trial-{units}",
            trim_threshold=lc.tuning.DEFAULT_TRIM_THRESHOLD,  # None: never trim the C heap
        ) as session:
            model = build(units)
            loss = model.fit(x, y, epochs=3, verbose=0).history["loss"][-1]
            if units == 64:
                del model  # forgotten: the session's cleaner will clean up
                gc.collect()
            else:
                model.dispose()
        stats = session.statistics()
        print(
            f"units={units}: loss {loss:.3f}; disposed {stats.models_disposed}, "
            f"cleaned {stats.models_cleaned}, session {stats.state.value}, "
            f"heap trims {stats.cleaner.trims}"
        )


if __name__ == "__main__":
    main()
