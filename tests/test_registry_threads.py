"""8 threads serve through the registry while 50 promotions swap versions.

Also with background loads (20 promotions: each load is paced), and over 5
promotions in the fast lane.

Runs in a child process so a crash fails the test instead of the run. Every
version answers its own number, so each answer tells which version served it.
"""

from __future__ import annotations

import json
import sys

import pytest

CHILD = """
import json, threading, time
import keras, numpy as np
import lifecycle as lc

SWAPS, THREADS = {swaps}, 8

def factory(version):
    def build():
        inputs = keras.Input((4,))
        out = keras.layers.Dense(1, kernel_initializer="zeros",
                                 bias_initializer=keras.initializers.Constant(version))(
            keras.layers.Dense(16)(inputs))
        return keras.Model(inputs, out)
    return build

x = np.ones((1, 4), "float32")
requests, failures = [], []
lock = threading.Lock()
stop = threading.Event()
# default_since[v] = (earliest, latest) instants at which v may have become default.
default_since = {1: (0.0, 0.0)}

with lc.ModelRegistry({options}) as registry:
    registry.load("m", 1, factory(1))

    def client(index):
        use_lease = index % 2
        while not stop.is_set():
            started = time.perf_counter()
            try:
                if use_lease:
                    with registry.lease("m") as model:
                        value = float(model.predict_on_batch(x)[0, 0])
                else:
                    value = float(registry.predict("m", x).numpy()[0, 0])
            except Exception as error:
                with lock:
                    failures.append(repr(error)[:300])
                continue
            with lock:
                requests.append((started, time.perf_counter(), value))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for version in range(2, SWAPS + 2):
        registry.load("m", version, factory(version))
        before = time.perf_counter()
        registry.promote("m", version)
        default_since[version] = (before, time.perf_counter())
        registry.unload("m", version - 1)
    # Requests to the last version too: 50 that started after its promotion.
    last = time.perf_counter()
    deadline = time.monotonic() + 60
    try:
        while sum(started >= last for started, _, _ in requests) < 50:
            assert time.monotonic() < deadline, "not 50 requests to the last version in 60 s"
            time.sleep(0.01)
    finally:
        stop.set()
    for thread in threads:
        thread.join(60)
    # A retired version is disposed on the registry's cleaner thread once its last
    # lease returns: on a loaded machine that may trail the last request a little.
    deadline = time.monotonic() + 30
    while len(registry.status()) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [s.version for s in registry.status()]

print(json.dumps({"requests": requests, "failures": failures,
                  "default_since": default_since, "alive": alive}))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("options", "swaps"),
    [
        # The fast lane's: the same checks over a few promotions.
        pytest.param("", 5, id="calling-thread-short"),
        pytest.param("", 25, id="calling-thread", marks=pytest.mark.slow),
        # Background loads: on the loader thread, paced while requests are in flight.
        pytest.param(
            "loader_nice=19, loader_gil_share=0.5",
            10,
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(
                    not sys.platform.startswith("linux"), reason="loader_nice is Linux-only"
                ),
            ],
            id="background",
        ),
    ],
)
def test_threads_serve_through_promotions_without_a_failed_request(run_child, options, swaps):
    child = CHILD.replace("{options}", options).replace("{swaps}", str(swaps))
    out = json.loads(run_child(child, timeout=600).strip().splitlines()[-1])
    assert out["failures"] == []
    since = {int(v): tuple(t) for v, t in out["default_since"].items()}
    last = max(since)
    assert out["alive"] == [last]
    served = set()
    for started, finished, value in out["requests"]:
        version = int(value)
        assert float(version) == value and version in since, value
        # Routable at that moment: it had (maybe) become default before the
        # request finished, and stopped being default (at the next promotion)
        # no earlier than the request started.
        assert since[version][0] <= finished, (version, started, finished)
        if version != last:
            assert since[version + 1][1] >= started, (version, started, finished)
        served.add(version)
    assert len(out["requests"]) > min(1000, 100 * swaps) and len(served) > swaps // 2
