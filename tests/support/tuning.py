"""Model selection in the tests: the digits data, and a small KerasTuner search.

Child processes import it too (``from tests.support.tuning import ...``, run
from the repository's root).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest


def digits(samples: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """The first ``samples`` of scikit-learn's digits, scaled to [0, 1] (skips without it)."""
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    return (x[:samples] / 16).astype("float32"), y[:samples]


class Recorder:
    """A build function that keeps every model it builds, to check them afterwards."""

    def __init__(self) -> None:
        self.models: list[keras.Model] = []

    def __call__(self, hp: Any) -> keras.Model:
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(hp.Int("units", 8, 32, step=8), activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(hp.Float("lr", 1e-3, 1e-2, sampling="log")),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        self.models.append(model)
        return model


def search(tuner_class: type, directory, build, trials: int = 2, seed: int = 3):
    """``trials`` trials of ``tuner_class`` over ``build`` on 300 digits, 2 epochs each."""
    keras.utils.set_random_seed(seed)
    tuner = tuner_class(
        build,
        objective="val_accuracy",
        max_trials=trials,
        seed=seed,
        directory=str(directory),
        project_name="search",
    )
    x, y = digits()
    tuner.search(x, y, validation_split=0.25, epochs=2, batch_size=64, verbose=0)
    return tuner
