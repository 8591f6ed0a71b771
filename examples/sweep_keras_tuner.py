"""A KerasTuner search whose trials give their memory back.

``managed_tuner(kt.RandomSearch)`` is RandomSearch with one difference: every
model a trial builds is disposed when the trial ends (after its checkpoint and
score are saved), and so is the model the tuner's constructor builds to learn
the search space. Same seed, same trials, same scores as plain KerasTuner.

Run: python examples/sweep_keras_tuner.py [--trials 6]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import keras
import keras_tuner as kt
import numpy as np

from lifecycle.integrations.keras_tuner import managed_tuner

# Keras 3 warns when KerasTuner loads a checkpoint into a model whose optimizer
# is not built yet; the weights load (plain KerasTuner warns the same).
warnings.filterwarnings("ignore", "Skipping variable loading for optimizer", UserWarning)


def build(hp: kt.HyperParameters) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(hp.Int("units", 64, 512, step=64), activation="relu"),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(hp.Float("learning_rate", 1e-4, 1e-2, sampling="log")),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main(trials: int = 6) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 32)).astype("float32")
    y = np.argmax(x[:, :4], axis=1)
    keras.utils.set_random_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        tuner = managed_tuner(kt.RandomSearch)(
            build, objective="val_accuracy", max_trials=trials, seed=0, directory=directory
        )
        tuner.search(x, y, validation_split=0.25, epochs=3, batch_size=64, verbose=0)
        stats = tuner.lifecycle_statistics()
        print(
            f"{trials} trials: {stats.models_built} models built, {stats.models_disposed} "
            f"disposed ({stats.bytes_released / 2**20:.2f} MiB released), "
            f"{stats.models_live} left live"
        )
        best_hp = tuner.get_best_hyperparameters()[0].values
        print(f"best: units={best_hp['units']}, learning_rate={best_hp['learning_rate']:.4f}")
        # Rebuilt from the best trial's checkpoint: a managed model, and yours.
        (best,) = tuner.get_best_models(1)
        accuracy = float(np.mean(np.argmax(best.predict(x, verbose=0), axis=1) == y))
        report = best.dispose()
        print(
            f"best model: accuracy {accuracy:.3f}, then disposed "
            f"({report.bytes_released / 2**20:.2f} MiB)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    main(parser.parse_args().trials)
