from __future__ import annotations

import pytest

import lifecycle as lc
from lifecycle import errors


def test_every_error_derives_from_the_root_and_a_builtin():
    expected = {
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
