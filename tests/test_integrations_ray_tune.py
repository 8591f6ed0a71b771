"""Ray Tune: managed trainables dispose every model of a trial, and change no result.

One local Ray instance for the module. A trial cannot report after it ended,
so what a worker did is read by an observer: a mixin put in front of the
trainable's (``__mixins__``, as Tune composes function trainables) sends the
worker's statistics to a named actor after the managed trainable's ``stop()``
or ``reset()`` ran, and each trial sends what it saw when it started.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

import lifecycle as lc

ray = pytest.importorskip("ray")

from ray import tune  # noqa: E402 (after the skip)
from support.ray_trials import PYTHON_PATH, Observed, Observer, send  # noqa: E402

from lifecycle.integrations.ray import (  # noqa: E402
    ManagedTrainable,
    WorkerStatistics,
    managed_trainable,
    worker_statistics,
)

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance of 2 CPUs; workers import this module (its trainables)."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=100 * MIB,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": PYTHON_PATH, "TF_CPP_MIN_LOG_LEVEL": "2"}},
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def observer(ray_instance):
    name = f"observer-{uuid.uuid4().hex[:8]}"
    actor = Observer.options(name=name).remote()
    yield name, actor
    ray.kill(actor)


def observed(trainable):
    trainable.__mixins__ = (Observed, *trainable.__mixins__)
    return trainable


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 8), dtype=np.float32)
    return x, x.sum(axis=1, keepdims=True)


def build(units: int) -> keras.Model:
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(units, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


def train(
    config: dict[str, Any],
    arrays: tuple[np.ndarray, np.ndarray] | None = None,
    teacher: keras.Model | None = None,
) -> None:
    """A user's function trainable: plain Keras, plain ray.tune.report."""
    if "observer" in config:
        send(config["observer"], "start", thread_name=threading.current_thread().name)
    keras.utils.set_random_seed(config["seed"])
    x, y = arrays if arrays is not None else data(config["seed"])
    if teacher is not None:  # passed with tune.with_parameters: a copy per trial
        y = teacher.predict(x, verbose=0)
    model = build(config["units"])
    for _ in range(config.get("epochs", 2)):
        loss = model.fit(x, y, batch_size=32, epochs=1, verbose=0).history["loss"][-1]
        if config.get("fail"):
            raise ValueError("this trial fails after fitting")
        tune.report({"loss": float(loss)})


def tuner(trainable, tmp_path: Path, space: dict[str, Any], **tune_config: Any) -> tune.Tuner:
    stop = tune_config.pop("stop", None)
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(**tune_config),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), verbose=0, stop=stop, failure_config=None
        ),
    )


def losses(results) -> dict[tuple[int, int], float]:
    frame = results.get_dataframe()
    return {
        (int(seed), int(units)): float(loss)
        for seed, units, loss in zip(
            frame["config/seed"], frame["config/units"], frame["loss"], strict=True
        )
    }


def by_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [event for event in events if event["kind"] == kind]


# ------------------------------------------------------------- without a cluster


def test_the_wrapper_keeps_the_function_and_refuses_what_it_cannot_manage():
    managed = managed_trainable(train)
    assert managed.__name__ == "train" and managed.__wrapped__ is train
    assert managed.__mixins__ == (ManagedTrainable,)
    assert managed_trainable(managed) is managed
    assert managed_trainable(thread="trial")(train).__lifecycle_thread__ == "trial"
    with pytest.raises(TypeError, match=r"ManagedTrainable mixin first.*Received: the class"):
        managed_trainable(tune.Trainable)
    with pytest.raises(TypeError, match=r"generator .* not supported"):
        managed_trainable(lambda config: (yield 1))
    with pytest.raises(TypeError, match="Received: int object 3"):
        managed_trainable(3)
    with pytest.raises(ValueError, match="Received: thread='main'"):
        managed_trainable(train, thread="main")


