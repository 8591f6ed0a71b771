"""Sessions, the three cleanup strategies, the finalizer safety net, byte pressure."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import ClassVar

import attrs
import keras
import numpy as np
import pytest
import tensorflow as tf
from support.models import trained
from support.waits import collect_until, joined, wait_until

import lifecycle as lc
from lifecycle import _tf

S = lc.CleanupStrategy
X = np.ones((32, 8), "float32")
Y = np.ones((32, 2), "float32")


def drop(model):
    """Drop the last reference; return weak references to the model and one buffer's handle."""
    refs = weakref.ref(model), weakref.ref(model.layers[1].kernel.value.handle)
    return refs


# --- the finalizer safety net, one strategy at a time (deterministic) ---------------


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_in_background_cleans_a_dropped_model_with_no_further_call():
    with lc.LifecycleSession(cleanup=S.IN_BACKGROUND) as session:
        model = trained()
        model_ref, handle_ref = drop(model)
        entries = _tf.custom_gradient_entries()
        del model
        # The collector finds the dropped model (the finalizer does not keep it
        # alive) and its finalizer queues the clean-up.
        collect_until(lambda: model_ref() is None, "the dropped model collected")
        # No call into the library from here on: the cleaner thread does the work.
        wait_until(lambda: _tf.custom_gradient_entries() < entries, "its gradient entries purged")
        collect_until(lambda: handle_ref() is None, "its buffer freed")
        assert session.statistics().models_cleaned == 1


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_on_safe_points_cleans_only_at_a_safe_point():
    with lc.LifecycleSession(cleanup=S.ON_SAFE_POINTS) as session:
        model, other = trained(), trained()
        model_ref, handle_ref = drop(model)
        del model
        collect_until(lambda: model_ref() is None, "the dropped model collected")
        # Its clean-up and the session's sweep of the variables found dead wait.
        assert session.statistics().cleaner.queued == 2
        gc.collect()
        assert handle_ref() is not None  # still pinned: nothing ran
        assert session.statistics().models_cleaned == 0
        other.predict_on_batch(X)  # entering a call of a managed model is a safe point
        assert session.statistics().models_cleaned == 1
        collect_until(lambda: handle_ref() is None, "its buffer freed")


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_on_session_close_cleans_only_at_close():
    session = lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE)
    with session:
        model, other = trained(), trained()
        model_ref, handle_ref = drop(model)
        del model
        collect_until(lambda: model_ref() is None, "the dropped model collected")
        other.predict_on_batch(X)
        session.safe_point()
        trained().dispose()  # creating a model is a safe point too
        gc.collect()
        assert handle_ref() is not None
        assert session.statistics().models_cleaned == 0
    assert session.statistics().models_cleaned == 1
    collect_until(lambda: handle_ref() is None, "its buffer freed")


def test_a_cleaned_model_is_named_in_a_resource_warning():
    session = lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE)
    with session:
        model = trained(name="forgotten_model")
        model_ref = weakref.ref(model)
        del model
        collect_until(lambda: model_ref() is None, "the dropped model collected")
        with pytest.warns(ResourceWarning, match="'forgotten_model' was garbage-collected"):
            session.close()


def test_a_disposed_model_is_not_cleaned_again_and_does_not_warn():
    with lc.LifecycleSession(cleanup=S.ON_SAFE_POINTS) as session:
        model = trained()
        model.dispose()
        del model
        gc.collect()
        session.safe_point()
        stats = session.statistics()
        assert (stats.models_disposed, stats.models_cleaned, stats.cleaner.queued) == (1, 0, 0)


def test_a_shared_layer_survives_the_cleanup_of_a_dropped_model():
    shared = keras.layers.Dense(4)
    keeper_inputs = keras.Input((8,))
    keeper = keras.Model(keeper_inputs, shared(keeper_inputs))
    with lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE) as session:
        inputs = keras.Input((8,))
        dropped = lc.ManagedModel(inputs, shared(inputs))
        dropped.compile(optimizer="adam", loss="mse")
        dropped.fit(X, np.ones((32, 4), "float32"), verbose=0)
        dropped_ref = weakref.ref(dropped)
        del dropped
        collect_until(lambda: dropped_ref() is None, "the dropped model collected")
        with pytest.warns(ResourceWarning):
            session.close()
    assert session.statistics().models_cleaned == 1
    assert keeper.predict_on_batch(X).shape == (32, 4)  # buffers untouched


