"""ManagedModel and manage(): construction, dispose, guarded entry points."""

from __future__ import annotations

import threading
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf
from support.waits import joined, wait_until

import lifecycle as lc
from lifecycle import _tf
from lifecycle._disposal import Managed

pytestmark = pytest.mark.usefixtures("keras_state")

X = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
Y = np.random.default_rng(1).normal(size=(64, 4)).astype("float32")


def functional(cls=lc.ManagedModel, **kwargs):
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.1)(hidden)
    return cls(inputs, keras.layers.Dense(4)(hidden), **kwargs)


class Subclassed(lc.ManagedModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(4)

    def call(self, x):
        return self.out(self.hidden(x))


def fitted(model):
    """``model`` compiled and fit for one epoch."""
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    model.fit(X, Y, epochs=1, batch_size=16, verbose=0)
    return model


def read_shape(variable):
    return tuple(variable.numpy().shape)


# --- construction -----------------------------------------------------------


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # throwaway models, never disposed
def test_both_construction_styles_work_in_any_order():
    bases = lc.ManagedModel.__bases__

    class First(lc.ManagedModel):
        def call(self, x):
            return x * 2.0

    assert First()(np.ones((1, 2))).shape == (1, 2)
    assert isinstance(functional(), keras.Model)

    class Second(lc.ManagedModel):
        def call(self, x):
            return x * 3.0

    assert float(Second()(np.ones((1, 1)))[0, 0]) == 3.0
    assert isinstance(functional(), lc.ManagedModel)
    assert Subclassed()(X[:2]).shape == (2, 4)
    # Keras never rewrote them (its functional construction would put Functional in).
    assert lc.ManagedModel.__bases__ == bases == (Managed, keras.Model)


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # throwaway models, never disposed
def test_functional_subclass_of_managed_model():
    class Net(lc.ManagedModel):
        pass

    model = functional(Net)
    assert isinstance(model, Net) and model(X[:3]).shape == (3, 4)

    class Later(Net):
        def call(self, x):
            return x

    assert Later()(X[:1]).shape == (1, 8)


def test_compile_fit_evaluate_predict_save_load_unchanged(tmp_path):
    model = fitted(functional())
    loss, mae = model.evaluate(X, Y, verbose=0)
    assert np.isfinite(loss) and np.isfinite(mae)
    predictions = model.predict(X, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, lc.ManagedModel)
    np.testing.assert_allclose(loaded.predict(X, verbose=0), predictions, rtol=1e-5, atol=1e-5)
    loaded.dispose()
    model.dispose()


def test_subclassed_model_trains_and_disposes():
    model = fitted(Subclassed())
    owned = (model.owned_bytes, model.owned_variables)
    kernel = model.hidden.kernel
    report = model.dispose()
    assert (report.bytes_released, report.variables_released) == owned
    assert owned[0] > 0 and read_shape(kernel) == (0,)


# --- dispose ----------------------------------------------------------------


def test_dispose_releases_weights_slots_and_metrics_despite_stray_references():
    model = fitted(functional())
    kernel = model.layers[1].kernel
    slots = [v for v in model.optimizer.variables if v.shape == kernel.shape]
    metric_variables = list(model.metrics_variables)
    seed_states = [v for v in model.variables if "seed" in v.path]
    assert len(slots) == 2 and metric_variables and seed_states
    expected_bytes, expected_count = model.owned_bytes, model.owned_variables

    report = model.dispose()

    assert report.bytes_released == expected_bytes > 0
    assert report.variables_released == expected_count
    for variable in [kernel, *slots, *metric_variables, *seed_states]:
        assert read_shape(variable) == (0,), variable.path
    assert model.state is lc.ModelState.DISPOSED
    assert model.owned_bytes == 0 and model.owned_variables == 0


def test_dispose_is_idempotent_and_returns_the_same_report():
    model = fitted(functional())
    first = model.dispose()
    assert model.dispose() is first
    assert first.registry_entries_purged >= 1
    assert first.total_seconds >= first.release_seconds > 0


def train_step_ref(model):
    """A weak reference to the model's traced training step (a ``tf.function``)."""
    return weakref.ref(model.train_function)


@pytest.mark.parametrize(
    ("strategy", "collect"),
    [
        (lc.CleanupStrategy.ON_SAFE_POINTS, None),
        (lc.CleanupStrategy.ON_SESSION_CLOSE, None),
        (lc.CleanupStrategy.IN_BACKGROUND, True),
    ],
)
def test_dispose_drops_the_traced_step_at_once_without_a_cleaner_thread(strategy, collect):
    with lc.LifecycleSession(cleanup=strategy):
        model = fitted(functional())
        step = train_step_ref(model)
        model.dispose(collect=collect)
        assert model.train_function is None and model.optimizer is None
        assert step() is None  # no reference left anywhere, now


def test_dispose_leaves_destroying_the_traced_step_to_the_cleaner_thread():
    with lc.LifecycleSession(cleanup=lc.CleanupStrategy.IN_BACKGROUND) as session:
        model = fitted(functional())
        step = train_step_ref(model)
        model.dispose()
        assert model.train_function is None and model.optimizer is None
        assert session.cleaner.wait_idle(30)
        assert step() is None


def test_with_block_disposes_on_exit():
    model = functional()
    with model as entered:
        assert entered is model and model.state is lc.ModelState.LIVE
        model(X[:1])
    assert model.state is lc.ModelState.DISPOSED
    with pytest.raises(lc.DisposedError, match="has been disposed"), model:
        pass


def test_dispose_of_a_model_never_built_releases_nothing():
    model = Subclassed()
    report = model.dispose()
    assert (report.bytes_released, report.variables_released) == (0, 0)
    assert model.state is lc.ModelState.DISPOSED


def test_dispose_purges_only_this_models_registry_entries():
    a, b = fitted(functional()), fitted(functional())
    before = _tf.custom_gradient_entries()
    assert before >= 2
    purged = a.dispose().registry_entries_purged
    assert 1 <= purged < before
    assert _tf.custom_gradient_entries() == before - purged
    b.dispose()


def test_other_model_keeps_training_and_differentiating_after_dispose():
    a, b = fitted(functional()), fitted(functional())

    @tf.function
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((b(x, training=True) - y) ** 2)
        return tape.gradient(loss, b.trainable_variables)

    before = gradients(X, Y)
    a.dispose()
    after = gradients(X, Y)
    assert all(g is not None for g in after) and len(after) == len(before)
    weights = [w.numpy().copy() for w in b.trainable_weights]
    history = b.fit(X, Y, epochs=2, batch_size=16, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert any(
        not np.allclose(w, v.numpy()) for w, v in zip(weights, b.trainable_weights, strict=True)
    )
    b.dispose()


# --- entry points after dispose -------------------------------------------------


ENTRY_POINTS = {
    "__call__": lambda m, p: m(X[:2]),
    "fit": lambda m, p: m.fit(X, Y, verbose=0),
    "evaluate": lambda m, p: m.evaluate(X, Y, verbose=0),
    "predict": lambda m, p: m.predict(X, verbose=0),
    "train_on_batch": lambda m, p: m.train_on_batch(X, Y),
    "test_on_batch": lambda m, p: m.test_on_batch(X, Y),
    "predict_on_batch": lambda m, p: m.predict_on_batch(X),
    "save": lambda m, p: m.save(p / "m.keras"),
    "save_weights": lambda m, p: m.save_weights(p / "m.weights.h5"),
    "load_weights": lambda m, p: m.load_weights(p / "m.weights.h5"),
    "get_weights": lambda m, p: m.get_weights(),
    "set_weights": lambda m, p: m.set_weights([]),
    "compile": lambda m, p: m.compile(optimizer="sgd", loss="mse"),
}


@pytest.mark.parametrize("entry_point", sorted(ENTRY_POINTS))
def test_every_entry_point_raises_disposed_error_naming_the_model(entry_point, tmp_path):
    model = fitted(functional(name="risk_model"))
    model.save_weights(tmp_path / "m.weights.h5")
    model.dispose()
    with pytest.raises(lc.DisposedError, match=r"'risk_model' has been disposed.*new model"):
        ENTRY_POINTS[entry_point](model, tmp_path)


def test_the_guarded_entry_points_are_those_the_self_check_looks_up():
    from lifecycle import _model

    assert set(_model._ENTRY_POINTS) == set(_tf.keras_internals.ENTRY_POINTS)
    for name in _tf.keras_internals.ENTRY_POINTS:
        guarded = vars(lc.ManagedModel)[name]
        assert guarded.__wrapped__ is getattr(keras.Model, name), name
        assert guarded.__doc__.startswith(f"Guarded ``keras.Model.{name}``"), name


# --- manage() ---------------------------------------------------------------------


class PlainSubclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(4)

    def call(self, x):
        return self.dense(x)


MANAGEABLE = {
    "sequential": lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)]),
    "functional": lambda: functional(keras.Model),
    "subclassed": PlainSubclassed,
    # A small keras.applications model: depthwise convolutions and batch-norm
    # statistics in 91 layers, fewer to trace in fit() than MobileNetV2's 156.
    "application": lambda: keras.applications.MobileNet(
        weights=None, input_shape=(32, 32, 3), classes=4, alpha=0.25
    ),
}


