"""Registry and checkpoints: load(checkpoint=...), watched base paths, bad files."""

from __future__ import annotations

import threading
from pathlib import Path

import keras
import numpy as np
import pytest
from support.models import answer
from support.waits import wait_until

import lifecycle as lc


def factory():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))


def publish(base, version, answer):
    """Write version `version` under `base`: a model whose every answer is `answer`."""
    with lc.LifecycleSession(name=f"publish-{version}"):
        model = lc.manage(factory())
        model.compile("adam", "mse")
        model.layers[-1].kernel.assign(np.zeros((8, 1), "float32"))
        model.layers[-1].bias.assign([float(answer)])
        prefix = model.checkpoints(base / str(version)).save()
        model.dispose()
    return prefix


def test_load_restores_the_checkpoint_before_serving(tmp_path):
    publish(tmp_path, 3, 3.0)
    with lc.ModelRegistry() as registry:
        registry.load("risk", 3, factory, checkpoint=tmp_path / "3")
        assert answer(registry) == 3.0
        with registry.lease("risk") as model:
            assert model.weights[0].path.startswith("risk/v3/")


class Net(lc.ManagedModel):
    """Subclassed: its layers exist at once, their variables only once it is called."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.out = keras.layers.Dense(3)

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def architecture(kind, compiled=False):
    """A fresh model of one kind; "sequential-unbuilt" has no Input, so no variables yet."""
    dense = [keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)]
    if kind == "subclassed":
        model = Net()
    elif kind == "functional":
        inputs = keras.Input((4,))
        model = keras.Model(inputs, dense[1](dense[0](inputs)))
    elif kind == "sequential":
        model = keras.Sequential([keras.Input((4,)), *dense])
    else:
        model = keras.Sequential(dense)
    if compiled:
        model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


SAMPLES = np.random.default_rng(0).random((16, 4), dtype=np.float32)


@pytest.mark.parametrize("compiled", [False, True], ids=["weights-only", "with-optimizer"])
@pytest.mark.parametrize("kind", ["subclassed", "functional", "sequential", "sequential-unbuilt"])
def test_load_from_a_checkpoint_serves_the_saved_outputs(tmp_path, kind, compiled):
    source = lc.manage(architecture(kind, compiled=True))
    source.fit(SAMPLES, SAMPLES[:, :3] * 2.0, epochs=2, batch_size=4, verbose=0)
    source.checkpoints(tmp_path).save()
    saved = keras.ops.convert_to_numpy(source(SAMPLES))
    source.dispose()
    with lc.ModelRegistry() as registry:
        registry.load(
            "net", 1, lambda: architecture(kind, compiled), checkpoint=tmp_path, warmup=SAMPLES[:1]
        )
        served = registry.predict("net", SAMPLES).numpy()
        with registry.lease("net") as model:
            paths = [v.path for v in model.weights]
    np.testing.assert_allclose(served, saved, rtol=1e-6, atol=1e-6)
    assert len(paths) == len(set(paths)) == 4, paths
    assert all(path.startswith("net/v1/") for path in paths), paths


def test_load_of_an_unbuilt_model_from_a_checkpoint_needs_a_warmup(tmp_path):
    source = lc.manage(architecture("subclassed", compiled=True))
    source(SAMPLES[:1])
    source.checkpoints(tmp_path).save()
    source.dispose()
    with lc.ModelRegistry() as registry:
        with pytest.raises(lc.LoadError, match="pass warmup=") as caught:
            registry.load("net", 1, lambda: architecture("subclassed"), checkpoint=tmp_path)
        assert "not built" in str(caught.value)
        assert [s.version for s in registry.status()] == []


def test_corrupt_or_missing_checkpoint_leaves_the_serving_version_serving(tmp_path):
    publish(tmp_path, 1, 1.0)
    prefix = publish(tmp_path, 2, 2.0)
    data = prefix + ".data-00000-of-00001"
    with open(data, "r+b") as file:
        file.seek(40)
        file.write(b"\x00" * 32)
    with lc.ModelRegistry() as registry:
        registry.load("risk", 1, factory, checkpoint=tmp_path / "1")
        with pytest.raises(lc.CheckpointError, match="truncated or corrupt") as caught:
            registry.load("risk", 2, factory, checkpoint=tmp_path / "2")
        assert caught.value.path == prefix
        with pytest.raises(lc.CheckpointError, match="does not exist"):
            registry.load("risk", 4, factory, checkpoint=tmp_path / "nowhere" / "ckpt-1")
        assert [s.version for s in registry.status()] == [1]
        assert answer(registry) == 1.0


def test_watch_serves_the_latest_and_retires_what_leaves_the_policy(tmp_path):
    publish(tmp_path, 1, 1.0)
    publish(tmp_path, 2, 2.0)
    (tmp_path / "3").mkdir()  # a version still being written: no checkpoint yet
    (tmp_path / "notes").mkdir()
    with lc.ModelRegistry() as registry:
        report = registry.watch("risk", tmp_path, factory, policy=lc.VersionPolicy.latest(1))
        assert (report.available, report.loaded, report.default) == ((1, 2), (2,), 2)
        assert answer(registry) == 2.0

        publish(tmp_path, 3, 3.0)
        report = registry.scan("risk")
        assert (report.loaded, report.retired, report.default) == ((3,), (2,), 3)
        assert answer(registry) == 3.0
        assert [s.version for s in registry.status()] == [3]

        assert registry.scan("risk").loaded == ()  # nothing new


def test_watch_policies_all_and_specific(tmp_path):
    for version in (1, 2, 5):
        publish(tmp_path, version, float(version))
    with lc.ModelRegistry() as registry:
        report = registry.watch("a", tmp_path, factory, policy=lc.VersionPolicy.all())
        assert report.loaded == (1, 2, 5) and report.default == 5
        assert answer(registry, "a", version=1) == 1.0
        report = registry.watch("b", tmp_path, factory, policy=lc.VersionPolicy.specific([2, 9]))
        assert report.wanted == (2,) and answer(registry, "b") == 2.0


def test_watch_reports_a_bad_version_and_serves_the_rest(tmp_path):
    publish(tmp_path, 1, 1.0)
    prefix = publish(tmp_path, 2, 2.0)
    with open(prefix + ".index", "wb") as file:
        file.write(b"not an index")
    with lc.ModelRegistry() as registry:
        report = registry.watch("risk", tmp_path, factory, policy=lc.VersionPolicy.latest(2))
        assert report.loaded == (1,) and [v for v, _ in report.failed] == [2]
        assert "CheckpointError" in report.failed[0][1]
        assert answer(registry) == 1.0


def test_watch_errors(tmp_path):
    with lc.ModelRegistry() as registry:
        with pytest.raises(lc.CheckpointError, match="does not exist"):
            registry.watch("risk", tmp_path / "missing", factory)
        registry.watch("risk", tmp_path, factory)
        with pytest.raises(ValueError, match="already watches"):
            registry.watch("risk", tmp_path, factory)
        registry.unwatch("risk")
        with pytest.raises(lc.UnknownModelError):
            registry.scan("risk")
    with pytest.raises(ValueError, match="n"):
        lc.VersionPolicy.latest(0)
    with pytest.raises(ValueError, match="versions"):
        lc.VersionPolicy.specific([])


def test_resource_preserving_watch_retires_before_loading(tmp_path):
    publish(tmp_path, 1, 1.0)
    with lc.ModelRegistry(
        max_loaded=1, swap_policy=lc.SwapPolicy.RESOURCE_PRESERVING, lease_timeout=5
    ) as registry:
        registry.watch("risk", tmp_path, factory)
        publish(tmp_path, 2, 2.0)
        report = registry.scan("risk")
        assert (report.retired, report.loaded, report.default) == ((1,), (2,), 2)
        assert answer(registry) == 2.0


def test_a_failing_new_version_does_not_retire_the_serving_one(tmp_path):
    publish(tmp_path, 1, 1.0)
    with lc.ModelRegistry() as registry:
        registry.watch("risk", tmp_path, factory, policy=lc.VersionPolicy.latest(1))
        prefix = publish(tmp_path, 2, 2.0)
        with open(prefix + ".data-00000-of-00001", "r+b") as file:
            file.write(b"\xff" * 64)
        report = registry.scan("risk")
        assert [v for v, _ in report.failed] == [2] and report.retired == ()
        assert report.default == 1 and answer(registry) == 1.0
        publish(tmp_path, 3, 3.0)  # the next good version takes over
        report = registry.scan("risk")
        assert (report.loaded, report.retired, report.default) == ((3,), (1,), 3)


def test_a_version_unloaded_by_hand_stays_unloaded_until_loaded_by_hand(tmp_path):
    for version in (1, 2):
        publish(tmp_path, version, float(version))
    with lc.ModelRegistry() as registry:
        registry.watch("risk", tmp_path, factory, policy=lc.VersionPolicy.all())
        registry.unload("risk", 1, wait=True)
        report = registry.scan("risk")
        assert (report.loaded, report.held) == ((), (1,))
        assert [s.version for s in registry.status("risk")] == [2]
        registry.load("risk", 1, factory, checkpoint=tmp_path / "1")  # by hand: released
        report = registry.scan("risk")
        assert (report.loaded, report.held) == ((), ())
        assert [s.version for s in registry.status("risk")] == [1, 2]
        registry.unload("risk", 1, wait=True)
        registry.unwatch("risk")  # watched anew: nothing held
        assert registry.watch("risk", tmp_path, factory, policy=lc.VersionPolicy.all()).loaded == (
            1,
        )


def test_a_failed_version_is_tried_again_only_once_its_directory_changes(tmp_path, caplog):
    publish(tmp_path, 1, 1.0)
    prefix = publish(tmp_path, 2, 2.0)
    index = Path(prefix + ".index")
    good = index.read_bytes()
    index.write_bytes(b"not an index")
    builds = []

    def counting_factory():
        builds.append(1)
        return factory()

    with lc.ModelRegistry() as registry:
        report = registry.watch("risk", tmp_path, counting_factory, policy=lc.VersionPolicy.all())
        assert report.loaded == (1,) and [v for v, _ in report.failed] == [2]
        tried = len(builds)
        for _ in range(3):  # what polling does
            report = registry.scan("risk")
            assert [v for v, _ in report.failed] == [2] and "CheckpointError" in report.failed[0][1]
        assert len(builds) == tried  # reported, not loaded again
        assert caplog.text.count("'risk' version 2 failed to load") == 1
        index.write_bytes(good)  # the deploy fixes the file
        report = registry.scan("risk")
        assert (report.loaded, report.failed) == ((2,), ())
        assert answer(registry, version=2) == 2.0


def watch_thread(registry, name):
    """The polling thread of a watch, found by its documented name."""
    wanted = f"lifecycle-watch-{registry.name}-{name}"
    return next((t for t in threading.enumerate() if t.name == wanted), None)


def test_polling_follows_the_base_path_until_unwatched(tmp_path):
    publish(tmp_path, 1, 1.0)
    with lc.ModelRegistry() as registry:
        registry.watch("risk", tmp_path, factory, poll_interval=0.1)
        thread = watch_thread(registry, "risk")
        assert thread is not None and thread.is_alive()
        publish(tmp_path, 2, 2.0)
        wait_until(lambda: registry.last_scan("risk").default == 2, "version 2 the default")
        assert answer(registry) == 2.0
        registry.unwatch("risk")
        assert not thread.is_alive()
        with pytest.raises(lc.UnknownModelError):
            registry.last_scan("risk")
        with pytest.raises(ValueError, match="poll_interval"):
            registry.watch("other", tmp_path, factory, poll_interval=0)


def test_close_stops_the_polling_thread(tmp_path):
    publish(tmp_path, 1, 1.0)
    registry = lc.ModelRegistry()
    registry.watch("risk", tmp_path, factory, poll_interval=0.05)
    thread = watch_thread(registry, "risk")
    registry.close()
    assert not thread.is_alive()
