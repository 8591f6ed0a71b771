"""Loads: on a loader thread (loader_nice), after a frozen heap, without retracing warnings."""

from __future__ import annotations

import contextvars
import gc
import logging
import os
import sys
import threading
import weakref

import keras
import pytest
import tensorflow as tf
from support.models import answer, constant

import lifecycle as lc

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread priorities are Linux-only"
)


def nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def recording(factory, seen):
    """``factory``, recording into ``seen`` where and how it ran."""

    def build():
        seen.update(
            thread=threading.current_thread().name,
            nice=nice_of_this_thread(),
            policy=keras.config.dtype_policy().name,
            request_id=REQUEST_ID.get(),
        )
        return factory()

    return build


def loader_threads(name):
    return [t for t in threading.enumerate() if t.name.startswith(f"lifecycle-loader-{name}")]


@linux_only
def test_loads_run_on_the_registry_thread_at_lower_priority():
    if nice_of_this_thread() + 7 > 19:  # Linux clamps nice values at 19
        pytest.skip("this thread's nice value leaves no room to lower the loader's by 7")
    seen = {}
    with lc.ModelRegistry(name="nice", loader_nice=7) as registry:
        registry.load("risk", 1, recording(constant(1.0), seen))
        assert seen["thread"].startswith("lifecycle-loader-nice")
        assert seen["nice"] == nice_of_this_thread() + 7
        assert answer(registry) == 1.0
        registry.load("risk", 2, constant(2.0))
        registry.promote("risk", 2)
        registry.unload("risk", 1, wait=True)
        assert answer(registry) == 2.0
        assert len(loader_threads("nice")) == 1  # one thread for every load
    assert loader_threads("nice") == []  # close() stopped it


@linux_only
def test_the_loader_builds_in_the_callers_dtype_policy_device_and_context():
    seen = {}
    token = REQUEST_ID.set("deploy-42")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        with lc.ModelRegistry(name="scope", loader_nice=3) as registry, tf.device("/CPU:0"):
            registry.load("risk", 1, recording(constant(1.0), seen))
            with registry.lease("risk") as model:
                assert model.layers[1].dtype_policy.name == "mixed_float16"
                assert model.weights[0].value.device.endswith("CPU:0")
    finally:
        keras.config.set_dtype_policy(previous)
        REQUEST_ID.reset(token)
    assert seen["policy"] == "mixed_float16" and seen["request_id"] == "deploy-42"
    # The loader thread's own policy was restored after the load.
    assert keras.config.dtype_policy().name == previous.name


@linux_only
def test_a_failed_load_on_the_loader_changes_nothing_and_the_loader_goes_on():
    with lc.ModelRegistry(name="fails", loader_nice=1) as registry:
        registry.load("risk", 1, constant(1.0))
        with pytest.raises(lc.LoadError, match="'risk' version 2 failed in its factory"):
            registry.load("risk", 2, lambda: 1 / 0)
        assert [s.version for s in registry.status()] == [1] and answer(registry) == 1.0
        registry.load("risk", 3, constant(3.0))
        assert [s.version for s in registry.status()] == [1, 3]


@pytest.mark.parametrize("value", [0, 20, -1, True, 2.5, "10"])
def test_bad_loader_nice_is_rejected(value):
    with pytest.raises(ValueError, match=f"Received: loader_nice={value!r}"):
        lc.ModelRegistry(loader_nice=value)


@pytest.mark.parametrize("value", [0, 1.5, -1, "0.5"])
def test_bad_loader_gil_share_is_rejected(value):
    with pytest.raises(ValueError, match=f"Received: loader_gil_share={value!r}"):
        lc.ModelRegistry(loader_gil_share=value)