@pytest.mark.parametrize("thread", ["worker", "trial"])
def test_a_direct_call_is_a_trial_that_disposes_its_leaked_models_only(thread):
    before = build(4)  # the caller's: not the trial's
    kept: list[keras.Model] = []

    def trial(config):
        model = build(config["units"])
        x, y = data()
        model.fit(x, y, epochs=1, verbose=0)
        kept.append(model)  # a leak: still alive when the trial ends
        build(2)  # built and dropped: freed or disposed, never live afterwards
        return threading.current_thread().name

    start = worker_statistics()
    name = managed_trainable(trial, thread=thread)({"units": 3})
    assert (name == "lifecycle-tune-trials") == (thread == "worker")
    (model,) = kept
    assert model.state is lc.ModelState.DISPOSED
    assert all(tuple(v.numpy().shape) == (0,) for v in model.weights)
    assert not isinstance(before, lc.ManagedModel) and before.predict(data()[0], verbose=0).shape
    stats = worker_statistics()
    assert isinstance(stats, WorkerStatistics)
    assert stats.trials == start.trials + 1 and stats.models_live == 0
    assert stats.models_built - start.models_built == 2
    assert 1 <= stats.models_disposed - start.models_disposed <= 2
    assert stats.bytes_released - start.bytes_released >= model_bytes(8, 3)


def model_bytes(inputs: int, units: int) -> int:
    weights = inputs * units + units + units + 1
    return 4 * weights * 3  # weights and Adam's two slots, float32


def test_a_trial_that_raises_still_disposes_and_reraises():
    kept = []

    def trial(config):
        kept.append(build(3))
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        managed_trainable(trial)({})
    assert kept[0].state is lc.ModelState.DISPOSED
    assert worker_statistics().models_live == 0


def test_a_model_the_hook_no_longer_sees_fails_the_self_check(monkeypatch):
    from keras.src.models import model as keras_model_module

    from lifecycle._tf import _compat, _recording

    with _recording.record_models():  # the hook is installed on first use
        pass
    monkeypatch.setattr(keras_model_module.Model, "__new__", staticmethod(_recording._original_new))
    monkeypatch.setattr(_compat, "_report", None)
    with pytest.raises(lc.CompatibilityError, match=r"Model.__new__.*no longer sees every model"):
        lc.introspection.check_compatibility()


# ------------------------------------------------------------------- with Ray Tune


def test_a_reused_worker_disposes_every_trial_and_finds_what_a_plain_run_finds(tmp_path, observer):
    name, actor = observer
    space = {"seed": tune.grid_search([0, 1, 2]), "units": 4}
    # One trial at a time: one worker runs them all, one after another.
    plain = tuner(train, tmp_path / "plain", space, reuse_actors=True, max_concurrent_trials=1)
    managed = tuner(
        observed(managed_trainable(train)),
        tmp_path / "managed",
        {**space, "observer": name},
        reuse_actors=True,
        max_concurrent_trials=1,
    )
    plain_results, managed_results = plain.fit(), managed.fit()
    assert not plain_results.errors and not managed_results.errors
    assert losses(managed_results) == losses(plain_results) and len(losses(plain_results)) == 3

    events = ray.get(actor.all.remote())
    starts = by_kind(events, "start")
    # Each trial starts with nothing live: the last trial's models are disposed.
    assert [event["models_live"] for event in starts] == [0, 0, 0]
    assert [event["models_disposed"] for event in starts] == [0, 1, 2]
    # One worker, and its trials run on one long-lived thread of it.
    assert len({event["pid"] for event in events}) == 1
    assert len({event["thread"] for event in starts}) == 1
    assert {event["thread_name"] for event in starts} == {"lifecycle-tune-trials"}
    (stop,) = by_kind(events, "stop")
    assert stop["trials"] == stop["models_built"] == stop["models_disposed"] == 3
    assert stop["models_live"] == 0 and stop["bytes_released"] >= 3 * model_bytes(8, 4)


@pytest.mark.slow
def test_failed_and_early_stopped_trials_dispose_their_models(tmp_path, observer):
    name, actor = observer
    space = {
        "seed": 0,
        "units": 4,
        "epochs": 3,
        "fail": tune.grid_search([True, False]),
        "observer": name,
    }
    # Without actor reuse: each trial has its own worker, stopped after 1 report
    # (or failed), and disposes before the worker goes.
    results = tuner(
        observed(managed_trainable(train)),
        tmp_path,
        space,
        stop={"training_iteration": 1},
    ).fit()
    assert len(results.errors) == 1 and "fails after fitting" in str(results.errors[0])
    frame = results.get_dataframe()
    assert list(frame["training_iteration"].dropna()) == [1]  # stopped early, not at 3
    stops = by_kind(ray.get(actor.all.remote()), "stop")
    assert len(stops) == 2 and len({event["pid"] for event in stops}) == 2
    for event in stops:
        assert (event["trials"], event["models_built"], event["models_disposed"]) == (1, 1, 1)
        assert event["models_live"] == 0 and event["bytes_released"] >= model_bytes(8, 4)


