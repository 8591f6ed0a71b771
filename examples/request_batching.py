"""Serve concurrent batch-1 requests with and without request batching.

Sixteen client threads call ``registry.predict`` back to back, first on a version
loaded without batching, then on one loaded with ``batching=lc.BatchingPolicy(...)``:
concurrent requests are merged into one call of the model, and every caller still
gets exactly its own row. The example checks each answer against the model and
prints the throughput of both and how many requests a batch held on average.
Throughput depends on the machine; ``benchmarks/batching.py`` measures it properly.

Last, a version with a bounded queue (``max_enqueued_batches=1``): while one batch
runs and one full batch waits, further callers are refused at once with
``lc.QueueFullError`` (what ``lifecycle serve`` answers with 503 UNAVAILABLE), and the
example counts them.

Run: python examples/request_batching.py
"""

from __future__ import annotations

import threading
import time

import keras
import numpy as np

import lifecycle as lc

CLIENTS = 16


def build() -> keras.Model:
    inputs = keras.Input((256,), name="features")
    hidden = keras.layers.Dense(1024, activation="relu")(inputs)
    hidden = keras.layers.Dense(1024, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(8)(hidden))


def serve(registry: lc.ModelRegistry, version: int, seconds: float) -> tuple[int, int]:
    """``CLIENTS`` threads calling version ``version`` for ``seconds``: (answers, wrong ones)."""
    with registry.lease("scorer", version=version) as model:
        reference = model  # to check every answer against the model itself
        rows = np.random.default_rng(version).random((CLIENTS, 256), dtype=np.float32)
        expected = reference.predict_on_batch(rows)
    counts = [0] * CLIENTS
    wrong = [0] * CLIENTS
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        row = rows[i : i + 1]
        while time.monotonic() < stop:
            answer = registry.predict("scorer", row, version=version).numpy()
            counts[i] += 1
            wrong[i] += not np.allclose(answer, expected[i : i + 1], atol=1e-4)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts), sum(wrong)


def shed(registry: lc.ModelRegistry, version: int) -> tuple[int, int]:
    """``CLIENTS`` threads calling ``version`` at once, 20 times each: (served, refused)."""
    row = np.ones((1, 256), dtype=np.float32)
    served = [0] * CLIENTS
    refused = [0] * CLIENTS
    start = threading.Barrier(CLIENTS)

    def client(i: int) -> None:
        start.wait()
        for _ in range(20):
            try:
                registry.predict("scorer", row, version=version)
                served[i] += 1
            except lc.QueueFullError:
                refused[i] += 1  # a real client retries later, or elsewhere

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(served), sum(refused)


def main(seconds: float = 3.0) -> None:
    policy = lc.BatchingPolicy(max_batch_size=16, allowed_batch_sizes=(1, 2, 4, 8, 16))
    with lc.ModelRegistry() as registry:
        registry.load("scorer", 1, build)  # one model call per request
        registry.load("scorer", 2, build, batching=policy)  # merged calls
        for version in (1, 2):
            answered, wrong = serve(registry, version, seconds)
            mode = "batching" if version == 2 else "one call per request"
            print(f"v{version} ({mode}): {answered / seconds:.0f} requests/s, {wrong} wrong")
        stats = registry.status("scorer")[1].batching
        print(
            f"batches: {stats.batches}, {stats.mean_batch_requests:.1f} requests per batch, "
            f"{stats.padded_rows} padded rows"
        )
        bounded = lc.BatchingPolicy(max_batch_size=2, num_batch_threads=1, max_enqueued_batches=1)
        registry.load("scorer", 3, build, batching=bounded)
        served, refused = shed(registry, 3)
        rejected = registry.status("scorer")[2].batching.rejected
        print(f"bounded queue: {served} served, {refused} refused at once ({rejected} counted)")


if __name__ == "__main__":
    main()