def test_a_cleanup_counts_only_the_buffers_it_frees():
    settle_default_session()
    with lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE) as session:
        model = trained(name="partly_kept")
        owned = model.owned_bytes
        kept = model.layers[1].kernel  # 8 x 16 float32: 512 bytes, referenced here
        session.hand_out(kept)  # and kept past the session's close, which frees the rest
        values = kept.numpy()
        kept_handle = weakref.ref(kept.value.handle)
        freed_handle = weakref.ref(model.layers[2].kernel.value.handle)
        model_ref = weakref.ref(model)
        before = lc.statistics().bytes_released
        del model
        collect_until(lambda: model_ref() is None, "the dropped model collected")
        message = rf"cleaned up {owned - 512} of its {owned} bytes of buffers \(512 stay with"
        with pytest.warns(ResourceWarning, match=message):
            session.close()
    assert lc.statistics().bytes_released - before == owned - 512
    collect_until(lambda: freed_handle() is None, "its buffer freed")
    assert kept_handle() is not None
    np.testing.assert_array_equal(kept.numpy(), values)  # left alone, not overwritten


# --- byte pressure -----------------------------------------------------------------


def counting_collector(calls):
    def collect():
        calls.append(threading.current_thread().name)
        gc.collect()

    return collect


def test_byte_pressure_collects_on_the_cleaner_thread_in_background():
    calls = []
    session = lc.LifecycleSession(
        cleanup=S.IN_BACKGROUND, pressure_threshold=1, collector=counting_collector(calls)
    )
    with session:
        kept = trained()  # in use: its bytes are no pressure yet
        assert session.cleaner.wait_idle(30) and calls == []
        newer = trained()  # kept might have been dropped now: a collection looks
        assert session.cleaner.wait_idle(30)
        assert calls and all(name.startswith("lifecycle-cleaner-") for name in calls)
        stats = session.statistics().cleaner
        assert stats.collections == len(calls) and stats.collection_seconds > 0
        assert stats.blocking_seconds >= stats.collection_seconds
        assert stats.bytes_allocated > 0
        kept.dispose(), newer.dispose()


def test_disposing_every_model_collects_only_for_its_step_functions():
    # The user's path: fit, then dispose. Disposed buffers are free already; what
    # a collection could find is the graphs of the traced step functions let go
    # (fit's here), each counted as STEP_FUNCTION_PRESSURE bytes.
    from lifecycle._disposal import STEP_FUNCTION_PRESSURE

    calls = []
    threshold = 3 * STEP_FUNCTION_PRESSURE + 1
    session = lc.LifecycleSession(
        cleanup=S.IN_BACKGROUND, pressure_threshold=threshold, collector=counting_collector(calls)
    )
    with session:
        for _ in range(3):
            trained().dispose()
        assert session.cleaner.wait_idle(30)
        stats = session.statistics().cleaner
        assert calls == [] and stats.pressure_bytes == 3 * STEP_FUNCTION_PRESSURE
        assert stats.bytes_released == stats.bytes_allocated > 0
        trained().dispose()  # the fourth step function passes the threshold
        assert session.cleaner.wait_idle(30)
        assert len(calls) == 1 and session.statistics().cleaner.pressure_bytes == 0


def test_the_release_kernels_are_built_in_the_background_before_dispose():
    with lc.LifecycleSession(cleanup=S.IN_BACKGROUND) as session:
        model = trained()
        assert session.cleaner.wait_idle(30)
        assert _tf.release_kernel_keys(_tf.model_leaves(model)) == set()
        model.dispose()


def built(name=None):
    inputs = keras.Input((8,))
    return lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name=name)


