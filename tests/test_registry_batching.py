"""ModelRegistry(load(..., batching=...)): concurrent requests merged, and every promise kept."""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest
from support.models import constant

import lifecycle as lc

POLICY = lc.BatchingPolicy(max_batch_size=8, allowed_batch_sizes=(2, 4, 8))


def linear():
    x = keras.Input((4,), name="x")
    return keras.Model(x, keras.layers.Dense(3)(x))


def embedding():
    ids = keras.Input((1,), name="ids", dtype="int64")
    return keras.Model(ids, keras.layers.Embedding(5, 2)(ids))


def hammer(clients: int, calls: int, request) -> list[str]:
    """``request(client, call)`` from ``clients`` threads released together; failures."""
    failures: list[str] = []
    start = threading.Barrier(clients, timeout=60)

    def client(c: int) -> None:
        start.wait()
        for j in range(calls):
            try:
                problem = request(c, j)
            except Exception as error:  # every failure is reported, none is expected
                problem = f"{type(error).__name__}: {error}"
            if problem:
                failures.append(f"client {c} call {j}: {problem}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return failures


def traces(registry: lc.ModelRegistry, name: str, version: int) -> int:
    """How often the version's serving function was traced."""
    serve = registry._table.find(name, version).serve
    return serve.serve._function.experimental_get_tracing_count()


def test_every_caller_gets_exactly_its_own_rows():
    with lc.ModelRegistry() as registry:
        registry.load("m", 1, linear, batching=POLICY)
        with registry.lease("m") as model:
            kernel, bias = model.get_weights()
        traced = traces(registry, "m", 1)
        rng = np.random.default_rng(0)

        def request(c: int, j: int) -> str | None:
            rows = 1 + (c + j) % 3  # 1-3 rows: batches that no row count divides
            x = rng.random((rows, 4), dtype=np.float32) + c
            out = registry.predict("m", x).numpy()
            if out.shape != (rows, 3) or not np.allclose(out, x @ kernel + bias, atol=1e-4):
                return f"wrong rows {out.shape}"
            return None

        assert hammer(8, 40, request) == []
        stats = registry.status("m")[0].batching
        assert stats.requests == 8 * 40 and stats.batches < stats.requests  # merged
        assert set(stats.sizes) - {1} and stats.padded_rows > 0
        assert traces(registry, "m", 1) == traced  # no retracing under load


def test_named_inputs_and_the_infer_path_batch_too():
    with lc.ModelRegistry() as registry:
        registry.load("m", 1, constant(7.0, input_name="x"), batching=POLICY)

        def request(c: int, j: int) -> str | None:
            answer = registry.infer("m", {"x": np.full((1 + c % 2, 4), c, "float32")})
            values = answer.outputs["output_0"]
            return None if values.shape == (1 + c % 2, 1) and (values == 7.0).all() else "wrong"

        assert hammer(6, 20, request) == []
        assert registry.status("m")[0].batching.requests == 120


def test_infer_feeds_a_batched_version_arrays_made_once(monkeypatch):
    # infer() converts named inputs once, to arrays: a batch merges arrays, so a tensor
    # would be turned back into an array and into a tensor again for a lone caller.
    with lc.ModelRegistry() as registry:
        registry.load("m", 1, constant(7.0, input_name="x"), batching=POLICY)
        batched = registry._table.find("m", 1).serve
        fed: list[object] = []
        prepare = batched._prepare
        monkeypatch.setattr(
            batched, "_prepare", lambda inputs: fed.append(inputs) or prepare(inputs)
        )
        answer = registry.infer("m", {"x": [[1, 2, 3, 4]]})
        np.testing.assert_allclose(answer.outputs["output_0"], [[7.0]])
        [value] = fed
        assert type(value) is np.ndarray and value.dtype == np.float32, value
        assert registry.status("m")[0].batching.requests == 1  # it joined a batch


def test_string_inputs_batch_through_tensorflows_own_conversion():
    # Strings have no NumPy dtype of their own: a batch of them takes the full call.
    def lookup():
        words = keras.Input((1,), name="words", dtype="string")
        return keras.Model(words, keras.layers.StringLookup(vocabulary=["a", "b", "c"])(words))

    ids = {"a": 1, "b": 2, "c": 3, "z": 0}  # "z" is out of the vocabulary
    merging = lc.BatchingPolicy(max_batch_size=8, batch_timeout_micros=20_000)
    with lc.ModelRegistry() as registry:
        registry.load("lookup", 1, lookup, batching=merging)
        assert registry._table.find("lookup", 1).serve.serve._flat_arrays is False

        def request(c: int, j: int) -> str | None:
            word = "abcz"[(c + j) % 4]
            out = registry.predict("lookup", np.array([[word]], dtype=object)).numpy()
            return None if out.tolist() == [[ids[word]]] else f"{word!r} -> {out.tolist()}"

        assert hammer(4, 10, request) == []
        assert set(registry.status("lookup")[0].batching.sizes) - {1}  # some merged


def test_a_bad_request_fails_alone_and_the_others_succeed():
    # One batch at a time, each waiting for the others: the bad ids share their batch.
    merging = lc.BatchingPolicy(max_batch_size=8, batch_timeout_micros=100_000, num_batch_threads=1)
    with lc.ModelRegistry() as registry:
        registry.load("ids", 1, embedding, batching=merging)

        def request(c: int, j: int) -> str | None:
            if c == 0 and j % 5 == 0:  # an id the embedding's own gather refuses
                with pytest.raises(Exception, match="indices"):
                    registry.predict("ids", np.array([[7]], "int64"))
                return None
            if c == 1 and j % 5 == 0:  # a shape the signature refuses
                with pytest.raises((TypeError, ValueError)):
                    registry.predict("ids", np.zeros((1, 2), "int64"))
                return None
            out = registry.predict("ids", np.array([[c % 5]], "int64")).numpy()
            return None if out.shape == (1, 1, 2) else f"shape {out.shape}"

        assert hammer(6, 20, request) == []
        assert registry.status("ids")[0].batching.retried > 0


def test_batches_never_mix_versions_during_swaps():
    with lc.ModelRegistry() as registry:
        registry.load("m", 1, constant(1.0, input_name="x"), batching=POLICY)
        stop = threading.Event()

        def request(c: int, j: int) -> str | None:
            answer = registry.infer("m", {"x": np.zeros((1, 4), "float32")})
            value = float(answer.outputs["output_0"][0, 0])
            return None if value == float(answer.version) else f"v{answer.version} said {value}"

        def swaps() -> None:
            version = 1
            while not stop.is_set() and version < 6:
                registry.load(
                    "m", version + 1, constant(version + 1.0, input_name="x"), batching=POLICY
                )
                registry.promote("m", version + 1)
                registry.unload("m", version)  # drains, then disposes
                version += 1

        swapper = threading.Thread(target=swaps)
        swapper.start()
        try:
            failures = hammer(6, 60, request)
        finally:
            stop.set()
            swapper.join(timeout=120)
        assert failures == []


def test_unload_under_batched_load_waits_for_the_batch_and_never_crashes():
    with lc.ModelRegistry(drain_timeout=30) as registry:
        registry.load("m", 1, constant(1.0, input_name="x"), batching=POLICY)
        registry.load("m", 2, constant(2.0, input_name="x"), batching=POLICY)

        def request(c: int, j: int) -> str | None:
            if c == 0 and j == 10:
                registry.promote("m", 2)
                registry.unload("m", 1, wait=True)  # with requests of v1 in batches
                return None
            value = float(registry.predict("m", np.zeros((1, 4), "float32")).numpy()[0, 0])
            return None if value in (1.0, 2.0) else f"said {value}"

        assert hammer(6, 40, request) == []
        assert [s.version for s in registry.status("m")] == [2]


def test_watched_versions_batch_and_bad_arguments_are_refused(tmp_path):
    keras_dir = tmp_path / "m" / "1"
    keras_dir.mkdir(parents=True)
    constant(3.0, input_name="x")().save(keras_dir / "model.keras")
    with lc.ModelRegistry() as registry:
        registry.watch("m", tmp_path / "m", batching=POLICY)
        assert registry.status("m")[0].batching is not None
        registry.load("plain", 1, linear)
        assert registry.status("plain")[0].batching is None
        with pytest.raises(TypeError, match="BatchingPolicy"):
            registry.load("bad", 1, linear, batching={"max_batch_size": 8})
