"""Models and model factories of the tests, one definition each.

``constant_model(value)`` answers ``value`` for every input, so a test tells
versions apart by their answers; ``constant(value)`` is the same as a registry
factory (``registry.load(name, version, constant(2.0))``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np

import lifecycle as lc

X = np.ones((2, 4), "float32")
"""The input registry tests send to a ``constant`` model."""


def constant_model(
    value: float,
    *,
    features: int = 3,
    outputs: int = 2,
    units: int = 0,
    input_name: str | None = "features",
) -> keras.Model:
    """Answers ``value`` in each of ``outputs`` columns for any ``features`` values.

    The defaults are the served model of the server tests (input ``features``,
    shape ``(-1, 3)``); ``units`` adds a hidden layer (a model with some weights).
    """
    x = keras.Input((features,), name=input_name)
    hidden = keras.layers.Dense(units)(x) if units else x
    dense = keras.layers.Dense(
        outputs, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(value)
    )
    return keras.Model(x, dense(hidden))


def constant(
    value: float, *, units: int = 8, input_name: str | None = None
) -> Callable[[], keras.Model]:
    """A registry factory: 4 features, a hidden layer of ``units``, one output ``value``."""
    return functools.partial(
        constant_model, value, features=4, outputs=1, units=units, input_name=input_name
    )


def answer(registry: lc.ModelRegistry, name: str = "risk", **kwargs: object) -> float:
    """What ``name`` answers ``X`` (a ``constant`` version answers its value)."""
    return float(registry.predict(name, X, **kwargs).numpy()[0, 0])


def pair_model() -> keras.Model:
    """Two named inputs (float and int), dict outputs: score = 2 * sum, logits = sum."""
    a = keras.Input((2,), name="a")
    b = keras.Input((1,), name="b", dtype="int64")
    joined = keras.layers.Concatenate()([a, keras.ops.cast(b, "float32")])
    ones = keras.initializers.Constant(1.0)
    return keras.Model(
        [a, b],
        {
            "score": keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(2.0))(
                joined
            ),
            "logits": keras.layers.Dense(3, kernel_initializer=ones)(joined),
        },
    )


def words_model() -> keras.Model:
    """A string input: the index of each word in a two-word vocabulary."""
    x = keras.Input((1,), name="word", dtype="string")
    return keras.Model(x, keras.layers.StringLookup(vocabulary=["cat", "dog"])(x))


def embedding_model() -> keras.Model:
    """Ids 0-4 only: an id out of range is refused by the model's own gather."""
    ids = keras.Input((1,), name="ids", dtype="int64")
    return keras.Model(ids, keras.layers.Embedding(5, 2)(ids))


def echo_model(dtype: str) -> keras.Model:
    """Answers its input (2 values per row) unchanged, in ``dtype``."""
    x = keras.Input((2,), name="x", dtype=dtype)
    return keras.Model(x, keras.layers.Identity(dtype=dtype)(x))


def save(model: keras.Model, base: Path, version: int) -> None:
    """Publish a version as a training job should: written aside, then renamed into place."""
    aside = base / f".writing-{version}"
    aside.mkdir(parents=True)
    model.save(aside / "model.keras")
    aside.rename(base / str(version))


def trained(name: str | None = None) -> lc.ManagedModel:
    """A managed model (8 -> 16 -> 2) after one epoch of Adam: weights, slots, step functions."""
    inputs = keras.Input((8,))
    model = lc.ManagedModel(
        inputs, keras.layers.Dense(2)(keras.layers.Dense(16)(inputs)), name=name
    )
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((32, 8), "float32"), np.ones((32, 2), "float32")
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    return model


def model_repository(root: Path) -> Path:
    """A model repository: models ``a`` (answers 1) and ``b`` (answers 2), and no-models.

    The two entries that are no model: a dot-directory and a file.
    """
    save(constant_model(1.0), root / "a", 1)
    save(constant_model(2.0), root / "b", 1)
    save(constant_model(9.0), root / ".hidden", 1)  # a dot-directory: ignored
    (root / "README.md").write_text("not a model")  # a file: ignored
    return root
