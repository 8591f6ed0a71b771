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
    "report_devices": [[d.device.split("/")[-1], d.bytes_released] for d in report.devices],
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
    # The report counts them per device: the same on both replicas.
    devices = out["report_devices"]
    assert [d for d, _ in devices] == ["device:CPU:0", "device:CPU:1"]
    assert devices[0][1] == devices[1][1] == out["bytes_released"] // 2


REGISTRY_CHILD = """
import json
import keras, numpy as np, tensorflow as tf
import lifecycle as lc
from lifecycle import _tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

def factory():
    with strategy.scope():
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(3)(inputs))

with strategy.scope():  # manage() of an existing model built under the strategy
    existing = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(5)]))
existing_leaves = list(_tf.model_leaves(existing))
existing_report = existing.dispose()

with lc.ModelRegistry() as registry:
    registry.load("risk", 1, factory)
    answer = registry.predict("risk", np.ones((2, 4), "float32")).shape
    with registry.lease("risk") as model:
        leaves = list(_tf.model_leaves(model))
        value_type = type(model.layers[1].kernel.value).__name__
    registry.unload("risk", 1, wait=True)
print(json.dumps({
    "answer": list(answer),
    "value_type": value_type,
    "leaves": len(leaves),
    "released": sorted({tuple(l.read_value().shape) for l in leaves + existing_leaves}),
    "existing_devices": len(existing_report.devices),
    "existing_leaves": len(existing_leaves),
}))
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_manage_and_registry_under_mirrored(run_child):
    out = json.loads(run_child(REGISTRY_CHILD, timeout=240).strip().splitlines()[-1])
    assert out["answer"] == [2, 3] and out["value_type"] == "MirroredVariable"
    assert out["leaves"] == 4  # kernel and bias on 2 replicas
    assert out["existing_leaves"] == 4 and out["existing_devices"] == 2
    assert out["released"] == [[0]]