@pytest.mark.parametrize("strategy", [S.ON_SAFE_POINTS, S.ON_SESSION_CLOSE])
def test_byte_pressure_waits_for_a_safe_point_or_close(strategy, session):
    parent, calls = session, []
    parent_pressure = parent.statistics().cleaner.pressure_bytes
    session = lc.LifecycleSession(
        cleanup=strategy, pressure_threshold=1, collector=counting_collector(calls)
    )
    with session:
        model = built()  # allocates its weights; in use, so no pressure yet
        assert session.statistics().cleaner.pressure_bytes == 0
        other = built()  # model may have been dropped now
        assert session.statistics().cleaner.pressure_bytes == model.owned_bytes > 0
        assert calls == []
        session.safe_point()
        expected = [threading.current_thread().name] if strategy is S.ON_SAFE_POINTS else []
        assert calls == expected
        assert session.statistics().cleaner.pressure_bytes == (0 if expected else model.owned_bytes)
        model.dispose()
        other.dispose()
        assert session.statistics().cleaner.pressure_bytes == 0
    # Nothing was dropped without dispose(), so close runs no collection, and
    # disposed models leave the parent nothing to collect.
    assert calls == expected
    assert parent.statistics().cleaner.pressure_bytes == parent_pressure


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_close_collects_when_a_dropped_model_may_be_unfound():
    calls = []
    session = lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE, collector=counting_collector(calls))
    with session:
        model_ref = weakref.ref(built())  # dropped at once, never disposed
        collect_until(lambda: model_ref() is None, "the dropped model collected")  # clean-up queued
    assert calls == [threading.current_thread().name]
    assert session.statistics().models_cleaned == 1


def test_below_the_threshold_nothing_is_collected():
    calls = []
    with lc.LifecycleSession(
        cleanup=S.ON_SAFE_POINTS, pressure_threshold=2**40, collector=counting_collector(calls)
    ) as session:
        trained().dispose()
        session.safe_point()
        assert calls == []


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_end_to_end_dropped_models_are_found_by_pressure_alone():
    # No seam and no gc.collect() from the test: byte pressure makes the
    # cleaner collect, the collection finds the dropped models, the cleaner
    # cleans them up.
    with lc.LifecycleSession(cleanup=S.IN_BACKGROUND, pressure_threshold=1) as session:
        entries = _tf.custom_gradient_entries()
        for _ in range(4):
            trained()
        wait_until(lambda: session.statistics().models_cleaned >= 3, "3 models cleaned")
        assert _tf.custom_gradient_entries() < entries + 4
        assert session.statistics().cleaner.collections >= 1


# --- the session tree ------------------------------------------------------------------


class Recording(lc.ManagedModel):
    order: ClassVar[list[str]] = []

    def call(self, x):
        return x

    def dispose(self, **kwargs):
        Recording.order.append(self.name)
        return super().dispose(**kwargs)


def test_close_disposes_children_then_models_in_reverse_order_once():
    Recording.order = []
    with lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE, name="parent") as parent:
        first, second = Recording(name="first"), Recording(name="second")
        with lc.LifecycleSession(name="closed_early") as closed_early:
            early = Recording(name="early")
        assert closed_early.state is lc.SessionState.CLOSED
        assert Recording.order == ["early"]
        # A child never entered stays open until its parent closes it.
        child = lc.LifecycleSession(name="child")
        in_child = lc.manage(keras.Sequential([keras.layers.Dense(1)]), session=child)
        third = Recording(name="third")
    assert Recording.order == ["early", "third", "second", "first"]
    assert child.state is parent.state is lc.SessionState.CLOSED
    models = (first, second, third, in_child, early)
    assert all(m.state is lc.ModelState.DISPOSED for m in models)
    parent.close()  # a second close is a no-op
    assert len(Recording.order) == 4
    assert parent.statistics().models_disposed == 3


def test_managing_a_model_owned_by_another_session_is_refused():
    with lc.LifecycleSession(name="a") as a:
        model = Recording(name="owned")
        assert lc.manage(model) is model and lc.manage(model, session=a) is model
        with pytest.raises(ValueError, match="already owned by LifecycleSession 'a'"):
            lc.manage(model, session=lc.LifecycleSession(name="b"))


