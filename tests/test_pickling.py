"""Managed models pickle, and copy, like the Keras models they are.

Modelled on Keras's own cases (``keras/src/models/functional_test.py``
``test_functional_pickling``, ``sequential_test.py`` ``test_pickleable``): the
copy predicts what the original predicts. A model put under management with
``lc.manage()`` comes back as a plain model of its own class; an instance of a
``ManagedModel`` class comes back managed, by the session current where it is
unpickled.
"""

from __future__ import annotations

import copy
import pickle

import keras
import numpy as np
import pytest

import lifecycle as lc

pytestmark = pytest.mark.usefixtures("keras_state")

X = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")


def two_inputs(cls=keras.Model):
    # functional_test.py _get_model
    input_a = keras.Input(shape=(3,), batch_size=2, name="input_a")
    input_b = keras.Input(shape=(3,), batch_size=2, name="input_b")
    x = keras.layers.Dense(5)(input_a + input_b)
    return cls([input_a, input_b], keras.layers.Dense(4)(x))


def dict_outputs(cls=keras.Model):
    # functional_test.py _get_model_multi_outputs_dict
    x = keras.Input(shape=(3,), name="input_a")
    output_a = keras.layers.Dense(1, name="output_a")(x)
    output_b = keras.layers.Dense(1, name="output_b", activation="sigmoid")(x)
    return cls(x, {"output_a": output_a, "output_b": output_b})


def sequential():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.Dense(4)])


