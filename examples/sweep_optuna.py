"""An Optuna study whose Keras objective runs inside a session: one line, memory flat.

The objective is written as Optuna's own Keras example writes it (a
``clear_session()``, a model built from the trial's suggestions, ``fit``, a
validation score) and left unchanged; ``with lc.LifecycleSession():`` around
its body is the only addition. Each trial's session owns the trial's model,
optimizer and traced steps, and frees them when the trial returns. Without
it, every trial's weights and Adam slots stay pinned in TensorFlow.

TensorFlow's own accounting of the CPU memory it holds is read after each
trial (``tf.config.experimental.get_memory_info``; it reports 0 when oneDNN's
pool is off, as under ``LIFECYCLE_ALLOCATOR=system``).

Run: python examples/sweep_optuna.py [--trials 12] [--plain]
"""

from __future__ import annotations

import argparse

import keras
import numpy as np
import optuna
import tensorflow as tf

import lifecycle as lc

MIB = 2**20


def data() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 64)).astype("float32")
    y = (x[:, :8].sum(axis=1) > 0).astype("int32")
    return x[:384], y[:384], x[384:], y[384:]


X_TRAIN, Y_TRAIN, X_VALID, Y_VALID = data()


def objective(trial: optuna.Trial) -> float:
    """Optuna's Keras objective, unchanged."""
    keras.backend.clear_session()
    model = keras.Sequential([keras.Input((64,))])
    for i in range(trial.suggest_int("n_layers", 1, 3)):
        units = trial.suggest_int(f"n_units_l{i}", 256, 1024, log=True)
        model.add(keras.layers.Dense(units, activation="relu"))
    model.add(keras.layers.Dense(2, activation="softmax"))
    model.compile(
        optimizer=keras.optimizers.Adam(trial.suggest_float("lr", 1e-4, 1e-2, log=True)),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(X_TRAIN, Y_TRAIN, batch_size=64, epochs=2, verbose=0)
    return model.evaluate(X_VALID, Y_VALID, verbose=0)[1]


def objective_in_a_session(trial: optuna.Trial) -> float:
    """The same objective; the session frees what the trial made when it returns."""
    with lc.LifecycleSession():
        return objective(trial)


def held_mib() -> float:
    return tf.config.experimental.get_memory_info("CPU:0")["current"] / MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--plain", action="store_true", help="without the session")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    held = []
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    study.optimize(
        objective if args.plain else objective_in_a_session,
        n_trials=args.trials,
        callbacks=[lambda study, trial: held.append(held_mib())],
    )
    print(f"best accuracy {study.best_value:.3f} with {study.best_params}")
    print(
        f"{'plain' if args.plain else 'in a session'}: TensorFlow holds "
        f"{held[0]:.1f} MiB after trial 1, {held[-1]:.1f} MiB after trial {len(held)}"
    )


if __name__ == "__main__":
    main()