def test_models_belong_to_the_current_session_of_their_thread(session):
    with lc.LifecycleSession() as mine:
        here = Recording()
        seen = {}

        def elsewhere():
            seen["session"] = lc.current_session()
            seen["model"] = Recording()

        thread = threading.Thread(target=elsewhere)
        thread.start()
        joined(thread)
        assert here.session is mine
        assert seen["session"].name == "default" and seen["model"].session is seen["session"]
    assert lc.current_session() is session
    seen["model"].dispose()


def test_close_from_another_thread_and_twice():
    session = lc.LifecycleSession(cleanup=S.ON_SAFE_POINTS)
    model = lc.manage(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), session=session)
    closers = [threading.Thread(target=session.close) for _ in range(3)]
    for closer in closers:
        closer.start()
    joined(*closers)
    assert session.state is lc.SessionState.CLOSED and model.state is lc.ModelState.DISPOSED


def test_a_closed_session_owns_nothing_new_and_cannot_be_reentered():
    session = lc.LifecycleSession()
    with session:
        pass
    with pytest.raises(lc.ClosedError, match="is closed: it cannot own the new model"):
        lc.manage(keras.Sequential([keras.layers.Dense(1)]), session=session)
    with pytest.raises(lc.ClosedError, match="cannot be entered again"), session:
        pass
    with pytest.raises(lc.ClosedError, match="cannot own the new session"):
        lc.LifecycleSession(parent=session)


def test_a_session_is_single_use_and_detects_misnesting():
    outer, inner = lc.LifecycleSession(name="outer"), lc.LifecycleSession(name="inner")
    outer.__enter__()
    with pytest.raises(lc.LifecycleError, match="single-use"):
        outer.__enter__()
    inner.__enter__()
    with pytest.raises(lc.LifecycleError, match="'outer' exited out of order"):
        outer.__exit__(None, None, None)
    inner.__exit__(None, None, None)
    assert outer.state is inner.state is lc.SessionState.CLOSED


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"cleanup": "in_background"}, TypeError, "must be one of CleanupStrategy.IN_BACKGROUND"),
        ({"pressure_threshold": 0}, ValueError, "Received: pressure_threshold=0"),
        ({"pressure_threshold": 1.5}, ValueError, "positive number of bytes"),
        ({"close_timeout": -1}, ValueError, "Received: close_timeout=-1"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        lc.LifecycleSession(**kwargs)


def test_statistics_are_frozen_values():
    with lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE, name="stats") as session:
        stats = session.statistics()
        assert (stats.name, stats.cleanup, stats.state, stats.models) == (
            "stats",
            S.ON_SESSION_CLOSE,
            lc.SessionState.OPEN,
            0,
        )
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            stats.models = 3


def test_cleanup_strategy_has_exactly_the_three_members():
    assert [m.name for m in lc.CleanupStrategy] == [
        "IN_BACKGROUND",
        "ON_SAFE_POINTS",
        "ON_SESSION_CLOSE",
    ]


# --- clear_session policy ---------------------------------------------------------------


def settle_default_session():
    # Models other tests dropped count as live until a cleaner has cleaned them;
    # with none live, a close that clears Keras's state whenever no managed model
    # lives would clear it here.
    collect_until(lambda: lc._session._root().cleaner.wait_idle(30), "the cleaner idle")
    collect_until(lambda: lc.statistics().live_models == 0, "no live model left")


def in_thread(function):
    """Run ``function`` in a new thread; return its result or raise its exception."""
    outcome = {}

    def run():
        try:
            outcome["result"] = function()
        except BaseException as error:  # re-raised in the calling thread
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def close_a_session_that_trained_a_model(**options):
    with lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE, **options) as closing:
        trained().dispose()
        trained()  # left live: the close disposes it
    return closing.statistics()


@pytest.fixture
def user_keras_state():
    """A thread's own Keras settings, as a user sets them; restored afterwards."""
    keras.config.set_dtype_policy("mixed_float16")
    keras.config.disable_interactive_logging()
    yield
    keras.config.set_dtype_policy("float32")
    keras.config.enable_interactive_logging()


