"""Owned checkpoints: keeper, async saves, strict and verified restores, crash safety."""

from __future__ import annotations

import gc
import logging
import os
import weakref
from pathlib import Path

import keras
import numpy as np
import pytest

import lifecycle as lc
from lifecycle import _tf

X = np.random.default_rng(0).random((32, 8), dtype=np.float32)
Y = np.random.default_rng(1).random((32, 2), dtype=np.float32)


def make(units=16, *, extra=False, compiled=True):
    layers = [keras.Input((8,)), keras.layers.Dense(units), keras.layers.Dense(2)]
    if extra:
        layers.append(keras.layers.Dense(2))
    model = lc.manage(keras.Sequential(layers))
    if compiled:
        model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def stepped(steps=2, **kwargs):
    """A model of ``make(**kwargs)`` after ``steps`` training steps (its optimizer's iterations)."""
    model = make(**kwargs)
    for _ in range(steps):
        model.train_on_batch(X, Y)
    return model


def values(variables):
    return [np.array(v.numpy()) for v in variables]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def data_file(prefix):
    return prefix + ".data-00000-of-00001"


def test_save_and_restore_weights_slots_iterations_and_step(tmp_path):
    model = stepped()
    keeper = model.checkpoints(tmp_path / "ckpt")
    prefix = keeper.save()
    assert prefix == str(tmp_path / "ckpt" / "ckpt-1") and keeper.step == 1
    saved_weights, saved_optimizer = values(model.weights), values(model.optimizer.variables)
    model.train_on_batch(X, Y)
    assert not same(values(model.weights), saved_weights)

    assert keeper.restore() == prefix
    assert same(values(model.weights), saved_weights)
    assert same(values(model.optimizer.variables), saved_optimizer)
    assert int(model.optimizer.iterations.numpy()) == 2


def test_retention_numbering_and_listing(tmp_path):
    keeper = stepped(steps=1).checkpoints(tmp_path, max_to_keep=2)
    assert keeper.latest is None and keeper.list() == []
    paths = [keeper.save() for _ in range(3)]
    assert keeper.list() == paths[1:] and keeper.latest == paths[-1]
    assert not os.path.exists(paths[0] + ".index")
    assert keeper.save(step=100).endswith("ckpt-100") and keeper.step == 100
    assert keeper.save().endswith("ckpt-101")


def test_same_directory_same_keeper_and_bad_options(tmp_path):
    model = make()
    keeper = model.checkpoints(tmp_path)
    assert model.checkpoints(str(tmp_path)) is keeper
    with pytest.raises(ValueError, match="already has a checkpoint keeper"):
        model.checkpoints(tmp_path, max_to_keep=9)
    with pytest.raises(ValueError, match="max_to_keep"):
        model.checkpoints(tmp_path / "b", max_to_keep=0)
    with pytest.raises(ValueError, match="keep_every_n_hours"):
        model.checkpoints(tmp_path / "c", keep_every_n_hours=-1)
    with pytest.raises(ValueError, match="step"):
        keeper.save(step=-1)
    (tmp_path / "file").write_text("x")
    with pytest.raises(lc.CheckpointError, match="not a directory"):
        model.checkpoints(tmp_path / "file")


def test_async_saves_work_every_time_and_dispose_releases_the_cpu_copy(tmp_path):
    model = stepped(steps=1)
    keeper = model.checkpoints(tmp_path, async_save=True)
    for _ in range(4):  # Keras 3 variables used to fail on the second async save
        model.train_on_batch(X, Y)
        last = keeper.save()
    expected = values(model.weights)
    checkpoint = keeper._checkpoint
    copies = list(checkpoint._async_checkpointer_impl._object_map.values())
    assert copies and not any(_tf.is_released(c) for c in copies)

    model.dispose()  # flushes the pending write, then drops the keeper
    assert all(_tf.is_released(c) for c in copies)
    assert checkpoint._async_checkpointer_impl is None
    ref = weakref.ref(model)
    del model, keeper, checkpoint, copies
    gc.collect()
    assert ref() is None, "the async helper still holds the model"

    fresh = make()
    lc.restore_checkpoint(fresh, last)
    assert same(values(fresh.weights), expected)