@pytest.mark.parametrize(
    "kind",
    [
        # MobileNet takes 10-20 s to build and train on 2 cores.
        pytest.param(kind, marks=pytest.mark.slow) if kind == "application" else kind
        for kind in sorted(MANAGEABLE)
    ],
)
def test_manage_puts_any_model_under_management_in_place(kind, tmp_path):
    model = MANAGEABLE[kind]()
    original_class = type(model)
    shape = (2, *model.input_shape[1:]) if kind != "subclassed" else (2, 8)
    data = np.ones(shape, "float32")
    model.compile(optimizer="adam", loss="mse")
    model.fit(data, model(data), verbose=0)

    managed = lc.manage(model)

    assert managed is model and isinstance(model, original_class)
    assert isinstance(model, lc.ManagedModel) and type(model).__name__ == original_class.__name__
    assert lc.manage(model) is model
    if kind in ("sequential", "functional"):
        model.save(tmp_path / "m.keras")
        reloaded = keras.models.load_model(tmp_path / "m.keras")
        assert type(reloaded) is original_class
    kernel = model.trainable_weights[0]
    report = model.dispose()
    assert report.bytes_released > 0 and read_shape(kernel) == (0,)
    with pytest.raises(lc.DisposedError, match="has been disposed"):
        model(data)