@pytest.mark.parametrize(
    "closing_thread",
    # The clear_session test below closes in another thread in the fast lane.
    ["same thread", pytest.param("another thread", marks=pytest.mark.slow)],
)
def test_the_default_close_harms_no_unmanaged_model(closing_thread, user_keras_state):
    settle_default_session()
    inputs = keras.Input((8,))
    plain = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(16)(inputs)))
    plain.compile(optimizer="adam", loss="mse")
    plain.fit(X, Y, batch_size=16, verbose=0)

    @tf.function
    def gradients(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(plain(x))
        return tape.gradient(loss, plain.trainable_variables)

    names = [layer.name for layer in plain.layers]
    paths = [variable.path for variable in plain.weights]
    predicted, on_batch = plain.predict(X, verbose=0), plain.predict_on_batch(X)
    grads = [g.numpy() for g in gradients(X)]
    traces = plain.predict_function.experimental_get_tracing_count()
    assert gradients.experimental_get_tracing_count() == 1

    if closing_thread == "same thread":
        stats = close_a_session_that_trained_a_model()
    else:
        stats = in_thread(close_a_session_that_trained_a_model)

    assert (stats.models_disposed, stats.clear_sessions) == (2, 0)
    # This thread's settings: the dtype policy (a global of the thread) and logging.
    assert keras.config.dtype_policy().name == "mixed_float16"
    assert not keras.config.is_interactive_logging_enabled()
    # Names: the model's own, and those of the next layers, which do not collide.
    assert [layer.name for layer in plain.layers] == names
    assert [variable.path for variable in plain.weights] == paths
    later_inputs = keras.Input((8,))
    later = keras.Model(later_inputs, keras.layers.Dense(2)(keras.layers.Dense(16)(later_inputs)))
    assert not {layer.name for layer in later.layers} & set(names)
    assert later.layers[1].compute_dtype == "float16"
    # Traced functions run again without a retrace, with identical results.
    np.testing.assert_array_equal(plain.predict(X, verbose=0), predicted)
    np.testing.assert_array_equal(plain.predict_on_batch(X), on_batch)
    for after, before in zip(gradients(X), grads, strict=True):
        np.testing.assert_array_equal(after.numpy(), before)
    assert plain.predict_function.experimental_get_tracing_count() == traces
    assert gradients.experimental_get_tracing_count() == 1
    history = plain.fit(X, Y, batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_clear_session_true_resets_other_threads_and_keeps_the_closing_threads_state(
    user_keras_state,
):
    before = keras.layers.Dense(1).name
    # Closed in this thread: its policy, counters and name scopes survive.
    with keras.name_scope("outer"):
        stats = close_a_session_that_trained_a_model(clear_session=True)
        scoped = keras.Variable(0.0, name="scoped")
    after = keras.layers.Dense(1).name
    assert stats.clear_sessions == 1
    assert keras.config.dtype_policy().name == "mixed_float16"
    assert int(after.rsplit("_", 1)[1]) > int(before.rsplit("_", 1)[1])
    assert scoped.path == "outer/scoped"
    # Closed in another thread: this thread's Keras state is reset, which is why
    # the default never clears.
    elsewhere = in_thread(lambda: close_a_session_that_trained_a_model(clear_session=True))
    assert elsewhere.clear_sessions == 1
    assert keras.config.dtype_policy().name == "float32"
    assert keras.config.is_interactive_logging_enabled()
    assert keras.layers.Dense(1).name == "dense"


def test_clear_session_true_runs_while_a_managed_model_lives():
    live = trained()
    expected = live.predict_on_batch(X)
    assert close_a_session_that_trained_a_model(clear_session=True).clear_sessions == 1
    np.testing.assert_array_equal(live.predict_on_batch(X), expected)
    live.dispose()


def test_clear_session_must_be_a_bool():
    with pytest.raises(TypeError, match=r"must be True or False\. Received: clear_session=None"):
        lc.LifecycleSession(clear_session=None)


# --- threads ----------------------------------------------------------------------------


class SlowFit(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.started, self.finish = threading.Event(), threading.Event()

    def on_train_batch_end(self, batch, logs=None):
        self.started.set()
        self.finish.wait(30)


def test_close_while_another_thread_is_in_fit_waits_or_fails_clearly():
    session = lc.LifecycleSession(cleanup=S.ON_SAFE_POINTS, close_timeout=0.1)
    with session:
        model = trained()
    # The session closed; use a new one for the running-fit case.
    session = lc.LifecycleSession(cleanup=S.ON_SAFE_POINTS, close_timeout=0.1)
    model = lc.manage(keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]), session=session)
    model.compile(optimizer="sgd", loss="mse")
    slow = SlowFit()
    result = {}
    worker = threading.Thread(
        target=lambda: result.setdefault("history", model.fit(X, Y, verbose=0, callbacks=[slow]))
    )
    worker.start()
    assert slow.started.wait(30), "fit did not start"
    with pytest.raises(lc.DrainTimeoutError, match="1 call\\(s\\) still running"):
        session.close()
    assert session.state is lc.SessionState.OPEN and model.state is lc.ModelState.LIVE
    session.close_timeout = None
    closer = threading.Thread(target=session.close)
    closer.start()
    wait_until(lambda: model.state is lc.ModelState.DISPOSING, "the model disposing")
    slow.finish.set()
    joined(worker, closer)
    assert "loss" in result["history"].history  # the running fit completed
    assert session.state is lc.SessionState.CLOSED and model.state is lc.ModelState.DISPOSED


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_user_threads_and_the_cleaner_thread_together():
    with lc.LifecycleSession(cleanup=S.IN_BACKGROUND, pressure_threshold=1) as session:
        errors = []

        def work(index):
            try:
                for step in range(3):
                    # A new thread starts in the default session: name the owner.
                    plain = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
                    model = lc.manage(plain, session=session)
                    model.compile(optimizer="adam", loss="mse")
                    model.fit(X, Y, verbose=0)
                    model.predict_on_batch(X)
                    del plain
                    if (index + step) % 2:
                        model.dispose()
                    del model
            except Exception as error:  # pragma: no cover - reported below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        joined(*threads)
        assert errors == []

        def all_released():
            # gc.collect() returns at once while the cleaner thread collects: retry.
            gc.collect()
            stats = session.statistics()
            return stats.models_disposed + stats.models_cleaned == 12

        wait_until(all_released, "all 12 models disposed or cleaned")
        assert session.cleaner.wait_idle(30)
        stats = session.statistics()
        assert stats.models == 0 and stats.cleaner.task_errors == 0


def test_freeze_heap_moves_the_warm_heap_out_of_later_collections():
    gc.unfreeze()
    try:
        assert gc.get_freeze_count() == 0
        with lc.LifecycleSession(freeze_heap=True):
            assert gc.get_freeze_count() > 0
            model = built()
            model.dispose()
            model_ref = weakref.ref(model)
            del model
            # Objects created after the freeze are collected (by this thread's
            # collection, or by the cleaner's if one was running: gc.collect()
            # then returns at once).
            collect_until(lambda: model_ref() is None, "the disposed model collected")
    finally:
        gc.unfreeze()


def test_activate_shares_an_open_session_with_worker_threads():
    with lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE, name="shared") as shared:
        made = []

        def work():
            with shared.activate():
                assert lc.current_session() is shared
                made.append(built())
            assert lc.current_session().name == "default"

        workers = [threading.Thread(target=work) for _ in range(2)]
        for worker in workers:
            worker.start()
        joined(*workers)
        assert [m.session for m in made] == [shared, shared]
        assert shared.statistics().models == 2
    assert all(m.state is lc.ModelState.DISPOSED for m in made)
    with pytest.raises(lc.ClosedError, match="cannot be activated"), shared.activate():
        pass


