"""Nothing of a disposed, dropped model survives: counted objects, not RSS."""

from __future__ import annotations

import gc

import keras
import numpy as np
import pytest
from tensorflow.python.framework.func_graph import FuncGraph

import lifecycle as lc
from lifecycle import _tf

pytestmark = pytest.mark.usefixtures("keras_state")

X = np.ones((64, 16), "float32")
Y = np.ones((64, 2), "float32")


def live(kind):
    # The cleaner destroys disposed models' traced steps and clears stale kernels.
    cleaner = lc.current_session().cleaner
    if cleaner.strategy is lc.CleanupStrategy.IN_BACKGROUND:
        assert cleaner.wait_idle(30)
    else:
        cleaner.run_pending()
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, kind))


def cycle(dispose, model_class=lc.ManagedModel):
    inputs = keras.Input((16,))
    model = model_class(inputs, keras.layers.Dense(2)(keras.layers.Dense(32)(inputs)))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    model.fit(X, Y, epochs=1, batch_size=16, verbose=0)
    model.predict(X, verbose=0)
    if dispose:
        model.dispose()


def test_dispose_then_drop_leaves_no_graphs_and_no_registry_entries():
    cycle(dispose=True)  # warm-up: Keras and TF create a few process-wide graphs once
    graphs, entries = live(FuncGraph), _tf.custom_gradient_entries()
    for _ in range(3):
        cycle(dispose=True)
    assert live(FuncGraph) == graphs
    assert _tf.custom_gradient_entries() == entries


@pytest.mark.slow  # the control; the managed loop above runs in the fast lane
def test_the_same_loop_with_plain_keras_leaks_graphs():
    # The control case: the model object itself is collected, but the gradient
    # registry keeps each cycle's training graphs (and the buffers they
    # captured) alive. Proves the counts above can see the leak.
    cycle(dispose=False, model_class=keras.Model)
    graphs, entries = live(FuncGraph), _tf.custom_gradient_entries()
    for _ in range(3):
        cycle(dispose=False, model_class=keras.Model)
    assert live(FuncGraph) >= graphs + 3
    assert _tf.custom_gradient_entries() >= entries + 3


RELEASE_UNDER_ANOTHER_DEVICE_CHILD = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from lifecycle import _tf

with tf.device("/CPU:1"):
    far = tf.Variable(tf.ones([64, 64]))
near = tf.Variable(tf.ones([3], tf.int32))
with tf.device("/CPU:0"):  # the caller's scope must not steer the release
    released = _tf.release_by_device([far, near])
print(sorted((device[-5:], count) for device, (_, count) in released.items()))
print(_tf.is_released(far), _tf.is_released(near), tf.shape(far.read_value()).numpy().tolist())
"""


@pytest.mark.subprocess
@pytest.mark.slow  # the mirrored test keeps a release on several devices in the fast lane
def test_a_release_runs_on_each_buffers_device_whatever_the_callers_scope(run_child):
    # Local buffers are released with no device asked for (so the release reuses
    # the kernels their creation built); TensorFlow places each on its buffer's device.
    lines = run_child(RELEASE_UNDER_ANOTHER_DEVICE_CHILD, timeout=240).strip().splitlines()
    assert lines[-2:] == ["[('CPU:0', 1), ('CPU:1', 1)]", "True True [0]"]