@pytest.mark.parametrize("not_a_model", [None, "model", keras.layers.Dense(3), object()])
def test_manage_rejects_what_is_not_a_keras_model(not_a_model):
    with pytest.raises(lc.NotAModelError, match=r"manage\(\) takes a keras.Model.*Received"):
        lc.manage(not_a_model)


@pytest.mark.parametrize("timeout", [-1, "1", True])
def test_bad_timeouts_are_rejected_and_change_nothing(timeout):
    model = functional()
    with pytest.raises(ValueError, match="`timeout` must be a number"):
        model.dispose(timeout=timeout)
    with pytest.raises(ValueError, match="Received: dispose_timeout="):
        lc.manage(keras.Sequential([keras.Input((2,))]), dispose_timeout=timeout)
    assert model.state is lc.ModelState.LIVE
    model.dispose()


# --- dispose while calls are in flight ---------------------------------------------


def test_dispose_from_inside_own_call_fails_clearly_without_deadlock():
    model = functional()
    model.compile(optimizer="sgd", loss="mse")
    seen = []

    class DisposeOnEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            try:
                self.model.dispose()
            except lc.DisposeInProgressError as error:
                seen.append(str(error))

    model.fit(X, Y, epochs=1, verbose=0, callbacks=[DisposeOnEpochEnd()])
    assert seen and "from inside a call to the same model" in seen[0]
    assert model.state is lc.ModelState.LIVE
    model.predict(X, verbose=0)
    model.dispose()


