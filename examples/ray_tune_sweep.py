"""A Ray Tune sweep whose trials give their memory back, on a reused worker.

``managed_trainable(train)`` is the user's ``train(config)`` unchanged (plain
Keras, ``ray.tune.report``), with one difference: every Keras model a trial
builds is disposed when the trial ends, whether it finished or a scheduler
stopped it. With ``reuse_actors=True`` one worker process runs every trial
here, and each trial prints what the previous ones left in it.

Run: python examples/ray_tune_sweep.py [--trials 6]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import psutil
import ray
from ray import tune

from lifecycle.integrations.ray import managed_trainable, worker_statistics


def train(config: dict[str, Any]) -> None:
    # What the previous trials of this worker left: read before building.
    before = worker_statistics()
    rss = psutil.Process().memory_info().rss / 2**20
    rng = np.random.default_rng(config["seed"])
    x = rng.normal(size=(512, 64)).astype("float32")
    y = np.argmax(x[:, :4], axis=1)
    keras.utils.set_random_seed(config["seed"])
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(config["units"], activation="relu"),
            keras.layers.Dense(config["units"], activation="relu"),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    during = worker_statistics().models_live  # this trial's models: the one just built
    for _ in range(3):
        history = model.fit(x, y, batch_size=64, epochs=1, verbose=0)
        tune.report(
            {
                "accuracy": float(history.history["accuracy"][-1]),
                "disposed_before": before.models_disposed,
                "live_before": before.models_live,
                "live_during": during,
                "rss_mib": rss,
                "worker": os.getpid(),
            }
        )


def main(trials: int = 6) -> None:
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with tempfile.TemporaryDirectory() as directory:
            scheduler = tune.schedulers.ASHAScheduler(max_t=3, grace_period=1, reduction_factor=2)
            tuner = tune.Tuner(
                managed_trainable(train),
                param_space={"seed": tune.grid_search(list(range(trials))), "units": 512},
                tune_config=tune.TuneConfig(
                    metric="accuracy", mode="max", scheduler=scheduler, reuse_actors=True
                ),
                run_config=tune.RunConfig(storage_path=directory, verbose=0),
            )
            frame = tuner.fit().get_dataframe().sort_values("config/seed")
    finally:
        ray.shutdown()
    for seed, row in zip(frame["config/seed"], frame.itertuples(), strict=True):
        print(
            f"trial {seed}: {row.live_during} model live during it, {row.disposed_before} "
            f"disposed before it ({row.live_before} live at its start); "
            f"{row.training_iteration} of 3 epochs; worker RSS {row.rss_mib:.0f} MiB at its start"
        )
    rss = list(frame["rss_mib"])
    print(
        f"models live between trials: {int(frame['live_before'].max())}; worker RSS "
        f"{rss[-1] - rss[1]:+.0f} MiB from trial 1 to trial {len(rss) - 1} "
        f"({len(set(frame['worker']))} worker process)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    main(parser.parse_args().trials)
