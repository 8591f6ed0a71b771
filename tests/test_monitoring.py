"""Monitoring: the trend monitor, the Keras callback and the Prometheus metrics."""

from __future__ import annotations

import gc
import sys
import urllib.request
import warnings

import keras
import numpy as np
import pytest

import lifecycle as lc
from lifecycle.monitoring import LeakTrendMonitor, LifecycleCallback

MiB = 2**20


# -- trend -------------------------------------------------------------------------------


def test_flat_noise_is_not_a_leak():
    rng = np.random.default_rng(0)
    monitor = LeakTrendMonitor(warmup=0)
    for value in 600 * MiB + rng.normal(0, 2 * MiB, 30):
        trend = monitor.sample(value)
    assert trend.verdict == "flat" and not trend.leaking
    assert trend.low < 0 < trend.high


def test_steady_growth_is_a_leak_with_an_interval_around_it():
    rng = np.random.default_rng(1)
    monitor = LeakTrendMonitor(warmup=3, tolerance=1 * MiB)
    for cycle in range(25):
        monitor.sample(600 * MiB + 3 * MiB * cycle + rng.normal(0, 1 * MiB))
    trend = monitor.trend()
    assert trend.leaking and trend.verdict == "leaking" and trend.samples == 22
    assert trend.low < 3 * MiB < trend.high
    assert str(trend).startswith("leaking: +") and "95% interval" in str(trend)


def test_small_growth_within_tolerance_and_too_few_samples():
    monitor = LeakTrendMonitor(warmup=0, tolerance=1 * MiB)
    for cycle in range(20):
        monitor.sample(600 * MiB + 0.1 * MiB * cycle)
    assert not monitor.trend().leaking  # real, but below the tolerance
    short = LeakTrendMonitor(warmup=5)
    for _ in range(6):
        trend = short.sample(1.0)
    assert trend.slope is None and trend.verdict == "insufficient data"
    assert "need at least 3" in str(trend)
    with pytest.raises(ValueError, match="confidence"):
        LeakTrendMonitor(confidence=1.5)


def test_default_probe_reads_rss():
    trend = LeakTrendMonitor(warmup=0).sample()
    assert trend.samples == 1


# -- callback ----------------------------------------------------------------------------


def test_callback_logs_memory_and_runs_safe_points(tmp_path):
    with lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SAFE_POINTS) as session:
        # A managed model dropped without dispose(): its clean-up waits for a
        # safe point. The plain model's fit has none of its own; the callback's
        # safe point runs it. (This session's queue: other cleaners may be busy.)
        dropped = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(300)]))
        del dropped
        gc.collect()
        # Its clean-up, and the session's sweep of the variables found dead.
        assert session.statistics().cleaner.queued == 2
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("adam", "mse")
        # Recorded, not pytest.warns: that re-emits unrelated warnings (a NumPy 2
        # deprecation inside some Keras versions) as if they came from this file.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(
                np.ones((32, 4), "float32"),
                np.ones((32, 2), "float32"),
                batch_size=8,
                epochs=2,
                verbose=0,
                callbacks=[LifecycleCallback(safe_point_every=2, log_dir=str(tmp_path))],
            )
        assert any(
            issubclass(w.category, ResourceWarning) and "without dispose" in str(w.message)
            for w in caught
        )
        assert session.statistics().cleaner.queued == 0
    logs = history.history
    assert len(logs["lifecycle_rss_mib"]) == 2 and logs["lifecycle_rss_mib"][0] > 50
    assert logs["lifecycle_live_models"][0] >= 0 and "lifecycle_owned_mib" in logs
    assert any(tmp_path.iterdir())  # TensorBoard event file


def test_callback_works_with_a_plain_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    history = model.fit(
        np.ones((8, 4)), np.ones((8, 2)), epochs=1, verbose=0, callbacks=[LifecycleCallback()]
    )
    assert "lifecycle_rss_mib" in history.history
    with pytest.raises(ValueError, match="safe_point_every"):
        LifecycleCallback(safe_point_every=0)


# -- prometheus --------------------------------------------------------------------------


def scrape(registry):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return text, samples