@pytest.fixture
def kernel_cache(monkeypatch):
    """A fresh kernel-cache policy (threshold 4), and a list of the clears it ordered."""
    from lifecycle import _core, _disposal, _session
    from lifecycle.monitoring import _statistics

    # The self-check clears the cache once, at its first run: not one of the policy's.
    _tf.check_compatibility()
    policy = _core.KernelCachePolicy(threshold=4)
    for module in (_session, _disposal, _statistics):
        monkeypatch.setattr(module, "KERNEL_CACHE", policy)
    cleared = []
    monkeypatch.setattr(_tf.memory, "clear_kernel_cache", lambda: cleared.append(1))
    return policy, cleared


def test_the_kernel_cache_is_cleared_after_releases_not_after_allocations(
    kernel_cache, monkeypatch
):
    from lifecycle import _disposal, _session

    # Buffers only: a step function let go would raise a collection of its own.
    monkeypatch.setattr(_disposal, "STEP_FUNCTION_PRESSURE", 0)
    policy, cleared = kernel_cache
    with lc.LifecycleSession(
        cleanup=lc.CleanupStrategy.ON_SAFE_POINTS, pressure_threshold=1
    ) as session:
        assert session.collector is _session.collect
        # A collection raised by allocations clears nothing (the kernels in
        # the cache are the live model's).
        model = trained()  # 4 weights + 8 Adam slots + iterations, lr, loss tracker
        session.cleaner.note_allocated(10)
        session.safe_point()
        collections = session.statistics().cleaner.collections
        assert collections >= 1
        assert cleared == []
        assert policy.statistics().skipped == collections
        # A dispose needs no collection, but its stale kernels go at the next
        # safe point (the cleaner's thread, in the background).
        report = model.dispose()
        assert policy.statistics().pending_buffers == report.variables_released >= 4
        assert cleared == []
        session.safe_point()
        assert session.statistics().cleaner.collections == collections
        assert cleared == [1]
        assert policy.statistics().pending_buffers == 0
        assert lc.statistics(count_graphs=False).kernel_cache_clears == 1