@keras.saving.register_keras_serializable(package="test_pickling")
class Subclassed(lc.ManagedModel):
    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(5)
        self.out = keras.layers.Dense(units)

    def call(self, x):
        return self.out(self.hidden(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def subclassed():
    model = Subclassed(units=4)
    model(X)
    return model


@keras.saving.register_keras_serializable(package="test_pickling")
class FunctionalSubclass(lc.ManagedModel):
    """Built functionally: its instances are of a variant class mixing in Functional."""


def two_inputs_model(model):
    return len(getattr(model, "inputs", None) or ()) == 2


def inputs_for(model):
    return [X[:2], X[2:4]] if two_inputs_model(model) else X


def targets_for(model):
    return np.ones((2 if two_inputs_model(model) else len(X), 4), "float32")


def assert_same_predictions(original, restored):
    data = inputs_for(original)
    expected, got = original.predict(data, verbose=0), restored.predict(data, verbose=0)
    for a, b in zip(keras.tree.flatten(expected), keras.tree.flatten(got), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6)


MANAGED = {
    "manage(Sequential)": lambda: lc.manage(sequential()),
    "manage(functional, two inputs)": lambda: lc.manage(two_inputs()),
    "manage(functional, dict outputs)": lambda: lc.manage(dict_outputs()),
    "ManagedModel(inputs, outputs)": lambda: two_inputs(lc.ManagedModel),
    "ManagedModel(inputs, dict outputs)": lambda: dict_outputs(lc.ManagedModel),
    "subclassed ManagedModel": subclassed,
    "subclassed ManagedModel, built functionally": lambda: dict_outputs(FunctionalSubclass),
}


# Keras warns when it loads a compiled model whose optimizer was never built
# (it was saved with no slots); a plain Keras model does the same.
@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer:UserWarning")
@pytest.mark.parametrize("kind", sorted(MANAGED))
def test_a_managed_model_round_trips_through_pickle(kind):
    model = MANAGED[kind]()
    model.compile()

    restored = pickle.loads(pickle.dumps(model))

    assert restored is not model and type(restored).__name__ == type(model).__name__
    assert isinstance(restored, lc.ManagedModel) == (not kind.startswith("manage("))
    assert_same_predictions(model, restored)
    assert model.state is lc.ModelState.LIVE


@pytest.mark.parametrize("make", [sequential, two_inputs, dict_outputs])
def test_a_model_put_under_management_comes_back_as_a_plain_model_of_its_class(make):
    plain = type(make())  # Sequential or Functional
    model = lc.manage(make())

    restored = pickle.loads(pickle.dumps(model))

    assert type(restored) is plain and not isinstance(restored, lc.ManagedModel)
    assert not hasattr(restored, "_lifecycle")
    assert_same_predictions(model, restored)


@pytest.mark.parametrize("make", [lambda: two_inputs(lc.ManagedModel), subclassed])
def test_a_managed_model_class_comes_back_managed_by_the_current_session(make, session):
    model = make()
    data = pickle.dumps(model)

    with lc.LifecycleSession(name="unpickling") as elsewhere:
        restored = pickle.loads(data)
        assert type(restored).__name__ == type(model).__name__
        assert isinstance(restored, lc.ManagedModel)
        assert restored.session is elsewhere and model.session is session
        assert restored.state is lc.ModelState.LIVE and restored.owned_bytes == model.owned_bytes
        expected = model.predict(inputs_for(model), verbose=0)
        model.dispose()  # the copy owns buffers of its own
        np.testing.assert_allclose(restored.predict(inputs_for(restored), verbose=0), expected)
    assert restored.state is lc.ModelState.DISPOSED  # its session closed


def test_the_unbuilt_sequential_of_keras_pickleable_test():
    # sequential_test.py test_pickleable
    model = lc.manage(keras.Sequential(name="seq"))
    model.add(keras.layers.Dense(4))

    result = pickle.loads(pickle.dumps(model))

    assert len(result.layers) == 1 and result.name == "seq"


@pytest.mark.parametrize("kind", ["manage(Sequential)", "ManagedModel(inputs, outputs)"])
def test_a_compiled_and_fitted_model_keeps_its_training_state(kind):
    model = MANAGED[kind]()
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    data, targets = inputs_for(model), targets_for(model)
    model.fit(data, targets, verbose=0)

    restored = pickle.loads(pickle.dumps(model))

    assert_same_predictions(model, restored)
    assert restored.compiled and type(restored.optimizer) is type(model.optimizer)
    assert int(restored.optimizer.iterations) == int(model.optimizer.iterations) == 1
    before = int(restored.optimizer.iterations)
    restored.fit(data, targets, verbose=0)
    assert int(restored.optimizer.iterations) == before + 1


@pytest.mark.parametrize("copier", [copy.deepcopy, copy.copy], ids=["deepcopy", "copy"])
def test_copies_take_the_same_path(copier):
    managed = lc.manage(sequential())
    declared = two_inputs(lc.ManagedModel)

    plain, fresh = copier(managed), copier(declared)

    assert type(plain) is keras.Sequential and not isinstance(plain, lc.ManagedModel)
    assert isinstance(fresh, lc.ManagedModel) and fresh._lifecycle is not declared._lifecycle
    assert_same_predictions(managed, plain)
    assert_same_predictions(declared, fresh)


@pytest.mark.parametrize("copier", [pickle.dumps, copy.deepcopy], ids=["pickle", "deepcopy"])
@pytest.mark.parametrize("kind", ["manage(Sequential)", "ManagedModel(inputs, outputs)"])
def test_a_disposed_model_refuses_to_be_pickled_or_copied(kind, copier):
    model = MANAGED[kind]()
    model.dispose()

    with pytest.raises(lc.DisposedError, match=r"has been disposed.* pickling or copying it"):
        copier(model)


@pytest.mark.subprocess
@pytest.mark.slow  # in-process pickling stays in the fast lane
def test_another_process_unpickles_without_the_original_session(tmp_path, run_child):
    managed = lc.manage(sequential())
    declared = two_inputs(lc.ManagedModel)
    (tmp_path / "managed.pkl").write_bytes(pickle.dumps(managed))
    (tmp_path / "declared.pkl").write_bytes(pickle.dumps(declared))
    np.save(tmp_path / "expected.npy", managed.predict(X, verbose=0))

    out = run_child(
        f"""
        import pickle, sys
        import numpy as np
        managed = pickle.loads(open({str(tmp_path / "managed.pkl")!r}, "rb").read())
        same = np.allclose(managed.predict(np.asarray({X.tolist()!r}, "float32"), verbose=0),
                           np.load({str(tmp_path / "expected.npy")!r}))
        print(type(managed).__name__, same, "lifecycle" in sys.modules)
        declared = pickle.loads(open({str(tmp_path / "declared.pkl")!r}, "rb").read())
        print(type(declared).__name__, declared.session.name, declared.state.value)
        """
    )

    assert out.splitlines() == ["Sequential True False", "ManagedModel default live"]
