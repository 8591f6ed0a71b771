"""Ray Tune on a two-node cluster: each node's trials dispose every model they build.

``ray.cluster_utils.Cluster`` starts two nodes of one CPU each on this machine
(a head and a worker node, each its own raylet), so a sweep's trials land on
both. What each worker process did is sent to a named observer actor after the
managed trainable's ``stop()`` or ``reset()`` ran (a mixin in front of it).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import keras
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray import tune  # noqa: E402 (after the skip)
from ray.cluster_utils import Cluster  # noqa: E402
from support.ray_trials import PYTHON_PATH, Observed, Observer, send  # noqa: E402

from lifecycle.integrations.ray import managed_trainable  # noqa: E402

MIB = 1 << 20


def train(config: dict[str, Any]) -> None:
    send(config["observer"], "start")
    # A reused worker runs a trial in about a second, less than a worker takes to
    # start: each trial waits (bounded) until both nodes have one running.
    observer, deadline = ray.get_actor(config["observer"]), time.monotonic() + 60
    while ray.get(observer.nodes.remote()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    rng = np.random.default_rng(config["seed"])
    x = rng.standard_normal((64, 8), dtype=np.float32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    loss = model.fit(x, x.sum(axis=1), epochs=1, verbose=0).history["loss"][-1]
    tune.report({"loss": float(loss), "node": ray.get_runtime_context().get_node_id()})


@pytest.fixture(scope="module")
def two_nodes():
    node = {"num_cpus": 1, "object_store_memory": 80 * MIB}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        ray.init(
            address=cluster.address,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {"PYTHONPATH": PYTHON_PATH, "TF_CPP_MIN_LOG_LEVEL": "2"}},
        )
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_trials_on_both_nodes_dispose_all_their_models(two_nodes, tmp_path):
    name = f"observer-{uuid.uuid4().hex[:8]}"
    observer = Observer.options(name=name).remote()
    trainable = managed_trainable(train)
    trainable.__mixins__ = (Observed, *trainable.__mixins__)
    results = tune.Tuner(
        trainable,
        param_space={"seed": tune.grid_search([0, 1, 2, 3]), "observer": name},
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert not results.errors
    nodes = set(results.get_dataframe()["node"])
    assert len(nodes) == 2, f"the trials ran on {len(nodes)} node(s)"
    events = ray.get(observer.all.remote())
    ray.kill(observer)
    starts = [event for event in events if event["kind"] == "start"]
    assert [event["models_live"] for event in starts] == [0] * 4
    stops = [event for event in events if event["kind"] == "stop"]
    assert {event["node"] for event in stops} == nodes
    for stop in stops:
        ran = [e for e in starts if e["pid"] == stop["pid"]]
        assert ran and all(e["node"] == stop["node"] for e in ran)
        assert stop["trials"] == stop["models_built"] == stop["models_disposed"] == len(ran)
        assert stop["models_live"] == 0 and stop["bytes_released"] > 0
    assert sum(stop["trials"] for stop in stops) == 4