@pytest.mark.slow
def test_a_scheduler_stopping_reused_trials_of_a_composed_trainable_leaves_nothing_live(
    tmp_path, observer
):
    name, actor = observer
    space = {"seed": tune.grid_search([0, 1, 2, 3]), "units": 4, "epochs": 4, "observer": name}
    scheduler = tune.schedulers.ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
    # Composed with Tune's own wrappers, as users do: data and a model through the
    # object store; each trial deserializes its own copy of the model.
    trainable = tune.with_parameters(
        observed(managed_trainable(train)), arrays=data(7), teacher=build(1)
    )
    trainable = tune.with_resources(trainable, {"cpu": 1})
    results = tuner(
        trainable,
        tmp_path,
        space,
        reuse_actors=True,
        max_concurrent_trials=1,
        metric="loss",
        mode="min",
        scheduler=scheduler,
    ).fit()
    assert not results.errors
    iterations = sorted(results.get_dataframe()["training_iteration"])
    assert iterations[0] < 4, f"ASHA stopped no trial early: {iterations}"
    events = ray.get(actor.all.remote())
    starts = by_kind(events, "start")
    # Live at a trial's start: only its own copy of the teacher; the last trial's two
    # models are disposed.
    assert [event["models_live"] for event in starts] == [1] * 4
    assert [event["models_disposed"] for event in starts] == [0, 2, 4, 6]
    (stop,) = by_kind(events, "stop")
    # Per trial: its copy of the teacher and the model it trained.
    assert (stop["trials"], stop["models_built"], stop["models_disposed"]) == (4, 8, 8)


class Train(Observed, ManagedTrainable, tune.Trainable):
    """A user's class trainable: the model built in setup, rebuilt on reuse."""

    def setup(self, config):
        keras.utils.set_random_seed(config["seed"])
        self.model = build(config["units"])
        send(config["observer"], "start")

    def step(self):
        x, y = data(self.config["seed"])
        loss = self.model.fit(x, y, batch_size=32, epochs=1, verbose=0).history["loss"][-1]
        return {"loss": float(loss), "done": self.iteration >= 1}

    def reset_config(self, new_config):
        self.setup(new_config)
        return True

    def save_checkpoint(self, checkpoint_dir):
        return {}

    def load_checkpoint(self, checkpoint):
        pass


def test_the_class_mixin_disposes_at_reset_and_stop(tmp_path, observer):
    name, actor = observer
    space = {"seed": tune.grid_search([0, 1, 2]), "units": 4, "observer": name}
    results = tuner(Train, tmp_path, space, reuse_actors=True, max_concurrent_trials=1).fit()
    assert not results.errors and len(results.get_dataframe()) == 3
    events = ray.get(actor.all.remote())
    resets, (stop,) = by_kind(events, "reset"), by_kind(events, "stop")
    assert len(resets) == 2 and {e["pid"] for e in events} == {stop["pid"]}
    # After each reset the old trial's model is gone and the new one (built by
    # reset_config) is the only live model.
    assert [(e["models_disposed"], e["models_live"]) for e in resets] == [(1, 1), (2, 1)]
    assert (stop["trials"], stop["models_built"], stop["models_disposed"]) == (3, 3, 3)
    assert stop["models_live"] == 0


# ------------------------------------------------------------------------ example


@pytest.mark.slow
@pytest.mark.subprocess
def test_example_disposes_every_trial_before_the_next():
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples/ray_tune_sweep.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    trials = re.findall(
        r"^trial (\d+): (\d+) model live during it, (\d+) disposed before it \((\d+) live",
        out,
        re.M,
    )
    assert len(trials) == 6, out
    # Each trial saw its own model live, every earlier trial's disposed, none left live.
    assert [(int(a), int(b), int(c)) for _, a, b, c in trials] == [(1, n, 0) for n in range(6)]
    assert "models live between trials: 0;" in out, out
    summary = re.search(r"^models live between trials: 0; worker RSS [+-]\d+ MiB", out, re.M)
    assert summary, out