@pytest.mark.subprocess
@pytest.mark.slow
def test_plain_keras_checkpoints_behave_as_without_the_library(tmp_path, run_child):
    # What Keras does natively (on Keras 3.15 the second async save of a model
    # fails) is recorded before lifecycle is imported, and again after a managed
    # model's async keeper saved twice: the two must be the same.
    out = run_child(
        f"""
        import os
        import keras
        import tensorflow as tf
        from keras.src.backend.tensorflow import core

        hook = vars(core.Variable)["_copy_trackable_to_cpu"]

        def outcomes(directory):
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            checkpoint = tf.train.Checkpoint(model=model)
            options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
            seen = []
            for _ in range(3):
                try:
                    checkpoint.save(os.path.join(directory, "async"), options=options)
                    checkpoint.sync()
                    seen.append("saved")
                except Exception as error:
                    seen.append(type(error).__name__ + ": " + str(error).strip().splitlines()[-1])
            seen.append(os.path.basename(checkpoint.save(os.path.join(directory, "sync"))))
            return seen

        native = outcomes({str(tmp_path / "native")!r})
        import lifecycle as lc

        managed = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
        keeper = managed.checkpoints({str(tmp_path / "managed")!r}, async_save=True)
        keeper.save()
        keeper.save()
        keeper.sync()
        print("managed saves:", [os.path.basename(p) for p in keeper.list()])
        print("hook unchanged:", vars(core.Variable)["_copy_trackable_to_cpu"] is hook)
        print("native:", native)
        print("with lifecycle:", outcomes({str(tmp_path / "library")!r}))
        """
    )
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["managed saves"] == "['ckpt-1', 'ckpt-2']", out
    assert lines["hook unchanged"] == "True", out
    assert lines["with lifecycle"] == lines["native"], out


def test_only_the_variables_of_an_async_keeper_get_the_host_copy_hook(tmp_path):
    plain = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    plain(X[:1])
    model = stepped(steps=1)
    model.checkpoints(tmp_path / "sync").save()
    assert not any("_copy_trackable_to_cpu" in vars(v) for v in model.variables)
    model.checkpoints(tmp_path / "async", async_save=True).save()
    assert all("_copy_trackable_to_cpu" in vars(v) for v in model.variables)
    assert not any("_copy_trackable_to_cpu" in vars(v) for v in plain.variables)


def test_restore_under_another_prefix_before_the_optimizer_is_built(tmp_path):
    source = stepped()
    prefix = source.checkpoints(tmp_path).save()
    with lc.ModelRegistry() as registry, _tf.isolated_names("risk", "v7"):
        target = make()
        assert target.weights[0].path.startswith("risk/v7/")
        assert not target.optimizer.built
        del registry
    lc.restore_checkpoint(target, prefix)
    assert same(values(target.weights), values(source.weights))
    # The optimizer's slots arrive when it builds (deferred restore).
    target.optimizer.build(target.trainable_variables)
    assert same(values(target.optimizer.variables), values(source.optimizer.variables))


