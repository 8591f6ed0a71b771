"""Dispose under ParameterServerStrategy releases the variables on the parameter server.

The cluster (a parameter server and a worker in their own processes, this
child as the chief) runs in a private network namespace: TensorFlow's servers
listen on every interface.
"""

from __future__ import annotations

import json

import pytest

CHILD = """
import json, sys
import keras, tensorflow as tf
import lifecycle as lc
from lifecycle import _tf
from lifecycle.distribute._cluster import LocalCluster  # the test harness, not the API

partitioned = {partitioned}
MiB = 2**20
with LocalCluster(workers=1, ps=1, lifetime=200) as cluster:
    partitioner = (
        tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=1 << 20, max_shards=2)
        if partitioned else None)
    strategy = tf.distribute.ParameterServerStrategy(
        cluster.resolver, variable_partitioner=partitioner)
    baseline = cluster.rss_bytes("ps")
    rows = []
    for generation in range(2):
        with strategy.scope():
            inputs = keras.Input((512,))
            model = lc.ManagedModel(
                inputs, keras.layers.Dense(4)(keras.layers.Dense(8192)(inputs)))
            model.compile(keras.optimizers.Adam(), "mse")

        def data():
            return tf.data.Dataset.from_tensors(
                (tf.ones([8, 512]), tf.ones([8, 4]))).repeat()

        if partitioned:
            # Keras 3's optimizers cannot update sharded variables: build the
            # slots and check that train() says so.
            with strategy.scope():
                model.optimizer.build(model.trainable_variables)
            try:
                lc.distribute.train(model, data, steps=1)
                loss = "trained"
            except NotImplementedError as error:
                loss = 0.0 if "cannot update sharded variables" in str(error) else str(error)
        else:
            loss = lc.distribute.train(model, data, steps=3)
        kernel = model.layers[1].kernel
        leaves = [leaf for v in _tf.keras_variables(model) for leaf in _tf.leaves(v)]
        trained = cluster.rss_bytes("ps")
        report = model.dispose()
        released = cluster.rss_bytes("ps")
        rows.append(dict(
            loss=loss,
            value_type=type(kernel.value).__name__,
            kernel_leaves=len(list(_tf.leaves(kernel))),
            leaf_devices=sorted({{leaf.device for leaf in leaves}}),
            shapes=sorted({{tuple(leaf.read_value().shape) for leaf in leaves}}),
            bytes_released=report.bytes_released,
            devices=[[d.device, d.bytes_released, d.variables_released] for d in report.devices],
            trained_mib=(trained - baseline) / MiB,
            after_mib=(released - baseline) / MiB,
            baseline_mib=baseline / MiB,
        ))
    # A registry serving a model whose variables live on the parameter server.
    def factory():
        with strategy.scope():
            inputs = keras.Input((4,))
            return keras.Model(inputs, keras.layers.Dense(3)(inputs))

    with lc.ModelRegistry() as registry:
        registry.load("risk", 1, factory)
        served = list(registry.predict("risk", tf.ones([2, 4])).shape)
        with registry.lease("risk") as model:
            served_leaves = list(_tf.model_leaves(model))
        registry.unload("risk", 1, wait=True)
    rows[-1]["served"] = served
    rows[-1]["served_devices"] = sorted({{leaf.device for leaf in served_leaves}})
    rows[-1]["served_released"] = sorted(
        {{tuple(leaf.read_value().shape) for leaf in served_leaves}})
print(json.dumps(rows))
"""


@pytest.mark.subprocess
# Three processes importing TensorFlow at once: 15-60 s on 2 busy cores. The
# fast lane runs a private network in test_network.py and tf.distribute in
# test_mirrored.py.
@pytest.mark.slow
@pytest.mark.parametrize("partitioned", [False, True], ids=["whole", "sharded"])
def test_parameter_server_dispose_releases_remote_variables(run_child, partitioned):
    out = run_child(
        CHILD.format(partitioned=partitioned), timeout=240, private_network=True
    ).strip()
    rows = json.loads(out.splitlines()[-1])
    weights = (512 * 8192 + 8192 + 8192 * 4 + 4) * 4
    for row in rows:
        assert isinstance(row["loss"], float) and row["loss"] == row["loss"], row["loss"]
        assert row["value_type"] == ("ShardedVariable" if partitioned else "CachingVariable")
        assert row["kernel_leaves"] == (2 if partitioned else 1)
        assert row["shapes"] == [[0]]  # every leaf, wherever it is, reads back released
        on_ps = {d[0].split("/device")[0]: d[1] for d in row["devices"]}["/job:ps/replica:0/task:0"]
        if partitioned:
            # Keras 3.15 puts the optimizer slots of a sharded variable on the
            # chief, unsharded; dispose releases them there.
            assert on_ps >= weights
            assert sum(d[1] for d in row["devices"]) >= 3 * weights
        else:
            # Weights and both Adam slots, all on the parameter server.
            assert all(d.startswith("/job:ps/") for d in row["leaf_devices"]), row
            assert on_ps == row["bytes_released"] >= 3 * weights
        # The PS process gave the memory back: within 5 % of its pre-model RSS,
        # after growing by at least what was released there.
        assert row["trained_mib"] >= on_ps / 2**20 * 0.9, row
        assert row["after_mib"] <= 0.05 * row["baseline_mib"], row
    served = rows[-1]
    assert served["served"] == [2, 3] and served["served_released"] == [[0]]
    assert all(d.startswith("/job:ps/") for d in served["served_devices"]), served


@pytest.mark.subprocess
@pytest.mark.slow
def test_example_ps_memory_is_flat_with_dispose_and_grows_without(run_child):
    out = run_child(
        "import sys, runpy; sys.argv = ['x', '--generations', '3'];"
        "runpy.run_path('examples/parameter_server_lifecycle.py', run_name='__main__')",
        timeout=240,
    )
    line = next(ln for ln in out.splitlines() if ln.startswith("PS growth per generation"))
    numbers = [float(word) for word in line.replace("(", " ").split() if word[0] in "+-0123456789"]
    kept, leaked, model = numbers[0], numbers[1], numbers[2]
    assert leaked >= 0.9 * model, out  # plain Keras: the PS keeps every generation
    assert kept <= 0.25 * model, out  # dispose(): flat
