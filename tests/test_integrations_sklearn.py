"""scikit-learn: each fitted Keras model is disposed once model selection is done with it."""

from __future__ import annotations

import gc
import pickle

import keras
import numpy as np
import pytest
from support.tuning import digits
from support.waits import wait_until

import lifecycle as lc

model_selection = pytest.importorskip("sklearn.model_selection")
sklearn_base = pytest.importorskip("sklearn.base")

from keras.wrappers import SKLearnClassifier  # noqa: E402 (after the skip)

from lifecycle.integrations.sklearn import (  # noqa: E402
    ManagedEstimator,
    ManagedSKLearnClassifier,
    ManagedSKLearnRegressor,
)


@pytest.fixture(autouse=True)
def quiet_keras():
    # The wrappers' predict() shows a progress bar whatever fit's `verbose` says.
    enabled = keras.config.is_interactive_logging_enabled()
    keras.config.disable_interactive_logging()
    yield
    if enabled:
        keras.config.enable_interactive_logging()


class Recorder:
    """A model-building callable (as the wrappers take) that keeps what it built."""

    def __init__(self, *, regression: bool = False) -> None:
        self.models: list[keras.Model] = []
        self.regression = regression

    def __call__(self, X, y, units=16):
        # The classifier wrapper passes one-hot targets.
        classes = 0 if self.regression else y.shape[1]
        model = keras.Sequential(
            [
                keras.Input((X.shape[1],)),
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(classes or 1, activation="softmax" if classes else None),
            ]
        )
        model.compile(optimizer="adam", loss="categorical_crossentropy" if classes else "mse")
        self.models.append(model)
        return model


def released(model: keras.Model) -> bool:
    return model.state is lc.ModelState.DISPOSED and all(
        tuple(v.numpy().shape) == (0,) for v in model.weights
    )


FIT = {"epochs": 2, "batch_size": 64, "verbose": 0}


def test_cross_val_score_matches_the_plain_wrapper_and_disposes_each_fold():
    x, y = digits()
    plain_build, build = Recorder(), Recorder()
    keras.utils.set_random_seed(0)
    plain = model_selection.cross_val_score(SKLearnClassifier(plain_build), x, y, cv=3, params=FIT)
    with lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SESSION_CLOSE) as session:
        keras.utils.set_random_seed(0)
        scores = model_selection.cross_val_score(
            ManagedSKLearnClassifier(build), x, y, cv=3, params=FIT
        )
        # Disposed as each fold's clone was dropped, before the session closes.
        assert len(build.models) == 3 and all(released(m) for m in build.models)
    np.testing.assert_array_equal(scores, plain)
    assert session.statistics().models_disposed == 3
    assert session.statistics().models_cleaned == 0


@pytest.mark.slow
def test_grid_search_matches_the_plain_wrapper_and_keeps_only_the_refit_model():
    x, y = digits()
    grid = {"model_kwargs": [{"units": 8}, {"units": 32}]}
    plain_build, build = Recorder(), Recorder()
    keras.utils.set_random_seed(1)
    plain = model_selection.GridSearchCV(SKLearnClassifier(plain_build), grid, cv=2).fit(
        x, y, **FIT
    )
    keras.utils.set_random_seed(1)
    search = model_selection.GridSearchCV(ManagedSKLearnClassifier(build), grid, cv=2)
    search.fit(x, y, **FIT)
    np.testing.assert_array_equal(
        search.cv_results_["mean_test_score"], plain.cv_results_["mean_test_score"]
    )
    assert search.best_params_ == plain.best_params_
    # 2 candidates x 2 folds, disposed; the refit best model is the search's.
    *folds, best = build.models
    assert len(folds) == 4 and all(released(m) for m in folds)
    assert search.best_estimator_.model_ is best and best.state is lc.ModelState.LIVE
    np.testing.assert_array_equal(search.predict(x[:20]), plain.predict(x[:20]))
    del search
    assert best.state is lc.ModelState.DISPOSED  # the search let go of it