class Net(lc.ManagedModel):
    """Subclassed: its layers exist at once, their variables only once it is called."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def architecture(kind):
    """A fresh model of one kind; "sequential-unbuilt" has no Input, so no variables yet."""
    dense = [keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)]
    if kind == "subclassed":
        return Net()
    if kind == "functional":
        inputs = keras.Input((8,))
        return lc.ManagedModel(inputs, dense[1](dense[0](inputs)))
    if kind == "sequential":
        return lc.manage(keras.Sequential([keras.Input((8,)), *dense]))
    return lc.manage(keras.Sequential(dense))


def outputs(model):
    return keras.ops.convert_to_numpy(model(X))


def saved_run(kind, directory):
    """Train a model of `kind`, checkpoint it; its outputs then, and after one more step."""
    source = architecture(kind)
    source.compile(keras.optimizers.Adam(0.01), "mse")
    source.fit(X, Y, epochs=2, batch_size=8, verbose=0)
    source.checkpoints(directory).save()
    saved = outputs(source)
    source.train_on_batch(X, Y)
    stepped = outputs(source)
    source.dispose()
    return saved, stepped


KINDS = ["subclassed", "functional", "sequential", "sequential-unbuilt"]


@pytest.mark.parametrize("optimizer", [False, True], ids=["weights-only", "with-optimizer"])
@pytest.mark.parametrize("kind", KINDS)
def test_restored_model_computes_what_the_saved_one_did(tmp_path, kind, optimizer):
    saved, stepped = saved_run(kind, tmp_path)
    target = architecture(kind)
    if optimizer:
        target.compile(keras.optimizers.Adam(0.01), "mse")
    if not target.built:
        # Restoring into variables Keras has not created yet went wrong silently.
        with pytest.raises(lc.CheckpointError, match="not built yet") as caught:
            lc.restore_checkpoint(target, tmp_path)
        assert "call it on a sample input" in str(caught.value)
        assert "warmup=" in str(caught.value)
        assert not target.built and target.weights == []
        target(X[:1])
    lc.restore_checkpoint(target, tmp_path)
    np.testing.assert_allclose(outputs(target), saved, rtol=1e-6, atol=1e-6)
    paths = [v.path for v in target.weights]
    assert len(paths) == len(set(paths)) == 4, paths
    if optimizer:  # slots and iterations arrive when the optimizer builds
        target.train_on_batch(X, Y)
        np.testing.assert_allclose(outputs(target), stepped, rtol=1e-5, atol=1e-6)


def test_keeper_restore_refuses_an_unbuilt_model_too(tmp_path):
    saved_run("subclassed", tmp_path)
    target = Net()
    with pytest.raises(lc.CheckpointError, match="not built yet"):
        target.checkpoints(tmp_path).restore()
    assert target.weights == []


def test_weights_only_restore_into_a_model_without_optimizer(tmp_path):
    source = stepped()
    prefix = source.checkpoints(tmp_path).save()
    serving = make(compiled=False)
    assert lc.restore_checkpoint(serving, tmp_path) == prefix
    assert same(values(serving.weights), values(source.weights))


def test_strict_restore_names_missing_and_unexpected_objects_and_changes_nothing(tmp_path):
    prefix = stepped().checkpoints(tmp_path).save()
    bigger = make(extra=True, compiled=False)
    before = values(bigger.weights)
    with pytest.raises(lc.CheckpointError, match="missing from the checkpoint") as caught:
        lc.restore_checkpoint(bigger, prefix)
    assert caught.value.missing == tuple(sorted(v.path for v in bigger.layers[2].weights))
    assert same(values(bigger.weights), before)

    smaller = lc.manage(keras.Sequential([keras.Input((8,)), keras.layers.Dense(16)]))
    with pytest.raises(lc.CheckpointError, match="not in the model") as caught:
        lc.restore_checkpoint(smaller, prefix)
    unexpected = caught.value.unexpected  # the second Dense layer's kernel and bias
    assert len(unexpected) == 2 and all(u.startswith("model/") for u in unexpected), unexpected
    assert {u.rsplit("/", 1)[1].strip("_") for u in unexpected} == {"kernel", "bias"}

    # Non-strict restores what matches.
    lc.restore_checkpoint(bigger, prefix, strict=False)
    assert not same(values(bigger.weights)[:4], before[:4])
    assert same(values(bigger.weights)[4:], before[4:])


def test_shape_mismatch_is_refused_even_when_not_strict(tmp_path):
    prefix = stepped().checkpoints(tmp_path).save()
    other = make(units=4)
    before = values(other.weights)
    with pytest.raises(lc.CheckpointError, match="another shape") as caught:
        lc.restore_checkpoint(other, prefix, strict=False)
    assert any("(checkpoint (8, 16), model (8, 4))" in item for item in caught.value.unexpected)
    assert same(values(other.weights), before)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_checkpoint_is_refused_and_the_model_is_unchanged(tmp_path, damage):
    prefix = stepped().checkpoints(tmp_path).save()
    path = data_file(prefix)
    with open(path, "rb") as file:
        raw = bytearray(file.read())
    if damage == "flip":
        raw[100:116] = bytes(b ^ 0xFF for b in raw[100:116])
    else:
        raw = raw[: len(raw) // 2]
    with open(path, "wb") as file:
        file.write(raw)
    target = make()
    target.optimizer.build(target.trainable_variables)
    before = values(target.weights) + values(target.optimizer.variables)
    with pytest.raises(lc.CheckpointError, match="truncated or corrupt") as caught:
        target.checkpoints(tmp_path / "mine").restore(prefix)
    assert prefix in str(caught.value) and caught.value.path == prefix
    assert same(values(target.weights) + values(target.optimizer.variables), before)


def test_missing_checkpoints_are_clear_errors(tmp_path):
    model = make()
    with pytest.raises(lc.CheckpointError, match="No complete checkpoint"):
        model.checkpoints(tmp_path).restore()
    with pytest.raises(lc.CheckpointError, match="does not exist"):
        lc.restore_checkpoint(model, tmp_path / "nowhere" / "ckpt-3")
    with pytest.raises(lc.CheckpointError, match="neither a directory nor"):
        lc.restore_checkpoint(model, tmp_path / "ckpt-3")


def test_keeper_refuses_work_after_dispose(tmp_path):
    model = stepped(steps=1)
    keeper = model.checkpoints(tmp_path)
    keeper.save()
    model.dispose()
    with pytest.raises(lc.ClosedError, match=r"keeper of .* is closed"):
        keeper.save()
    with pytest.raises(lc.DisposedError):
        model.checkpoints(tmp_path)


def test_close_then_a_new_keeper(tmp_path):
    model = stepped(steps=1)
    keeper = model.checkpoints(tmp_path, async_save=True)
    first = keeper.save()
    keeper.close()
    keeper.close()  # idempotent
    assert os.path.exists(first + ".index")
    again = model.checkpoints(tmp_path)
    assert again is not keeper and again.latest == first


def test_open_keepers_are_counted_on_the_record_until_closed_or_disposed(tmp_path):
    model = make()
    assert model.statistics().checkpoint_keepers == 0
    first = model.checkpoints(tmp_path / "a")
    second = model.checkpoints(tmp_path / "b")
    assert model.statistics().checkpoint_keepers == 2
    assert model._lifecycle.keepers == {first.directory: first, second.directory: second}
    assert not any(name.startswith("_lifecycle_keepers") for name in vars(model))
    first.close()
    assert model.statistics().checkpoint_keepers == 1
    model.dispose()
    assert model.statistics().checkpoint_keepers == 0
    with pytest.raises(lc.ClosedError, match=r"keeper of .* is closed"):
        second.save()


@pytest.mark.slow
def test_killed_mid_save_leaves_the_previous_checkpoint_restorable(tmp_path, run_child):
    # The child saves a 256 MiB model twice; a watcher thread kills the process
    # as soon as the second save's files start to appear.
    directory = str(tmp_path)
    out = run_child(
        f"""
        import os, threading, time
        import keras
        import lifecycle as lc
        model = lc.manage(keras.Sequential([keras.Input((4096,)), keras.layers.Dense(16384)]))
        kernel = model.layers[0].kernel
        keeper = model.checkpoints({directory!r})
        kernel.assign(keras.ops.ones_like(kernel))
        print(keeper.save(), flush=True)
        kernel.assign(keras.ops.full_like(kernel, 2.0))

        def kill_when_writing():
            while not any("ckpt-2" in name for name in os.listdir({directory!r})):
                time.sleep(0.002)
            time.sleep(0.02)
            print("killed", flush=True)
            os._exit(0)

        threading.Thread(target=kill_when_writing, daemon=True).start()
        keeper.save()
        print("second save finished", flush=True)
        """,
        timeout=180,
    )
    assert "killed" in out and "second save finished" not in out, out
    first = out.splitlines()[0]
    model = lc.manage(keras.Sequential([keras.Input((4096,)), keras.layers.Dense(16384)]))
    assert lc.restore_checkpoint(model, tmp_path) == first
    assert float(model.layers[0].kernel[0, 0]) == 1.0


# -- a directory that holds checkpoints: nothing another run wrote is lost ------------


def run_one(directory, *, saves=3, max_to_keep=2):
    """An earlier run: ``saves`` saves to ``directory``; its kept prefixes and their weights."""
    model = stepped(steps=1)
    keeper = model.checkpoints(directory, max_to_keep=max_to_keep)
    weights = {}
    for _ in range(saves):
        model.train_on_batch(X, Y)
        weights[keeper.save()] = values(model.weights)
    kept = keeper.list()
    model.dispose()
    return kept, {prefix: weights[prefix] for prefix in kept}


def file_bytes(prefix):
    suffixes = (".index", ".data-00000-of-00001")
    return {suffix: Path(prefix + suffix).read_bytes() for suffix in suffixes}


def test_a_second_keeper_numbers_after_an_earlier_run_and_deletes_none_of_it(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lifecycle.checkpoints")
    kept, weights = run_one(tmp_path)
    assert [os.path.basename(p) for p in kept] == ["ckpt-2", "ckpt-3"]
    before = {prefix: file_bytes(prefix) for prefix in kept}

    keeper = make().checkpoints(tmp_path, max_to_keep=2)
    assert keeper.latest == kept[-1] and keeper.list() == []  # the run's, not this keeper's
    mine = [keeper.save() for _ in range(3)]
    assert [os.path.basename(p) for p in mine] == ["ckpt-4", "ckpt-5", "ckpt-6"]
    assert keeper.step == 6 and keeper.latest == mine[-1]
    assert keeper.list() == mine[1:] and not os.path.exists(mine[0] + ".index")
    assert {prefix: file_bytes(prefix) for prefix in kept} == before  # untouched
    assert "holds checkpoints up to ckpt-3 that this keeper did not write" in caplog.text
    for prefix in kept:  # each still restores what the earlier run saved
        target = make()
        lc.restore_checkpoint(target, prefix)
        assert same(values(target.weights), weights[prefix])


def test_an_explicit_step_that_names_an_existing_checkpoint_is_refused(tmp_path):
    kept, _ = run_one(tmp_path)
    before = file_bytes(kept[-1])
    keeper = make().checkpoints(tmp_path)
    with pytest.raises(lc.CheckpointError) as caught:
        keeper.save(step=3)
    message = str(caught.value)
    assert "ckpt-3' exists already" in message and "never overwrites" in message
    assert "Received: step=3" in message and "step=None" in message and "(ckpt-3)" in message
    assert file_bytes(kept[-1]) == before and keeper.list() == []
    assert keeper.save(step=1).endswith("ckpt-1")  # deleted by the run's retention: free


def test_restore_then_save_continues_the_run_and_its_retention(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lifecycle.checkpoints")
    kept, _ = run_one(tmp_path)
    keeper = make().checkpoints(tmp_path, max_to_keep=2)
    assert keeper.restore() == kept[-1] and keeper.step == 3
    fourth = keeper.save()
    assert fourth.endswith("ckpt-4") and "did not write" not in caplog.text  # nothing skipped
    # Continuing the run: its checkpoints are this keeper's, kept as max_to_keep says.
    assert keeper.list() == [kept[1], fourth] and not os.path.exists(kept[0] + ".index")


def test_a_restore_from_another_directory_adopts_nothing(tmp_path):
    elsewhere, _ = run_one(tmp_path / "elsewhere")
    kept, _ = run_one(tmp_path / "here")
    keeper = make().checkpoints(tmp_path / "here", max_to_keep=1)
    keeper.restore(elsewhere[-1])
    assert keeper.save().endswith("ckpt-4") and keeper.save().endswith("ckpt-5")
    assert all(os.path.exists(prefix + ".index") for prefix in kept + elsewhere)


def test_adopt_existing_lets_retention_delete_the_earlier_run(tmp_path):
    kept, _ = run_one(tmp_path)
    keeper = make().checkpoints(tmp_path, max_to_keep=2)
    assert keeper.adopt_existing() == kept  # oldest first
    assert keeper.adopt_existing() == []  # once
    assert keeper.list() == kept
    fourth = keeper.save()
    assert keeper.list() == [kept[1], fourth]
    assert not os.path.exists(kept[0] + ".index") and os.path.exists(kept[1] + ".index")


def test_two_keepers_in_one_process_cannot_save_to_one_directory_at_once(tmp_path):
    first_model, second_model = stepped(steps=1), make()
    first = first_model.checkpoints(tmp_path)
    written = first.save()
    second = second_model.checkpoints(tmp_path)
    with pytest.raises(lc.CheckpointError) as caught:
        second.save()
    message = str(caught.value)
    assert f"{str(tmp_path)!r} is being saved to by another checkpoint keeper" in message
    assert f"(process {os.getpid()}, this process)" in message and "Close that keeper" in message
    assert caught.value.path == str(tmp_path)
    with pytest.raises(lc.CheckpointError, match="being saved to by another"):
        second.adopt_existing()
    assert second.restore() == written  # reading is not saving
    first.save()
    first_model.dispose()  # closes the first keeper: the lock goes with it
    assert second.save().endswith("ckpt-3")
    second.close()
    assert make().checkpoints(tmp_path).save().endswith("ckpt-4")


@pytest.mark.subprocess
def test_a_keeper_of_another_process_is_refused_naming_this_one(tmp_path, run_child):
    keeper = stepped(steps=1).checkpoints(tmp_path)
    keeper.save()
    out = run_child(
        f"""
        import keras
        import lifecycle as lc
        model = lc.manage(keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]))
        try:
            model.checkpoints({str(tmp_path)!r}).save()
        except lc.CheckpointError as error:
            print("refused:", error)
        """,
        timeout=180,
    )
    assert f"refused: Checkpoint directory {str(tmp_path)!r} is being saved to" in out, out
    assert f"(process {os.getpid()})" in out, out
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".index")) == ["ckpt-1.index"]


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_keeper_whose_process_died_holds_the_directory_no_more(tmp_path, run_child):
    out = run_child(
        f"""
        import os
        import keras
        import lifecycle as lc
        model = lc.manage(keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]))
        print(model.checkpoints({str(tmp_path)!r}).save(), flush=True)
        os._exit(0)  # no close(), no dispose(): the kernel drops the lock
        """,
        timeout=180,
    )
    assert out.strip().endswith("ckpt-1"), out
    assert make().checkpoints(tmp_path).save().endswith("ckpt-2")