class Blocking(lc.ManagedModel):
    """A model whose call blocks until released, to hold a call in flight."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def call(self, x):
        self.entered.set()
        self.release.wait(10)
        return x


def test_drain_timeout_names_calls_in_flight_and_leaves_the_model_live():
    model = Blocking()
    worker = threading.Thread(target=lambda: model(np.ones((1, 2))))
    worker.start()
    assert model.entered.wait(30), "the call did not start"
    with pytest.raises(lc.DrainTimeoutError, match="1 call\\(s\\) still running") as info:
        model.dispose(timeout=0.05)
    assert info.value.in_flight == 1
    assert model.state is lc.ModelState.LIVE
    model.release.set()
    joined(worker)
    assert model(np.ones((1, 2))).shape == (1, 2)
    assert model.dispose().drain_seconds >= 0


def test_dispose_waits_for_a_call_in_flight_and_refuses_new_ones():
    model = Blocking()
    worker = threading.Thread(target=lambda: model(np.ones((1, 2))))
    worker.start()
    assert model.entered.wait(30), "the call did not start"
    disposer = threading.Thread(target=model.dispose)
    disposer.start()
    wait_until(lambda: model.state is lc.ModelState.DISPOSING, "the model disposing")
    with pytest.raises(lc.DisposedError, match="is being disposed"):
        model(np.ones((1, 2)))
    model.release.set()
    joined(worker, disposer)
    assert model.state is lc.ModelState.DISPOSED


# --- serving function -------------------------------------------------------------


def test_serving_function_matches_the_model_and_is_guarded():
    model = functional()
    serve = lc.serving_function(model, tf.TensorSpec([None, 8], tf.float32))
    np.testing.assert_allclose(serve(tf.constant(X)), model(X, training=False), rtol=1e-6)
    model.dispose()
    with pytest.raises(lc.DisposedError, match="its serving function"):
        serve(tf.constant(X))
    with pytest.raises(lc.DisposedError):
        lc.serving_function(model)
    with pytest.raises(TypeError, match=r"lc\.manage"):
        lc.serving_function(keras.Sequential([keras.Input((2,))]))


def counted(monkeypatch, serve):
    """Count the calls that take the serving function's flat fast path."""
    calls = []
    flat = serve._flat

    def counting(tensors):
        calls.append([tuple(tensor.shape) for tensor in tensors])
        return flat(tensors)

    monkeypatch.setattr(serve, "_flat", counting)
    return calls


def test_inputs_that_fit_the_signature_skip_binding_and_give_the_same_answers(monkeypatch):
    model = functional()
    serve = lc.serving_function(model, tf.TensorSpec([None, 8], tf.float32))
    fast = counted(monkeypatch, serve)
    expected = model(X, training=False)
    for fitting in (X, tf.constant(X)):
        np.testing.assert_allclose(serve(fitting), expected, rtol=1e-6)
    assert fast == [[(len(X), 8)]] * 2
    # Anything that needs converting takes TensorFlow's own call, with the same answers.
    for other in (X.astype("float64"), X.tolist()):
        np.testing.assert_allclose(serve(other), expected, rtol=1e-6)
    # And what does not fit gets TensorFlow's errors, as before.
    with pytest.raises(TypeError, match="Binding inputs"):
        serve(np.zeros((1, 3), "float32"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="double"):
        serve(tf.constant(X, tf.float64))
    assert len(fast) == 2
    model.dispose()


def test_the_fast_path_feeds_dict_inputs_in_the_traced_order(monkeypatch):
    wide, narrow = keras.Input((3,), name="wide"), keras.Input((1,), name="narrow", dtype="int32")
    joined = keras.layers.Concatenate()([wide, keras.ops.cast(narrow, "float32")])
    model = lc.manage(keras.Model({"wide": wide, "narrow": narrow}, keras.layers.Dense(2)(joined)))
    specs = {
        "wide": tf.TensorSpec([None, 3], tf.float32),
        "narrow": tf.TensorSpec([None, 1], tf.int32),
    }
    serve = lc.serving_function(model, specs)
    fast = counted(monkeypatch, serve)
    inputs = {"wide": np.ones((2, 3), "float32"), "narrow": np.array([[1], [2]], "int32")}
    np.testing.assert_allclose(serve(inputs), model(inputs, training=False), rtol=1e-6)
    assert fast == [[(2, 1), (2, 3)]]  # tf.nest order: sorted keys
    model.dispose()


@pytest.mark.parametrize(
    ("signature", "bad_shape", "error", "message"),
    [
        (tf.TensorSpec([None, 8], tf.float32), (1, 3), TypeError, "Binding inputs"),
        # No signature: the call traces anew and its trace fails in Keras.
        (None, (3,), ValueError, "in user code"),
    ],
    ids=["signature", "no-signature"],
)
def test_a_call_that_does_not_fit_leaves_the_function_usable_by_other_threads(
    signature, bad_shape, error, message
):
    """A bare tf.function with a signature keeps its lock after such a call (TF 2.21).

    Other threads would then wait forever; the serving function calls the
    signature's concrete function instead. Without a signature the polymorphic
    function's failed trace releases the lock.
    """
    model = functional()
    serve = lc.serving_function(model, signature)
    with pytest.raises(error, match=message):
        serve(np.zeros(bad_shape, "float32"))
    answers = []
    other = threading.Thread(target=lambda: answers.append(serve(tf.constant(X))))
    other.start()
    other.join(timeout=30)
    assert not other.is_alive() and answers[0].shape == (len(X), model.output_shape[-1])
    model.dispose()
