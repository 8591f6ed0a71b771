"""Daily retraining with a custom GradientTape loop, unchanged, inside a session.

The loop is the one of the article on tf.Variable lifecycles: each day a fresh
Keras model, an Adam optimizer built outside it, a training step in a
``tf.function``, and the article's own recipe at the end of the day
(``del model; del optimizer; clear_session(); gc.collect()``). On its own, that
recipe leaves each day's weights and both Adam slots pinned by the traced
step's graphs. Wrapped in ``with lc.LifecycleSession():`` and nothing else, the
day's variables belong to the session, which frees them once the collection
finds them dropped (or when it closes), and the best model is handed out of
the session to survive it.

The second half manages the article's own ``ManagedModel``, a ``tf.Module``
with raw ``tf.Variable`` objects, and its outside optimizer with ``lc.manage``.

Run: python examples/custom_training_loop.py [--days 6]
"""

from __future__ import annotations

import argparse
import gc

import keras
import numpy as np
import tensorflow as tf

import lifecycle as lc


def build_model() -> keras.Model:
    return keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)]
    )


def make_step(model: keras.Model | tf.Module, optimizer: keras.optimizers.Optimizer):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    return step


class ArticleModel(tf.Module):
    """The article's ManagedModel: raw tf.Variables and a __call__."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(tf.random.normal((32, 1)) * 0.1, name="w")
        self.b = tf.Variable(tf.zeros((1,)), name="b")

    def __call__(self, x):
        return tf.matmul(x, self.w) + self.b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=6)
    days = parser.parse_args().days
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 32)).astype("float32")
    y = x[:, :1] * 3.0

    best, best_loss = None, float("inf")
    with lc.LifecycleSession(name="retraining") as session:
        for day in range(days):
            model = build_model()
            optimizer = keras.optimizers.Adam()
            step = make_step(model, optimizer)
            for _ in range(20):
                loss = float(step(x, y))
            if loss < best_loss:
                best, best_loss = model, loss
            print(f"day {day}: loss {loss:.4f}")
            # The article's recipe, as it is written.
            del model, optimizer, step
            keras.backend.clear_session()
            gc.collect()
        session.hand_out(best)  # kept past the session; the other days' models are freed
    stats = session.statistics()
    print(
        f"session closed: it released {stats.variables_released} buffers "
        f"({stats.variable_bytes_released} bytes) that the other days left"
    )
    print(f"the best model survived it: predicts {best.predict(x[:2], verbose=0).shape}")

    module = lc.manage(ArticleModel())
    optimizer = lc.manage(keras.optimizers.Adam())
    step = make_step(module, optimizer)
    for _ in range(20):
        step(x, y)
    released = module.dispose().bytes_released + optimizer.dispose().bytes_released
    try:
        module(x)
    except lc.DisposedError:
        print(f"tf.Module and its optimizer disposed: {released} bytes; calling it raises")


if __name__ == "__main__":
    main()
