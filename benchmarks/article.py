"""The code the library comes from: custom loops, a tf.Module, Optuna, a dropped model.

The article on ``tf.Variable`` lifecycles retrains a model every day in one
process: a fresh model, an Adam built outside it, a ``GradientTape`` step in a
``tf.function``, and its own recipe at the end of the day (``del model; del
optimizer; keras.backend.clear_session(); gc.collect()``). Each case runs as
the user writes it, in a fresh child per variant:

    keras-*     --days days of a Keras MLP (--model-mb MiB of weights) and an outside Adam
    module-*    the same with the article's ManagedModel: raw tf.Variables in a tf.Module
    optuna-*    --trials trials of an Optuna study, the objective as Optuna's docs write it

and for each, three ways:

    plain       the article's recipe (Optuna: its documented objective)
    managed     the recipe after lc.manage(model) + lc.manage(optimizer) + dispose() of both
                (Optuna: lc.manage(model) + dispose() at the objective's end)
    session     the recipe unchanged, the whole loop inside ``with lc.LifecycleSession():``
                (Optuna: the objective's body inside one)

A child reports the RSS growth per day or trial (least-squares slope after
``--warmup``), the bytes TensorFlow's own allocator accounting still holds at the end
over what it held after the first day (oneDNN's pool; 0 when it is off), and
seconds per day.

    drop-*      a ~--drop-mb MiB MLP fitted one step, then dropped with ``del`` only:
                plain (nothing else), recipe (``clear_session(); gc.collect()``), and
                in a session of each strategy (in_background: no further call;
                on_safe_points: ``session.safe_point()``; on_session_close: ``close()``)

reports what TensorFlow's accounting and RSS got back (as a fraction of the weights
and Adam slots) at the strategy's moment, and how long that took from the ``del``.

Run (from the repository root, with the package, optuna and psutil installed)::

    python benchmarks/article.py            # 3 rounds, about 30 min on 2 cores
    python benchmarks/article.py --quick
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any

import _harness
from _harness import MIB, Metric, Option

LOOPS = ("keras", "module", "optuna")
WAYS = ("plain", "managed", "session")
DROPS = ("plain", "recipe", "in_background", "on_safe_points", "on_session_close")
INPUT_DIM = 256
BATCH = 64
STEPS = 5
IDLE_WAIT = 10.0  # seconds IN_BACKGROUND is given, with no further call


def units_for(mib: float) -> int:
    """Hidden width of the MLP (INPUT_DIM -> units -> 1) whose weights hold about ``mib`` MiB."""
    return max(8, int(mib * MIB / 4 / (INPUT_DIM + 2)))


def tf_held() -> int:
    """Bytes TensorFlow's CPU allocator accounts as in use (0 when it keeps no account)."""
    import tensorflow as tf

    try:
        return int(tf.config.experimental.get_memory_info("CPU:0")["current"])
    except (ValueError, tf.errors.OpError):
        return 0


def keras_model(units: int) -> Any:
    import keras

    return keras.Sequential(
        [
            keras.Input((INPUT_DIM,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def article_module(units: int) -> Any:
    import tensorflow as tf

    class ManagedModel(tf.Module):  # the article's, by its name
        def __init__(self) -> None:
            super().__init__()
            self.w1 = tf.Variable(tf.random.normal((INPUT_DIM, units)) * 0.05)
            self.b1 = tf.Variable(tf.zeros((units,)))
            self.w2 = tf.Variable(tf.random.normal((units, 1)) * 0.05)

        def __call__(self, x: Any) -> Any:
            return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1) + self.b1), self.w2)

    return ManagedModel()


def train(model: Any, optimizer: Any, x: Any, y: Any) -> None:
    import tensorflow as tf

    @tf.function
    def step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    for _ in range(STEPS):
        step(x, y)


def loop(case: str, way: str, args: argparse.Namespace) -> dict[str, Any]:
    import contextlib

    import keras
    import numpy as np
    import psutil

    import lifecycle as lc

    process = psutil.Process()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, INPUT_DIM), dtype=np.float32)
    y = rng.standard_normal((BATCH, 1), dtype=np.float32)
    units = units_for(args.model_mb)
    rss, held, days = [], [], []
    scope = lc.LifecycleSession() if way == "session" else contextlib.nullcontext()
    with scope:
        for _ in range(args.days):
            started = time.perf_counter()
            model = keras_model(units) if case == "keras" else article_module(units)
            optimizer = keras.optimizers.Adam()
            if way == "managed":
                lc.manage(model)
                lc.manage(optimizer)
            train(model, optimizer, x, y)
            if way == "managed":
                model.dispose()
                optimizer.dispose()
            # The article's recipe, in every variant.
            del model, optimizer
            keras.backend.clear_session()
            gc.collect()
            days.append(time.perf_counter() - started)
            rss.append(process.memory_info().rss / MIB)
            held.append(tf_held() / MIB)
    return summary(rss, held, days, args.warmup)


