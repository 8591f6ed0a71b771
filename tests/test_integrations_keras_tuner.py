"""KerasTuner: a managed tuner disposes every model of a trial, and changes no result."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from support.tuning import Recorder, digits, search

import lifecycle as lc

kt = pytest.importorskip("keras_tuner")

from lifecycle.integrations.keras_tuner import (  # noqa: E402 (after the skip)
    ManagedTuner,
    TunerStatistics,
    managed_tuner,
)

# Keras 3 warns when KerasTuner loads a trial's checkpoint (get_best_models(),
# Hyperband's later rounds) into a model whose optimizer is not built yet: the
# weights load, the optimizer's state does not. Plain KerasTuner does the same.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Skipping variable loading for optimizer:UserWarning"
)


def released(model: keras.Model) -> bool:
    return all(tuple(v.numpy().shape) == (0,) for v in model.weights)


def test_every_model_of_the_search_is_disposed_and_none_is_cleaned(tmp_path):
    build = Recorder()
    with lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SESSION_CLOSE) as session:
        tuner = search(managed_tuner(kt.RandomSearch), tmp_path, build)
        # The constructor's search-space model and one per trial.
        assert len(build.models) == 3
        assert [m.state for m in build.models] == [lc.ModelState.DISPOSED] * 3
        assert all(released(m) for m in build.models)
        stats = tuner.lifecycle_statistics()
        assert stats.models_built == stats.models_disposed == 3 and stats.models_live == 0
        assert stats.bytes_released == sum(m.dispose().bytes_released for m in build.models) > 0
        assert len(tuner.oracle.get_best_trials(2)) == 2
    # Disposed by the tuner, not cleaned after by the safety net (no ResourceWarning).
    assert session.statistics().models_disposed == 3
    assert session.statistics().models_cleaned == 0


@pytest.mark.slow
def test_results_and_best_models_match_plain_keras_tuner(tmp_path):
    plain_build, managed_build = Recorder(), Recorder()
    plain = search(kt.RandomSearch, tmp_path / "plain", plain_build)
    managed = search(managed_tuner(kt.RandomSearch), tmp_path / "managed", managed_build)
    for a, b in zip(
        plain.oracle.get_best_trials(2), managed.oracle.get_best_trials(2), strict=True
    ):
        assert a.hyperparameters.values == b.hyperparameters.values
        assert a.score == b.score
    x, _ = digits(20)
    (best_plain,) = plain.get_best_models(1)
    (best,) = managed.get_best_models(1)
    # Rebuilt from the trial's checkpoint, after that trial's model was disposed;
    # yours: live and managed.
    assert best.state is lc.ModelState.LIVE and best is managed_build.models[-1]
    np.testing.assert_array_equal(best.predict(x, verbose=0), best_plain.predict(x, verbose=0))
    stats = managed.lifecycle_statistics()
    assert isinstance(stats, TunerStatistics)
    assert (stats.models_built, stats.models_disposed, stats.models_live) == (4, 3, 0)
    best.dispose()


def test_a_failed_trial_and_an_interrupted_search_dispose_their_models(tmp_path):
    build = Recorder()
    fits: list[keras.Model] = []

    class Interrupted(kt.HyperModel):
        def build(self, hp):
            return build(hp)

        def fit(self, hp, model, *args, **kwargs):
            fits.append(model)
            if len(fits) == 1:
                raise ValueError("a failed trial")  # the tuner marks it and goes on
            raise kt.errors.FatalError("stop the search")

    tuner = managed_tuner(kt.RandomSearch)(
        Interrupted(), objective="val_loss", max_trials=4, directory=str(tmp_path)
    )
    x, y = digits(64)
    with pytest.raises(kt.errors.FatalError, match="stop the search"):
        tuner.search(x, y, validation_split=0.25, epochs=1, verbose=0)
    assert len(build.models) == 3  # the constructor's, the failed trial's, the fatal one's
    assert all(m.state is lc.ModelState.DISPOSED for m in build.models)


@pytest.mark.slow
def test_hyperband_reloads_checkpoints_of_disposed_trials(tmp_path):
    # Hyperband's later rounds load the checkpoint of an earlier trial, whose
    # model is long disposed: the checkpoint was written before the disposal.
    build = Recorder()
    keras.utils.set_random_seed(0)
    tuner = managed_tuner(kt.Hyperband)(
        build, objective="val_accuracy", max_epochs=2, factor=2, seed=0, directory=str(tmp_path)
    )
    x, y = digits()
    tuner.search(x, y, validation_split=0.25, batch_size=64, verbose=0)
    continued = [t for t in tuner.oracle.trials.values() if "tuner/trial_id" in t.hyperparameters]
    statuses = [t.status for t in tuner.oracle.trials.values()]
    assert continued and set(statuses) == {"COMPLETED"}, statuses
    assert len(build.models) == 1 + len(tuner.oracle.trials)
    assert all(m.state is lc.ModelState.DISPOSED for m in build.models)


def test_the_hypermodel_view_keeps_the_users_hypermodel(tmp_path):
    class Space(kt.HyperModel):
        note = "mine"

        def build(self, hp):
            return Recorder()(hp)

    space = Space(name="space")

    class Search(ManagedTuner, kt.RandomSearch):
        pass

    tuner = Search(space, objective="val_loss", max_trials=1, directory=str(tmp_path))
    assert tuner.hypermodel.wrapped is space
    assert (tuner.hypermodel.note, tuner.hypermodel.name) == ("mine", "space")
    # Built outside a trial: managed, and the caller's to dispose.
    model = tuner.hypermodel.build(tuner.oracle.get_space())
    assert isinstance(model, lc.ManagedModel) and model.state is lc.ModelState.LIVE
    assert tuner.lifecycle_statistics().models_live == 0
    model.dispose()


def test_managed_tuner_makes_one_class_per_tuner_and_refuses_others():
    managed = managed_tuner(kt.BayesianOptimization)
    assert managed is managed_tuner(kt.BayesianOptimization)
    assert managed_tuner(managed) is managed
    assert issubclass(managed, ManagedTuner) and issubclass(managed, kt.BayesianOptimization)
    assert managed.__name__ == "ManagedBayesianOptimization"
    with pytest.raises(
        TypeError, match=r"takes a KerasTuner tuner class.*Received: <class 'dict'>"
    ):
        managed_tuner(dict)
    with pytest.raises(TypeError, match="Received: <keras_tuner"):
        managed_tuner(kt.HyperParameters())


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_first_managed_search_in_a_process_matches_plain(run_child):
    # In a fresh process the first management runs the compatibility self-check,
    # which builds a Keras model; the sweep's random sequences must not move.
    out = run_child(
        """
        import sys, tempfile
        import lifecycle, lifecycle.integrations
        assert "keras_tuner" not in sys.modules, "importing lifecycle imported keras_tuner"
        assert "lifecycle.integrations.sklearn" not in sys.modules
        import keras_tuner as kt
        from tests.support.tuning import Recorder, search
        from lifecycle.integrations.keras_tuner import managed_tuner
        with tempfile.TemporaryDirectory() as directory:
            for tuner_class in (managed_tuner(kt.RandomSearch), kt.RandomSearch):
                tuner = search(tuner_class, f"{directory}/{tuner_class.__name__}", Recorder())
                for trial in tuner.oracle.get_best_trials(2):
                    print(tuner_class.__name__, trial.hyperparameters.values, trial.score)
        """,
        timeout=300,
    )
    managed = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("Managed")]
    plain = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("RandomSearch")]
    assert len(managed) == 2 and managed == plain, out


def notebook_cell() -> str:
    """The notebook cell of docs/sweeps.md."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "sweeps.md").read_text()
    section = doc.split("## Notebooks that re-run cells", 1)[1]
    found = re.search(r"^```python\n(.*?)^```$", section, re.M | re.S)
    assert found, "docs/sweeps.md has no notebook cell"
    return found[1]