def test_clone_keeps_every_parameter():
    build = Recorder()
    estimator = ManagedSKLearnClassifier(build, model_kwargs={"units": 8}, fit_kwargs=FIT)
    copy = sklearn_base.clone(estimator)
    assert type(copy) is ManagedSKLearnClassifier and copy is not estimator
    assert copy.get_params() == estimator.get_params()
    # Keras 3.15's own clone drops fit_kwargs; ours copies it.
    assert copy.fit_kwargs == FIT and copy.fit_kwargs is not estimator.fit_kwargs
    assert copy.set_params(model_kwargs={"units": 4}).model_kwargs == {"units": 4}


def test_refit_dispose_and_fit_leave_parameters_and_the_right_models():
    x, y = digits(64)
    build = Recorder()
    fit_kwargs = {"verbose": 0}
    estimator = ManagedSKLearnClassifier(build, fit_kwargs=fit_kwargs)
    estimator.fit(x, y, epochs=1)
    assert fit_kwargs == {"verbose": 0}  # not {"verbose": 0, "epochs": 1}
    first = estimator.model_
    assert isinstance(first, lc.ManagedModel) and first.state is lc.ModelState.LIVE
    estimator.fit(x, y, epochs=1)
    assert released(first) and estimator.model_ is build.models[1]
    report = estimator.dispose()
    assert released(build.models[1]) and report.bytes_released > 0
    with pytest.raises(AttributeError, match="not fitted, or its model was disposed"):
        estimator.model_  # noqa: B018
    assert estimator.dispose() is None


def test_a_pickled_copy_owns_a_managed_model_of_its_own():
    x, y = digits(64)
    estimator = ManagedSKLearnRegressor(
        Recorder(regression=True), fit_kwargs={"epochs": 1, "verbose": 0}
    )
    estimator.fit(x, (y == 3).astype("float32"))
    copy = pickle.loads(pickle.dumps(estimator))
    assert copy.model_ is not estimator.model_
    assert isinstance(copy.model_, lc.ManagedModel)
    np.testing.assert_array_equal(copy.predict(x[:5]), estimator.predict(x[:5]))
    original = estimator.model_
    del estimator
    assert original.state is lc.ModelState.DISPOSED
    assert copy.model_.state is lc.ModelState.LIVE
    copy.dispose()


def test_an_estimator_found_by_a_collection_is_disposed_by_the_cleaner():
    x, y = digits(64)
    with lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SESSION_CLOSE) as session:
        estimator = ManagedSKLearnClassifier(Recorder(), fit_kwargs={"epochs": 1, "verbose": 0})
        estimator.fit(x, y)
        model = estimator.model_
        estimator.cycle = estimator  # only a collection can find it now
        del estimator
        gc.collect()
        # Inside the collection the disposal was only queued: on this
        # strategy it runs when the session closes.
        assert model.state is lc.ModelState.LIVE
    assert released(model)
    assert session.statistics().models_disposed == 1 and session.statistics().models_cleaned == 0


def test_the_mixin_manages_any_wrapper_that_keeps_model_():
    class Plain(sklearn_base.BaseEstimator):
        def __init__(self, units=4):
            self.units = units

        def fit(self, X, y):
            self.model_ = keras.Sequential([keras.Input((X.shape[1],)), keras.layers.Dense(1)])
            return self

    class Managed(ManagedEstimator, Plain):
        pass

    estimator = Managed(units=2).fit(np.ones((2, 3)), None)
    model = estimator.model_
    assert isinstance(model, lc.ManagedModel) and estimator.get_params() == {"units": 2}
    del estimator
    assert released(model)


@pytest.mark.subprocess
@pytest.mark.slow  # cross_val_score stays in the fast lane
def test_scikeras_replaces_keras_pickling_and_the_self_check_says_so(run_child):
    # scikeras (no longer maintained; the docs say why the managed classes build on
    # Keras's own wrappers) replaces keras.Model's pickling for the whole process when
    # imported. Managing a model after that is refused with a clear error, not run on
    # an internal that moved. A child process, since the import changes the process.
    out = run_child(
        """
        import keras
        import scikeras.wrappers  # noqa: F401

        import lifecycle as lc

        try:
            lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
        except lc.CompatibilityError as error:
            print("refused:", error)
        """
    )
    assert "refused: keras-lifecycle cannot work with" in out
    assert "pickling" in out and "unpack_keras_model" in out  # scikeras's function


