"""Dispose under MirroredStrategy releases every replica's component.

Logical devices are fixed per process, so the case runs in a child process.
"""

from __future__ import annotations

import json

import pytest

CHILD = """
import json
import keras, numpy as np, tensorflow as tf
import lifecycle as lc
from lifecycle import _tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    inputs = keras.Input((32,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(8)(keras.layers.Dense(64)(inputs)))
    model.compile(optimizer="adam", loss="mse")
x = np.ones((64, 32), "float32")
model.fit(x, np.ones((64, 8), "float32"), batch_size=16, epochs=1, verbose=0)

kernel = model.layers[1].kernel
components = list(_tf.leaves(kernel))
slots = [v for v in model.optimizer.variables if tuple(v.shape) == (32, 64)]
slot_components = [leaf for slot in slots for leaf in _tf.leaves(slot)]
owned = model.owned_bytes
report = model.dispose()
print(json.dumps({
    "kernel_type": type(kernel.value).__name__,
    "devices": sorted(c.device.split("/")[-1] for c in components),
    "slot_components": len(slot_components),
    "released_shapes": sorted({tuple(c.read_value().shape) for c in components + slot_components}),
    "owned": owned,
    "bytes_released": report.bytes_released,
    "weights_bytes": (32 * 64 + 64 + 64 * 8 + 8) * 4,
}))
"""


@pytest.mark.subprocess
def test_mirrored_dispose_releases_every_replica(run_child):
    out = json.loads(run_child(CHILD, timeout=240).strip().splitlines()[-1])
    assert out["kernel_type"] == "MirroredVariable"
    assert out["devices"] == ["device:CPU:0", "device:CPU:1"]
    assert out["slot_components"] == 4  # 2 Adam slots x 2 replicas
    assert out["released_shapes"] == [[0]]
    assert out["bytes_released"] == out["owned"]
    # Weights and both Adam slots, on each of the 2 replicas, plus small state.
    assert out["bytes_released"] >= 2 * 3 * out["weights_bytes"]
