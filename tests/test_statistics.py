"""Process statistics: counters follow what models and cleaners do."""

from __future__ import annotations

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf

import lifecycle as lc


def small(units=256):
    return lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)]))


def test_statistics_follow_manage_dispose_and_clean_up():
    before = lc.statistics()
    model = small()
    nbytes = model.owned_bytes
    during = lc.statistics()
    assert during.live_models == before.live_models + 1
    assert during.models_managed == before.models_managed + 1
    assert during.bytes_owned == before.bytes_owned + nbytes

    model.dispose()
    after = lc.statistics()
    assert after.live_models == before.live_models
    assert after.models_disposed == before.models_disposed + 1
    assert after.bytes_owned == before.bytes_owned
    assert after.bytes_released == before.bytes_released + nbytes

    with lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SAFE_POINTS) as session:
        dropped = small()
        del dropped
        gc.collect()
        assert lc.statistics().cleaner_queue >= 1
        with pytest.warns(ResourceWarning):
            session.safe_point()
    cleaned = lc.statistics()
    assert cleaned.models_cleaned == before.models_cleaned + 1
    # Its queue ran; other cleaners (a collection on the default session's) may be busy.
    assert session.statistics().cleaner.queued == 0 <= cleaned.cleaner_queue


def test_statistics_snapshot_is_frozen_and_probes_memory():
    stats = lc.statistics(count_graphs=False)
    assert stats.live_traced_graphs is None
    assert stats.rss_bytes is not None and stats.rss_bytes > 50 * 2**20
    # One entry per GPU TensorFlow sees (none on a CPU-only machine).
    gpus = tf.config.list_physical_devices("GPU")
    assert [memory.device for memory in stats.device_memory] == [
        f"/device:GPU:{index}" for index in range(len(gpus))
    ]
    for memory in stats.device_memory:
        assert 0 <= memory.current_bytes <= memory.peak_bytes
    with pytest.raises(AttributeError):
        stats.live_models = 3  # type: ignore[misc]


def traced_graphs():
    gc.collect()
    return lc.statistics().live_traced_graphs


@pytest.mark.slow  # other statistics stay in the fast lane
def test_live_traced_graphs_follow_a_models_traces_and_dispose():
    # Other tests' dropped models are cleaned first, so that only this model's
    # graphs come and go below.
    gc.collect()
    assert lc._session._root().cleaner.wait_idle(30)
    before = traced_graphs()
    model = small(8)
    model.compile(optimizer="adam", loss="mse")
    assert traced_graphs() == before  # nothing traced yet
    model.fit(np.ones((32, 4), "float32"), np.ones((32, 8), "float32"), verbose=0)
    trained = traced_graphs()
    assert trained > before  # the train step, its gradient and optimizer graphs
    model.predict_on_batch(np.ones((2, 4), "float32"))
    assert traced_graphs() == trained + 1  # one predict function
    model.dispose(collect=True)
    assert traced_graphs() < trained
    del model
    assert traced_graphs() == before


def test_collections_are_counted():
    before = lc.statistics().collections
    with lc.LifecycleSession(
        cleanup=lc.CleanupStrategy.ON_SAFE_POINTS, pressure_threshold=1
    ) as session:
        first = small()
        second = small()  # first may have been dropped: a collection is due
        session.safe_point()
        first.dispose(), second.dispose()
    stats = lc.statistics()
    assert stats.collections > before
    assert stats.blocking_seconds >= stats.max_collection_seconds > 0


def test_model_and_registry_statistics():
    model = small(8)
    stats = model.statistics()
    assert (stats.state, stats.owned_bytes, stats.calls_in_flight) == (
        lc.ModelState.LIVE,
        model.owned_bytes,
        0,
    )
    model.dispose()
    assert model.statistics().owned_bytes == 0

    def factory():
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(2)(inputs))

    with lc.ModelRegistry(name="stats") as registry:
        registry.load("risk", 1, factory)
        registry.load("risk", 2, factory)
        with registry.lease("risk"):
            snapshot = registry.statistics()
        assert (snapshot.models, snapshot.versions, snapshot.leases) == (1, 2, 1)
        assert snapshot.bytes == sum(s.bytes for s in registry.status()) > 0
        assert snapshot.session.children == 2