def optuna_study(way: str, args: argparse.Namespace) -> dict[str, Any]:
    import keras
    import numpy as np
    import optuna
    import psutil

    import lifecycle as lc

    process = psutil.Process()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * BATCH, INPUT_DIM), dtype=np.float32)
    y = (x[:, 0] > 0).astype("int32")
    width = units_for(args.model_mb)

    def objective(trial: optuna.Trial) -> float:  # as Optuna's Keras example writes it
        keras.backend.clear_session()
        model = keras.Sequential([keras.Input((INPUT_DIM,))])
        for i in range(trial.suggest_int("n_layers", 1, 2)):
            units = trial.suggest_int(f"n_units_l{i}", width // 2, width)
            model.add(keras.layers.Dense(units, activation="relu"))
        model.add(keras.layers.Dense(2, activation="softmax"))
        model.compile(
            optimizer=keras.optimizers.Adam(trial.suggest_float("lr", 1e-4, 1e-2, log=True)),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        if way == "managed":
            lc.manage(model)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        score = model.evaluate(x, y, verbose=0)[1]
        if way == "managed":
            model.dispose()
        return score

    def in_a_session(trial: optuna.Trial) -> float:
        with lc.LifecycleSession():
            return objective(trial)

    rss, held, trials = [], [], []
    started = [time.perf_counter()]

    def sample(study: Any, trial: Any) -> None:
        trials.append(time.perf_counter() - started[0])
        rss.append(process.memory_info().rss / MIB)
        held.append(tf_held() / MIB)
        started[0] = time.perf_counter()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    study.optimize(
        in_a_session if way == "session" else objective, n_trials=args.trials, callbacks=[sample]
    )
    return summary(rss, held, trials, args.warmup)


def summary(
    rss: list[float], held: list[float], seconds: list[float], warmup: int
) -> dict[str, Any]:
    warmup = max(0, min(warmup, len(rss) // 3))
    return {
        "growth_mib_per_day": _harness.slope(rss[warmup:]),
        "tf_held_mib": held[-1] - held[0],
        "seconds_per_day": statistics.fmean(seconds[warmup:]),
        "rss_mib": rss,
    }


def drop(way: str, args: argparse.Namespace) -> dict[str, Any]:
    import keras
    import numpy as np
    import psutil

    import lifecycle as lc

    process = psutil.Process()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, INPUT_DIM), dtype=np.float32)
    y = rng.standard_normal((BATCH, 1), dtype=np.float32)
    units = units_for(args.drop_mb)
    # Both layers' weights and biases, and Adam's two slots of each, float32.
    weights = 3 * 4 * units * (INPUT_DIM + 2)
    strategy = {
        "in_background": lc.CleanupStrategy.IN_BACKGROUND,
        "on_safe_points": lc.CleanupStrategy.ON_SAFE_POINTS,
        "on_session_close": lc.CleanupStrategy.ON_SESSION_CLOSE,
    }.get(way)
    session = lc.LifecycleSession(cleanup=strategy) if strategy is not None else None
    if session is not None:
        session.__enter__()
    model = keras_model(units)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=BATCH, verbose=0)
    fitted_held, fitted_rss = tf_held(), process.memory_info().rss
    dropped = time.perf_counter()
    del model
    if way == "recipe":
        keras.backend.clear_session()
        gc.collect()
    elif way == "on_safe_points":
        session.safe_point()
    elif way in ("plain", "in_background"):
        # No call: wait until TensorFlow's account (or RSS) shows the bytes back.
        deadline = dropped + IDLE_WAIT
        while time.perf_counter() < deadline and not back(fitted_held, fitted_rss, weights):
            time.sleep(0.02)
    if way == "on_session_close":
        session.__exit__(None, None, None)
    seconds = time.perf_counter() - dropped
    held_back = (fitted_held - tf_held()) / weights if fitted_held else 0.0
    rss_back = (fitted_rss - process.memory_info().rss) / weights
    if session is not None and way != "on_session_close":
        session.__exit__(None, None, None)
    result = {
        "tf_back": held_back,
        "rss_back": rss_back,
        "max_collection_ms": 1000 * lc.statistics().max_collection_seconds,
    }
    if back(fitted_held, fitted_rss, weights):
        result["seconds_to_free"] = seconds  # left out where nothing came back
    return result


def back(fitted_held: int, fitted_rss: int, weights: int) -> bool:
    import psutil

    if fitted_held:
        return fitted_held - tf_held() >= 0.9 * weights
    return fitted_rss - psutil.Process().memory_info().rss >= 0.9 * weights


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    case, way = variant.split("-", 1)
    if case == "drop":
        return drop(way, args)
    if case == "optuna":
        return optuna_study(way, args)
    return loop(case, way, args)


def baseline(variant: str) -> str:
    return f"{variant.split('-', 1)[0]}-plain"


VARIANTS = {
    **{f"{case}-{way}": f"{case} loop, {way}" for case in LOOPS for way in WAYS},
    **{f"drop-{way}": f"a dropped model, {way.replace('_', ' ')}" for way in DROPS},
}

BENCHMARK = _harness.Benchmark(
    name="article",
    doc=__doc__,
    variants=VARIANTS,
    metrics=[
        Metric("growth_mib_per_day", "MiB", "+.2f", "RSS MiB/day", False, "rss_mib"),
        Metric("tf_held_mib", "MiB", "+.1f", "TF held MiB", ratio=False),
        Metric("seconds_per_day", "s", ".3f", "s/day"),
        Metric("tf_back", "", ".2f", "TF bytes back", ratio=False),
        Metric("rss_back", "", ".2f", "RSS back", ratio=False),
        Metric("seconds_to_free", "s", ".2f", "s to free", ratio=False),
        Metric("max_collection_ms", "ms", ".0f", "longest collection ms", ratio=False),
    ],
    measure=measure,
    options=[
        Option("--days", 16, "days (loops)", _harness.positive_int),
        Option("--trials", 20, "Optuna trials", _harness.positive_int),
        Option("--warmup", 3, "days or trials left out of the slope"),
        Option("--model-mb", 5.0, "MiB of weights of a day's model", _harness.positive_float),
        Option("--drop-mb", 60.0, "MiB of weights of the dropped model", _harness.positive_float),
    ],
    quick={"days": 5, "trials": 5, "warmup": 1, "model_mb": 2.0, "drop_mb": 8.0},
    baseline=baseline,
    rounds=3,
    timeout=900.0,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