def test_a_closed_childs_disposals_have_their_kernels_cleared_by_its_successor(kernel_cache):
    # A registry's versions: each a child session, disposed by closing it
    # (dispose(collect=False)); their stale kernels used to stay forever.
    policy, cleared = kernel_cache
    with lc.LifecycleSession(cleanup=S.ON_SAFE_POINTS) as parent:
        child = lc.LifecycleSession(cleanup=S.ON_SESSION_CLOSE, parent=parent)
        with child.activate():
            trained()
        child.close()
        assert policy.statistics().pending_buffers >= 4 and cleared == []
        parent.safe_point()  # the successor runs the clear where its strategy runs work
        assert cleared == [1] and policy.statistics().pending_buffers == 0


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_dropped_models_clean_up_counts_its_buffers_for_the_kernel_cache(kernel_cache):
    policy, _ = kernel_cache
    with lc.LifecycleSession(cleanup=S.ON_SAFE_POINTS) as session:
        model, other = trained(), trained()
        buffers = len(_tf.model_leaves(model))
        model_ref, _ = drop(model)
        del model
        collect_until(lambda: model_ref() is None, "the dropped model collected")
        other.predict_on_batch(X)  # a safe point: the clean-up runs
        assert session.statistics().models_cleaned == 1
        # Its buffers were counted, and past the threshold (4) the clean-up
        # cleared the cache itself.
        assert buffers >= 4 and policy.statistics().clears == 1
        assert policy.statistics().pending_buffers == 0


KERNEL_CACHE_CHILD = """
import keras, numpy as np, tensorflow as tf
import lifecycle as lc
from lifecycle._session import collect

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

x = tf.ones([1, 256])
samples = []
for i in range(60):
    inputs = keras.Input((256,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(16)(keras.layers.Dense(512)(inputs)))
    serve = lc.serving_function(model, tf.TensorSpec([None, 256]))
    serve(x)
    model.dispose()
    del model, serve
    collect()
    samples.append(rss_mib())
print(samples[-1] - samples[19])
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_disposed_models_leave_nothing_in_the_kernel_cache(run_child):
    # Without clearing the cache, each model's kernels stay: ~0.13 MiB per model
    # here (5 MiB over these 40), measured. Cleared every 8 models (32 buffers
    # of 4 each), RSS stays within about 1 MiB.
    growth = float(run_child(KERNEL_CACHE_CHILD, timeout=240).strip().splitlines()[-1])
    assert growth < 2.0, f"RSS grew {growth:.2f} MiB over 40 models"