def test_a_paced_load_pauses_while_a_lease_is_held_and_serves_the_same():
    with lc.ModelRegistry(name="paced", loader_gil_share=0.5) as registry:
        registry.load("risk", 1, constant(1.0))
        assert registry.statistics().load_pauses == 0  # nothing in flight yet
        with registry.lease("risk"):  # a request in flight for the whole load
            registry.load("risk", 2, constant(2.0))
        assert registry.statistics().load_pauses > 0
        registry.promote("risk", 2)
        assert answer(registry) == 2.0


def test_freeze_heap_freezes_what_exists_and_still_collects_disposed_versions():
    gc.unfreeze()
    try:
        with lc.ModelRegistry(name="frozen", freeze_heap=True) as registry:
            assert gc.get_freeze_count() > 0
            registry.load("risk", 1, constant(1.0))
            with registry.lease("risk") as model:
                version_1 = weakref.ref(model)
            del model
            registry.load("risk", 2, constant(2.0))
            registry.promote("risk", 2)
            registry.unload("risk", 1, wait=True)
            gc.collect()
            # Created after the freeze, so collected once disposed.
            assert version_1() is None
            assert answer(registry) == 2.0
    finally:
        gc.unfreeze()


def test_many_swaps_log_no_retracing_warning(caplog):
    # Every version traces the same serving body once; TensorFlow would warn
    # about "frequent retracing" from the fifth load on.
    with caplog.at_level(logging.WARNING, logger="tensorflow"), lc.ModelRegistry() as registry:
        for version in range(1, 9):
            registry.load("risk", version, constant(float(version)))
            registry.promote("risk", version)
            assert answer(registry) == float(version)
            if version > 1:
                registry.unload("risk", version - 1)
    assert "retracing" not in caplog.text


@linux_only
def test_a_factory_that_loads_into_its_own_registry_fails_clearly_instead_of_hanging():
    with lc.ModelRegistry(name="nested", loader_nice=1) as registry:
        registry.load("risk", 1, constant(1.0))

        def nested():
            registry.load("other", 1, constant(5.0))
            return constant(2.0)()

        with pytest.raises(lc.LoadError, match="cannot load, unload, watch or close") as caught:
            registry.load("risk", 2, nested)
        assert isinstance(caught.value.__cause__, lc.LifecycleError)
        assert [(s.name, s.version) for s in registry.status()] == [("risk", 1)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> str:
    """A SavedModel of about 70 KiB of variables."""
    path = tmp_path_factory.mktemp("exported") / "1"
    inputs = keras.Input((4,), name="x")
    keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(4096)(inputs))).export(
        str(path), verbose=False
    )
    return str(path)


def test_a_small_savedmodel_loads_in_the_foreground_unpaced_while_requests_are_in_flight(
    exported,
):
    with lc.ModelRegistry(
        name="fg", loader_gil_share=0.5, loader_foreground_bytes=2**20
    ) as registry:
        registry.load("risk", 1, constant(1.0))  # a factory: size unknown, in the background
        assert registry.statistics().foreground_loads == 0
        with registry.lease("risk"):  # a request in flight for the whole load
            registry.load("small", 1, exported)
        statistics = registry.statistics()
        assert (statistics.foreground_loads, statistics.load_pauses) == (1, 0)
        assert registry.status("small")[0].state is lc.VersionState.READY


def test_a_savedmodel_over_the_foreground_bytes_loads_in_the_background_paced(exported):
    with lc.ModelRegistry(
        name="bg", loader_gil_share=0.5, loader_foreground_bytes=1024
    ) as registry:
        registry.load("risk", 1, constant(1.0))
        with registry.lease("risk"):
            registry.load("large", 1, exported)
        statistics = registry.statistics()
        assert statistics.foreground_loads == 0 and statistics.load_pauses > 0


@pytest.mark.parametrize("value", [-1, 2.5, True, "1"])
def test_bad_loader_foreground_bytes_is_rejected(value):
    with pytest.raises(ValueError, match=f"Received: loader_foreground_bytes={value!r}"):
        lc.ModelRegistry(loader_foreground_bytes=value)
