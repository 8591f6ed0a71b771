"""Dispose under MultiWorkerMirroredStrategy: coordinated across two worker processes.

Both workers run in a private network namespace (TensorFlow's servers listen on
every interface); each has a self-exit timer, and the launcher waits with a
timeout and kills them.
"""

from __future__ import annotations

import json

import pytest

LAUNCHER = """
import json, os, subprocess, sys, tempfile
from lifecycle.distribute._cluster import free_ports  # the test harness, not the API
ports = free_ports(2)
cluster = {{"worker": [f"127.0.0.1:{{port}}" for port in ports]}}
tried = os.path.join(tempfile.mkdtemp(), "tried")  # worker 0 made its dispose try
workers = []
for index in range(2):
    env = {{**os.environ, "DISPOSE_TRIED": tried, "TF_CONFIG": json.dumps(
        {{"cluster": cluster, "task": {{"type": "worker", "index": index}}}})}}
    workers.append(subprocess.Popen(
        [sys.executable, "-c", {worker!r}, {mode!r}], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
results = []
for process in workers:
    try:
        out, err = process.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{{")]
    results.append(json.loads(lines[-1]) if lines else {{"error": err[-3000:]}})
print(json.dumps(results))
"""

WORKER = """
import json, os, sys, threading, time
threading.Timer(120, lambda: os._exit(3)).start()
import keras, tensorflow as tf
import lifecycle as lc
from lifecycle import _tf

mode = sys.argv[1]
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    inputs = keras.Input((32,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(4)(keras.layers.Dense(256)(inputs)))
    model.compile(keras.optimizers.Adam(), "mse")


def data():
    return tf.data.Dataset.from_tensors((tf.ones([8, 32]), tf.ones([8, 4]))).repeat()


loss = lc.distribute.train(model, data, steps=3)
leaves = [leaf for v in _tf.keras_variables(model) for leaf in _tf.leaves(v)]
result = {"index": index, "loss": loss, "value_type": type(model.layers[1].kernel.value).__name__}
if mode == "coordinated" or index == 0:
    started = time.monotonic()
    try:
        report = model.dispose(timeout=30 if mode == "coordinated" else 4)
        result["disposed"] = True
        result["bytes_released"] = report.bytes_released
        result["devices"] = [d.device for d in report.devices]
    except lc.CoordinationError as error:
        result["error"] = str(error)
        result["state_after_error"] = model.state.name
        result["shapes_after_error"] = sorted({tuple(l.read_value().shape) for l in leaves})
        report = model.dispose(coordinate=False)
        result["forced_bytes"] = report.bytes_released
    result["seconds"] = time.monotonic() - started
    open(os.environ["DISPOSE_TRIED"], "w").close()
else:  # never disposes: stays up until worker 0's try is over
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["DISPOSE_TRIED"]):
        assert time.monotonic() < deadline, "worker 0 made no dispose try within 60 s"
        time.sleep(0.05)
result["shapes"] = sorted({tuple(l.read_value().shape) for l in leaves})
result["state"] = model.state.name
print(json.dumps(result), flush=True)
os._exit(0)
"""


def run(run_child, mode):
    code = LAUNCHER.format(worker=WORKER, mode=mode)
    return json.loads(run_child(code, timeout=200, private_network=True).strip().splitlines()[-1])


@pytest.mark.subprocess
@pytest.mark.slow
def test_workers_dispose_together(run_child):
    results = run(run_child, "coordinated")
    weights = (32 * 256 + 256 + 256 * 4 + 4) * 4
    for result in results:
        assert "error" not in result, result
        assert result["value_type"] == "MirroredVariable"
        assert result["disposed"] and result["state"] == "DISPOSED"
        assert result["shapes"] == [[0]]
        assert result["bytes_released"] >= 3 * weights  # weights and two Adam slots
        assert all(f"/job:worker/replica:0/task:{result['index']}/" in d for d in result["devices"])


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_worker_disposing_alone_fails_clearly_within_its_timeout(run_child):
    alone, idle = run(run_child, "one-sided")
    assert "did not" in alone["error"] and "coordinate=False" in alone["error"], alone
    assert alone["state_after_error"] == "LIVE"
    assert [0] not in alone["shapes_after_error"]  # nothing was released by the failed try
    assert alone["seconds"] < 30  # the 4 s timeout, not a hang
    assert alone["forced_bytes"] > 0 and alone["state"] == "DISPOSED"
    assert idle["state"] == "LIVE" and [0] not in idle["shapes"]