def test_prometheus_exposition_parses_back_and_follows_the_statistics():
    from prometheus_client import CollectorRegistry

    target = CollectorRegistry()
    collector = lc.monitoring.register_prometheus(target)
    assert lc.monitoring.register_prometheus(target) is collector  # idempotent
    model = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(300)]))
    _, before = scrape(target)
    stats = lc.statistics(count_graphs=False)
    assert before[("lifecycle_live_models", ())] == stats.live_models
    assert before[("lifecycle_owned_bytes", ())] == stats.bytes_owned
    released = model.dispose().bytes_released
    clears = lc.statistics(count_graphs=False).kernel_cache_clears
    text, after = scrape(target)
    assert after[("lifecycle_released_bytes_total", ())] == (
        before[("lifecycle_released_bytes_total", ())] + released
    )
    assert after[("lifecycle_models_disposed_total", ())] == (
        before[("lifecycle_models_disposed_total", ())] + 1
    )
    assert after[("lifecycle_process_resident_memory_bytes", ())] > 0
    assert "# TYPE lifecycle_collection_seconds_total counter" in text
    assert "# TYPE lifecycle_trims_total counter" in text
    # The longest pause a cleaner's collection imposed, and all the time the
    # library's work held the interpreter lock: as the statistics say.
    assert "# TYPE lifecycle_collection_seconds_max gauge" in text
    assert "# TYPE lifecycle_blocking_seconds_total counter" in text
    stats = lc.statistics(count_graphs=False)
    longest = after[("lifecycle_collection_seconds_max", ())]
    assert 0 <= longest <= stats.max_collection_seconds  # a high-water mark
    assert 0 <= after[("lifecycle_blocking_seconds_total", ())] <= stats.blocking_seconds
    # A counter: a collection on the cleaner's thread may clear the cache meanwhile.
    scraped = after[("lifecycle_kernel_cache_clears_total", ())]
    assert clears <= scraped <= lc.statistics(count_graphs=False).kernel_cache_clears
    # Where freed CPU memory is: oneDNN's pool, labelled with the allocator in use.
    allocator = stats.cpu_allocator
    pooled = after[("lifecycle_cpu_pooled_bytes", (("allocator", allocator),))]
    assert pooled >= 0 if allocator == "onednn-pool" else pooled == 0


def test_prometheus_reports_registry_versions_and_serves_on_loopback():
    from prometheus_client import CollectorRegistry

    def factory():
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(2)(inputs))

    target = CollectorRegistry()
    with lc.ModelRegistry(name="shop") as registry:
        registry.load("risk", 3, factory)
        registry.predict("risk", np.ones((1, 4), "float32"))
        lc.monitoring.register_prometheus(target, model_registries=[registry])
        _, samples = scrape(target)
        key = (("model", "risk"), ("registry", "shop"), ("version", "3"))
        assert samples[("lifecycle_version_requests_total", key)] == 1
        assert samples[("lifecycle_version_bytes", key)] == registry.status()[0].bytes
        with lc.monitoring.start_exporter(registry=target) as exporter:
            assert exporter.address == "127.0.0.1" and exporter.port > 0
            body = urllib.request.urlopen(exporter.url, timeout=10).read().decode()
        assert "lifecycle_version_leases" in body


def test_a_new_prometheus_registry_where_a_dead_one_was_gets_its_own_collector():
    from prometheus_client import CollectorRegistry

    # CPython often places a new registry at a dropped one's address; the
    # collector must follow the registry, not the address.
    for _ in range(20):
        target = CollectorRegistry()
        lc.monitoring.register_prometheus(target)
        _, samples = scrape(target)
        assert ("lifecycle_live_models", ()) in samples
        del target  # freed at once: no cycles


def test_prometheus_collector_holds_model_registries_weakly():
    import weakref

    from prometheus_client import CollectorRegistry

    collector = lc.monitoring.register_prometheus(CollectorRegistry())
    registry = lc.ModelRegistry(name="dropped")
    collector.add_registry(registry)
    ref = weakref.ref(registry)
    registry.close()
    del registry
    gc.collect()
    assert ref() is None


def test_missing_prometheus_client_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r'pip install "keras-lifecycle\[prometheus\]"'):
        lc.monitoring.register_prometheus()