@pytest.mark.slow
def test_the_notebook_cell_run_twice_disposes_its_first_run(tmp_path):
    x, y = digits(128)
    namespace = {
        "lc": lc,
        "kt": kt,
        "managed_tuner": managed_tuner,
        "build_model": Recorder(),
        "x": x,
        "y": y,
        "workdir": str(tmp_path),
    }
    code = compile(notebook_cell(), "docs/sweeps.md", "exec")
    exec(code, namespace)
    first = namespace["best"]
    assert first.state is lc.ModelState.LIVE
    exec(code, namespace)
    assert released(first) and namespace["best"].state is lc.ModelState.LIVE
    assert namespace["tuner"].lifecycle_statistics().models_disposed == 4
    namespace["cell"].close()
    assert released(namespace["best"])


def build_unrecorded(hp):
    """Recorder's model, kept by nobody but KerasTuner."""
    return Recorder()(hp)


def test_a_plain_search_inside_a_session_keeps_one_trials_buffers_at_most(tmp_path):
    # KerasTuner as it ships: clear_session() and gc.collect() at each trial's start,
    # which leave every trial's buffers pinned. Inside a session, what that collection
    # finds dropped is freed.
    with lc.LifecycleSession() as session:
        tuner = search(kt.RandomSearch, tmp_path, build_unrecorded, trials=4)
        assert session.cleaner.wait_idle(30)
        stats = session.statistics()
        (best,) = tuner.get_best_models(1)
        session.hand_out(best)
    # One trial's buffers at most (4 weights, Adam's iteration count, learning rate and 8
    # slots, the loss's and the accuracy's totals and counts): the last trial's, which
    # KerasTuner still holds. The constructor's model and the first three trials' freed.
    assert stats.variables <= 18 and stats.plain_models <= 1, stats
    assert stats.variables_released >= 3 * 4 * 3, stats
    x, _ = digits(4)
    assert best.predict(x, verbose=0).shape == (4, 10)  # handed out: it survived the close