def test_worker_threads_dispose_the_models_they_fitted():
    import joblib

    x, y = digits(128)
    build = Recorder()
    with joblib.parallel_backend("threading", n_jobs=2):
        scores = model_selection.cross_val_score(
            ManagedSKLearnClassifier(build), x, y, cv=2, params=FIT, n_jobs=2
        )
    assert scores.shape == (2,) and len(build.models) == 2
    # A fold's clone dropped while a collection runs (in any thread) is disposed
    # by the session's cleaner thread, a moment later.
    wait_until(lambda: all(released(m) for m in build.models), "both folds' models disposed")


# A fresh interpreter on the user's path (no collection of ours during the sweep):
# 23 fits, the largest models first, with LIFECYCLE_ALLOCATOR=system.
SWEEP_CHILD = """
import gc, json
import keras, numpy as np
import lifecycle as lc
from lifecycle._core import all_cleaners
from lifecycle.integrations.sklearn import ManagedSKLearnClassifier
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, cross_val_score

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

samples = []

def build(X, y, units=64):
    samples.append(rss_mib())  # after the previous fit's model was disposed
    model = keras.Sequential([
        keras.Input((X.shape[1],)),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(y.shape[1], activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    return model

def classifier(**kwargs):
    return ManagedSKLearnClassifier(build, fit_kwargs={"epochs": 2, "verbose": 0}, **kwargs)

keras.config.disable_interactive_logging()
x, y = load_digits(return_X_y=True)
x = (x / 16).astype("float32")
before = lc.statistics()
cross_val_score(classifier(model_kwargs={"units": 1024}), x, y, cv=5)
grid = {"model_kwargs": [{"units": units} for units in (1024, 512, 256, 128)]}
search = GridSearchCV(classifier(), grid, cv=3).fit(x, y)
del search
cross_val_score(classifier(model_kwargs={"units": 256}), x, y, cv=5)
samples.append(rss_mib())
for cleaner in all_cleaners():
    assert cleaner.wait_idle(60)
after = lc.statistics()
gc.collect()
collected = lc.statistics()
print("RESULT", json.dumps({
    "samples": samples,
    "slope": float(np.polyfit(range(len(samples) - 6), samples[6:], 1)[0]),
    "graphs": [before.live_traced_graphs, after.live_traced_graphs, collected.live_traced_graphs],
    "entries": [before.gradient_registry_entries, after.gradient_registry_entries],
    "collections": after.collections, "live": after.live_models,
}))
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_sweep_leaves_no_traced_graph_held_and_its_memory_flat(run_child):
    import json

    output = run_child(SWEEP_CHILD, env={"LIFECYCLE_ALLOCATOR": "system"}, timeout=600)
    result = json.loads(output.split("RESULT", 1)[1])
    assert len(result["samples"]) == 24 and result["live"] == 0, result  # 23 fits, all disposed
    before, after, collected = result["graphs"]
    # Nothing holds a disposed model's traced graphs: they are reference cycles, and
    # one collection frees every one of them.
    assert collected <= before, result["graphs"]
    # Without it, at most the graphs of the step functions since the last collection
    # wait (8 at the default threshold, about 30 graphs each): measured 58.
    assert after - before < 8 * 30, result["graphs"]
    assert result["entries"][1] <= result["entries"][0], result["entries"]
    # The cleaner collects them as they pile up (each step function let go counts as
    # pressure), so the sweep stays flat. Measured: 5 collections, 0.36 MiB per fit
    # after the first 6; without the step functions' pressure 0 collections and 1.53
    # MiB per fit (2.2-2.7 before, with Keras's default allocator).
    assert result["collections"] >= 2, result["collections"]
    assert result["slope"] < 1.0, f"RSS grew {result['slope']:.2f} MiB per fit"
