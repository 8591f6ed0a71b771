from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import keras
import pytest
import tensorflow as tf
from support.models import X, constant

import lifecycle as lc
from lifecycle import errors


def test_every_error_derives_from_the_root_and_a_builtin():
    expected = {
        lc.ClosedError: RuntimeError,
        lc.DisposedError: RuntimeError,
        lc.DisposeInProgressError: RuntimeError,
        lc.DrainTimeoutError: TimeoutError,
        lc.NotAModelError: TypeError,
        lc.CompatibilityError: RuntimeError,
        lc.UnknownModelError: LookupError,
        lc.LoadError: RuntimeError,
        lc.BudgetExceededError: MemoryError,
        lc.UnavailableError: TimeoutError,
        lc.QueueFullError: RuntimeError,
        lc.CheckpointError: RuntimeError,
        lc.CoordinationError: TimeoutError,
    }
    assert set(expected) | {lc.LifecycleError} == {getattr(errors, name) for name in errors.__all__}
    for error, builtin in expected.items():
        assert issubclass(error, lc.LifecycleError) and issubclass(error, builtin)


@pytest.mark.parametrize(
    ("call", "builtin"),
    [
        (lambda: lc.LifecycleSession(close_timeout=-1), ValueError),
        (lambda: lc.LifecycleSession(cleanup="in_background"), TypeError),
        (lambda: lc.ModelRegistry(loader_gil_share=2), ValueError),
    ],
)
def test_bad_arguments_raise_plain_builtins_as_the_module_says(call, builtin):
    with pytest.raises(builtin) as caught:
        call()
    assert type(caught.value) is builtin and not isinstance(caught.value, lc.LifecycleError)
    assert "plain built-in ``ValueError`` or ``TypeError``" in " ".join(errors.__doc__.split())


def test_drain_timeout_error_carries_the_count():
    error = lc.DrainTimeoutError("3 calls", in_flight=3)
    assert error.in_flight == 3 and "3 calls" in str(error)


def test_checkpoint_error_carries_what_did_not_match():
    error = lc.CheckpointError("no", path="/ckpt-3", missing=("a",), unexpected=("b",))
    assert (error.path, error.missing, error.unexpected) == ("/ckpt-3", ("a",), ("b",))


def test_disposed_error_is_the_closed_error_of_a_model_and_the_tree_says_so():
    assert lc.DisposedError.__mro__[1] is lc.ClosedError
    assert lc.errors.ClosedError is lc.ClosedError
    tree = errors.__doc__
    assert "├── ClosedError(RuntimeError)" in tree
    assert "│   └── DisposedError" in tree


# Each returns a call that uses a closed thing (in tmp_path if it writes files).


def closed_session(tmp_path: Path) -> Callable[[], object]:
    with lc.LifecycleSession(name="day-3") as session:
        pass
    return session.activate().__enter__


def closed_session_entered_again(tmp_path: Path) -> Callable[[], object]:
    with lc.LifecycleSession(name="day-4") as session:
        pass
    return session.__enter__


def closed_registry(tmp_path: Path) -> Callable[[], object]:
    registry = lc.ModelRegistry(name="scores")
    registry.load("risk", 1, constant(1.0))
    registry.close()
    return lambda: registry.predict("risk", X)


def returned_lease(tmp_path: Path) -> Callable[[], object]:
    registry = lc.ModelRegistry(name="leases")
    registry.load("risk", 1, constant(1.0, input_name="x"))
    with registry.serving("risk") as lease:
        assert lease.infer({"x": X}).outputs  # held: it runs
    registry.close()
    return lambda: lease.infer({"x": X})


def closed_keeper(tmp_path: Path) -> Callable[[], object]:
    model = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
    keeper = model.checkpoints(tmp_path / "ckpts")
    keeper.close()
    return keeper.save


def closed_keepers_step(tmp_path: Path) -> Callable[[], object]:
    model = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
    keeper = model.checkpoints(tmp_path / "ckpts")
    keeper.save()
    model.dispose()  # closes its keepers, releasing their step counters
    return lambda: keeper.step


def disposed_model(tmp_path: Path) -> Callable[[], object]:
    model = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)], name="scorer"))
    model.dispose()
    return lambda: model.predict(X, verbose=0)


def disposed_module(tmp_path: Path) -> Callable[[], object]:
    class Scale(tf.Module):
        def __init__(self) -> None:
            super().__init__(name="scale")
            self.w = tf.Variable(2.0)

    module = lc.manage(Scale())
    module.dispose()
    return lambda: module.w


def model_of_a_closed_session(tmp_path: Path) -> Callable[[], object]:
    with lc.LifecycleSession(name="trial-7"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)], name="plain")
    return lambda: model.predict(X, verbose=0)


@pytest.mark.parametrize(
    ("use", "error", "message"),
    [
        (
            closed_session,
            lc.ClosedError,
            r"LifecycleSession 'day-3' is closed and cannot be activated",
        ),
        (closed_session_entered_again, lc.ClosedError, r"'day-4' is closed and cannot be entered"),
        (closed_registry, lc.ClosedError, r"ModelRegistry 'scores' is closed.*new ModelRegistry"),
        (returned_lease, lc.ClosedError, r"lease of 'risk' version 1 was returned.*take a new one"),
        (closed_keeper, lc.ClosedError, r"checkpoint keeper of '.*ckpts' is closed.*new one"),
        (closed_keepers_step, lc.ClosedError, r"keeper of '.*ckpts' is closed \(its model was"),
        (disposed_model, lc.DisposedError, r"'scorer' has been disposed.*`predict` cannot run"),
        (disposed_module, lc.DisposedError, r"'scale' has been disposed.*`w` cannot run"),
        (
            model_of_a_closed_session,
            lc.DisposedError,
            r"'plain' was built in LifecycleSession 'trial-7'",
        ),
    ],
)
def test_every_closed_thing_raises_closed_error_naming_it(use, error, message, tmp_path):
    call = use(tmp_path)
    with pytest.raises(lc.ClosedError, match=message) as caught:
        call()
    # One type per situation: ClosedError itself, or DisposedError for a disposed model.
    assert type(caught.value) is error
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, lc.LifecycleError)
