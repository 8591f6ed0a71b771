"""Train a fresh model per fold and give its memory back after each one.

A k-fold loop builds, trains and drops a model per fold. With plain Keras every
dropped model keeps its weights and Adam slots alive; with ManagedModel each
fold's buffers are released by ``dispose()`` (here, by leaving ``with model:``),
right after the fold's last call: what that costs is the release alone, since a
disposed model leaves nothing for a garbage collection to find. The last line
says what the library's background work cost the loop.

Run: python examples/training_loop.py
"""

from __future__ import annotations

import keras
import numpy as np

import lifecycle as lc


def build(features: int) -> lc.ManagedModel:
    inputs = keras.Input((features,))
    hidden = keras.layers.Dense(256, activation="relu")(inputs)
    outputs = keras.layers.Dense(1)(hidden)
    model = lc.ManagedModel(inputs, outputs, name="fold_model")
    model.compile(optimizer="adam", loss="mse")
    return model


def main(folds: int = 3) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 32)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    for fold, validation in enumerate(np.array_split(np.arange(len(x)), folds)):
        train = np.setdiff1d(np.arange(len(x)), validation)
        with build(x.shape[1]) as model:
            model.fit(x[train], y[train], epochs=2, batch_size=64, verbose=0)
            loss = model.evaluate(x[validation], y[validation], verbose=0)
        report = model.dispose()  # already disposed by `with`: returns the same report
        print(
            f"fold {fold}: val loss {loss:.3f}, released {report.bytes_released / 2**20:.2f} MiB "
            f"in {report.variables_released} buffers ({report.release_seconds * 1e3:.1f} ms), "
            f"purged {report.registry_entries_purged} pinned graphs"
        )
    stats = lc.statistics(count_graphs=False)
    print(
        f"cleaner: {stats.collections} collections (longest "
        f"{stats.max_collection_seconds * 1e3:.0f} ms); other threads blocked "
        f"{stats.blocking_seconds * 1e3:.0f} ms in all"
    )


if __name__ == "__main__":
    main()
