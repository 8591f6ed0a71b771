"""The checkpoint internals fail loudly, naming what moved, when TensorFlow moves them."""

from __future__ import annotations

import atexit
import os
import weakref

import keras
import pytest
import tensorflow as tf
from tensorflow.python.checkpoint import async_checkpoint_helper
from tensorflow.python.checkpoint import checkpoint as checkpoint_lib
from tensorflow.python.ops import resource_variable_ops

import lifecycle as lc
from lifecycle._tf import _checkpoint, _compat, _purge

Helper = async_checkpoint_helper.AsyncCheckpointHelper
unregister = atexit.unregister  # a test replaces it


@pytest.fixture
def helpers(monkeypatch):
    """Every async helper created in the test; stopped at the end, whatever moved."""
    created = []  # weak: a helper that was let go of must be collectable
    original = Helper.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(weakref.ref(self))

    monkeypatch.setattr(Helper, "__init__", init)
    yield created
    for helper in (ref() for ref in created):
        if helper is None:
            continue
        for name in ("_initialized", "_object_map"):
            if f"moved{name}" in vars(helper):
                setattr(helper, name, vars(helper).pop(f"moved{name}"))
        unregister(helper._join_async_save_thread)
        if helper._initialized:
            helper._join_async_save_thread()


def moved_after_first_save(monkeypatch, name):
    """Make TensorFlow's helper keep `name` under another attribute name."""
    original = Helper._ensure_initialized

    def ensure_initialized(self):
        original(self)
        setattr(self, f"moved{name}", vars(self).pop(name))

    monkeypatch.setattr(Helper, "_ensure_initialized", ensure_initialized)


def fails_naming(internal):
    with pytest.raises(lc.CompatibilityError) as caught:
        _checkpoint.self_check()
    message = str(caught.value)
    assert internal in message, message
    assert f"TensorFlow {tf.__version__} and Keras {keras.__version__}" in message, message
    return message


def test_self_check_passes_and_is_part_of_the_compatibility_check(helpers):
    _checkpoint.self_check()
    assert len(helpers) == 1 and helpers[0]() is None  # shut down and let go of
    assert any(check is _checkpoint.self_check for _, check in _compat._CHECKS)


def test_inner_variable_copy_moved(helpers, monkeypatch):
    base = resource_variable_ops.BaseResourceVariable
    monkeypatch.delattr(base, "_copy_trackable_to_cpu")
    fails_naming("tf.Variable._copy_trackable_to_cpu")


def test_join_of_the_save_thread_moved(helpers, monkeypatch):
    monkeypatch.delattr(Helper, "_join_async_save_thread")
    fails_naming("AsyncCheckpointHelper._join_async_save_thread")


def test_checkpoint_async_helper_attribute_moved(helpers, monkeypatch):
    original = checkpoint_lib.Checkpoint.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.__dict__["moved_async_checkpointer_impl"] = vars(self).pop("_async_checkpointer_impl")

    monkeypatch.setattr(checkpoint_lib.Checkpoint, "__init__", init)
    fails_naming("tf.train.Checkpoint._async_checkpointer_impl")


def test_helper_initialized_flag_moved(helpers, monkeypatch):
    moved_after_first_save(monkeypatch, "_initialized")
    fails_naming("AsyncCheckpointHelper._initialized")


def test_helper_host_copies_moved(helpers, monkeypatch):
    moved_after_first_save(monkeypatch, "_object_map")
    fails_naming("AsyncCheckpointHelper._object_map")


def test_helper_no_longer_calls_the_instance_hook(helpers, monkeypatch):
    # As if TensorFlow copied through the class: the hook on the instance would
    # be skipped and the second async save would fail again.
    monkeypatch.setattr(_checkpoint, "fix_async_copy", lambda variables: 0)
    fails_naming("AsyncCheckpointHelper calling _copy_trackable_to_cpu on each variable")


def test_atexit_hook_no_longer_removable(helpers, monkeypatch):
    # As if TensorFlow registered another callable than the one unregistered:
    # the hook would hold the helper, its copies and the model until exit.
    monkeypatch.setattr(atexit, "unregister", lambda function: None)
    fails_naming("the atexit hook of AsyncCheckpointHelper")


def test_object_graph_key_moved(helpers, monkeypatch):
    monkeypatch.setattr(_checkpoint, "OBJECT_GRAPH_KEY", "_MOVED_OBJECT_GRAPH")
    fails_naming("checkpoint key '_MOVED_OBJECT_GRAPH'")


def test_children_by_local_name_moved(helpers, monkeypatch):
    monkeypatch.setattr(_checkpoint, "children", lambda obj: {})
    fails_naming("tf.train.TrackableView.children")


def test_a_moved_internal_fails_the_keeper_loudly_not_silently(tmp_path, helpers, monkeypatch):
    model = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    moved_after_first_save(monkeypatch, "_object_map")
    keeper = model.checkpoints(tmp_path, async_save=True)
    keeper.save()
    with pytest.raises(lc.CompatibilityError, match=r"AsyncCheckpointHelper\._object_map"):
        keeper.close()


def test_restore_checkpoint_runs_the_compatibility_check_first(tmp_path, monkeypatch):
    model = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    monkeypatch.setattr(_compat, "_report", None)
    monkeypatch.setattr(_purge, "registry", lambda: [])
    with pytest.raises(lc.CompatibilityError, match=r"ops\._gradient_registry"):
        lc.restore_checkpoint(model, tmp_path / "nowhere")  # not a CheckpointError


def test_retention_candidates_moved_fail_the_keeper_loudly(tmp_path, monkeypatch):
    original = tf.train.CheckpointManager.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._moved_maybe_delete = vars(self).pop("_maybe_delete")

    monkeypatch.setattr(tf.train.CheckpointManager, "__init__", init)
    model = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    keeper = model.checkpoints(tmp_path)
    for _ in range(2):  # each time: never a manager that might delete another run's files
        with pytest.raises(lc.CompatibilityError) as caught:
            keeper.save()
    message = str(caught.value)
    assert "tf.train.CheckpointManager._maybe_delete" in message, message
    assert f"TensorFlow {tf.__version__} and Keras {keras.__version__}" in message, message
    assert not any(name.endswith(".index") for name in os.listdir(tmp_path))
    model.dispose()
