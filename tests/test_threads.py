"""Many threads call a model while another thread disposes it.

Freeing buffers under a running graph call crashes the process, so each case
runs in a child process: a crash fails the test with the child's exit signal
instead of taking the test run down. Every call must either return the correct
result or raise DisposedError.
"""

from __future__ import annotations

import json

import pytest

CHILD = """
import json, sys, threading, time
import keras, numpy as np, tensorflow as tf
import lifecycle as lc

PATH, TRIALS, THREADS = sys.argv[1], int(sys.argv[2]), 16
x = np.random.default_rng(0).normal(size=(32, 64)).astype("float32")
totals = {"ok": 0, "disposed": 0, "wrong": 0, "other": []}

for trial in range(TRIALS):
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(512, activation="relu")(inputs)
    model = lc.ManagedModel(inputs, keras.layers.Dense(8)(hidden))
    expected = model.predict_on_batch(x)  # traces predict_function once
    serve = lc.serving_function(model, tf.TensorSpec([None, 64], tf.float32))
    serve(x)
    paths = {
        "eager": lambda: model(x),
        "predict_on_batch": lambda: model.predict_on_batch(x),
        "serving_function": lambda: serve(x),
    }
    calls = [paths[p] for p in PATH.split(",")]
    started = threading.Barrier(THREADS + 1, timeout=60)
    lock = threading.Lock()

    def worker(call):
        started.wait()
        while True:
            try:
                result = np.asarray(call())
            except lc.DisposedError:
                with lock:
                    totals["disposed"] += 1
                return
            except Exception as exc:
                with lock:
                    totals["other"].append(repr(exc)[:300])
                return
            with lock:
                totals["ok" if np.allclose(result, expected, atol=1e-5) else "wrong"] += 1

    threads = [threading.Thread(target=worker, args=(calls[i % len(calls)],))
               for i in range(THREADS)]
    for thread in threads:
        thread.start()
    started.wait()
    deadline = time.monotonic() + 60
    while totals["ok"] < 20 * (trial + 1):  # calls answered before the dispose
        assert time.monotonic() < deadline, f"20 calls not answered within 60 s: {totals}"
        time.sleep(0.001)
    report = model.dispose(timeout=30)
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert report.bytes_released == (64 * 512 + 512 + 512 * 8 + 8) * 4, report

print(json.dumps(totals))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "path",
    [pytest.param("eager,predict_on_batch", marks=pytest.mark.slow), "serving_function"],
)
def test_threads_calling_while_another_disposes_never_crash(path, tmp_path, run_child):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = run_child(
        f"import runpy, sys; sys.argv = ['child', {path!r}, '8']; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')",
        timeout=300,
    )
    totals = json.loads(out.strip().splitlines()[-1])
    assert totals["other"] == [] and totals["wrong"] == 0, totals
    # Every one of the 16 threads of each of the 8 trials ended on DisposedError.
    assert totals["disposed"] == 16 * 8
    assert totals["ok"] >= 20 * 8
