"""The batcher's queue discipline, with plain Python lists for requests: no TensorFlow."""

from __future__ import annotations

import threading
import time

import pytest
from support.waits import wait_until

import lifecycle as lc
from lifecycle._core import Batcher, BatchingPolicy


class Recorder:
    """A batch function that doubles every row and records each batch it ran."""

    def __init__(self, delay: float = 0.0, refuse: object = None) -> None:
        self.batches: list[tuple[list[list[int]], int, str]] = []
        self.delay = delay
        self.refuse = refuse
        self.lock = threading.Lock()

    def __call__(self, items: list[list[int]], pad_to: int) -> list[list[int]]:
        with self.lock:
            self.batches.append((items, pad_to, threading.current_thread().name))
        if any(self.refuse in item for item in items):
            raise ValueError(f"refused {self.refuse}")
        time.sleep(self.delay)
        return [[2 * row for row in item] for item in items]


def run_concurrently(batcher: Batcher, requests: list[list[int]], kinds=None) -> list:
    """Submit every request from a thread of its own, all released at once; their outcomes."""
    outcomes: list = [None] * len(requests)
    start = threading.Barrier(len(requests), timeout=60)

    def call(i: int) -> None:
        start.wait()
        try:
            kind = kinds[i] if kinds else "k"
            outcomes[i] = batcher.submit(requests[i], len(requests[i]), kind)
        except ValueError as error:
            outcomes[i] = error

    threads = [threading.Thread(target=call, args=(i,), name=f"c{i}") for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def lead_then_queue(batcher: Batcher, run: Recorder, call, rows) -> list[threading.Thread]:
    """``call(1)`` leading a batch of its own, ``call(row)`` for ``rows`` queued behind it.

    ``run`` must run a batch long enough for the others to queue. The threads, started.
    """
    leader = threading.Thread(target=call, args=(1,))
    leader.start()
    # Polled every millisecond: the others must queue while the leader's batch runs.
    wait_until(lambda: run.batches, "the leader's batch running", poll=0.001)
    queued = [threading.Thread(target=call, args=(row,)) for row in rows]
    for thread in queued:
        thread.start()
    wait_until(
        lambda: batcher._queued_rows >= len(rows) or len(run.batches) > 1,
        f"{len(rows)} rows queued",
        poll=0.001,
    )
    assert run.batches == run.batches[:1], "the leader's batch ended before the others queued"
    return [leader, *queued]


def test_a_lone_caller_runs_at_once_on_its_own_thread():
    run = Recorder()
    batcher = Batcher(run, BatchingPolicy(max_batch_size=4))
    assert batcher.submit([1, 2], 2, "k") == [2, 4]
    assert run.batches == [([[1, 2]], 2, threading.current_thread().name)]
    stats = batcher.statistics()
    assert (stats.batches, stats.requests, stats.rows, stats.sizes) == (1, 1, 2, {1: 1})


def test_a_lone_caller_whose_call_fails_gets_the_error_and_the_next_caller_leads():
    run = Recorder(refuse=7)
    batcher = Batcher(run, BatchingPolicy(max_batch_size=4, allowed_batch_sizes=(2, 4)))
    with pytest.raises(ValueError, match="refused 7"):
        batcher.submit([7], 1, "k")
    # The failed call gave its lead back: the next caller leads at once, padded as ever.
    assert batcher.submit([1], 1, "k") == [2]
    assert [(items, pad_to) for items, pad_to, _ in run.batches] == [([[7]], 2), ([[1]], 2)]
    stats = batcher.statistics()
    assert (stats.batches, stats.requests, stats.padded_rows, stats.retried) == (2, 2, 2, 0)
    assert batcher._leaders == 0


def test_concurrent_callers_share_batches_and_each_gets_its_own_rows():
    run = Recorder(delay=0.05)  # batches form while one runs
    batcher = Batcher(run, BatchingPolicy(max_batch_size=6))
    requests = [[i] * (1 + i % 3) for i in range(12)]
    outcomes = run_concurrently(batcher, requests)
    assert outcomes == [[2 * row for row in request] for request in requests]
    assert all(sum(len(item) for item in items) <= 6 for items, _, _ in run.batches)
    assert len(run.batches) < len(requests)  # some were merged
    stats = batcher.statistics()
    assert stats.requests == 12 and stats.rows == sum(map(len, requests))
    assert sum(stats.sizes.values()) == stats.batches == len(run.batches)
    assert stats.mean_batch_requests > 1


def test_only_requests_of_one_kind_share_a_batch():
    run = Recorder(delay=0.02)
    batcher = Batcher(run, BatchingPolicy(max_batch_size=64))
    kinds = ["a" if i % 2 else "b" for i in range(10)]
    outcomes = run_concurrently(batcher, [[i] for i in range(10)], kinds)
    assert outcomes == [[2 * i] for i in range(10)]
    for items, _, _ in run.batches:
        assert len({kinds[item[0]] for item in items}) == 1


def test_a_request_larger_than_the_batch_runs_alone_unpadded():
    run = Recorder()
    batcher = Batcher(run, BatchingPolicy(max_batch_size=4, allowed_batch_sizes=(2, 4)))
    assert batcher.submit(list(range(7)), 7, "k") == [2 * i for i in range(7)]
    assert run.batches[0][:2] == ([list(range(7))], 7)


def test_batches_are_padded_up_to_the_next_allowed_size():
    policy = BatchingPolicy(max_batch_size=8, allowed_batch_sizes=(1, 4, 8))
    assert [policy.padded(n) for n in (1, 2, 4, 5, 8, 9)] == [1, 4, 4, 8, 8, 9]
    run = Recorder()
    batcher = Batcher(run, policy)
    batcher.submit([1, 2, 3], 3, "k")
    assert run.batches[0][1] == 4
    assert batcher.statistics().padded_rows == 1


def test_a_failed_batch_runs_each_request_alone_so_only_the_bad_one_fails():
    run = Recorder(delay=0.02, refuse=5)
    batcher = Batcher(run, BatchingPolicy(max_batch_size=64))
    outcomes = run_concurrently(batcher, [[i] for i in range(8)])
    assert isinstance(outcomes[5], ValueError) and "refused 5" in str(outcomes[5])
    assert [o for i, o in enumerate(outcomes) if i != 5] == [[2 * i] for i in range(8) if i != 5]


def test_the_timeout_waits_for_a_fuller_batch():
    run = Recorder()
    batcher = Batcher(run, BatchingPolicy(max_batch_size=4, batch_timeout_micros=300_000))
    outcomes = run_concurrently(batcher, [[i] for i in range(4)])
    assert outcomes == [[2 * i] for i in range(4)]
    # The first leader waited for the others (up to 0.3 s): fewer batches than requests.
    assert len(run.batches) < 4


def test_callers_in_a_loop_come_back_to_one_full_batch():
    # Each client works 20 ms between its requests, longer than a batch runs:
    # without the return wait, the callers one batch served are still away when
    # the next batch is taken, and batches of 1 and 3 take turns.
    run = Recorder(delay=0.01)
    batcher = Batcher(run, BatchingPolicy(max_batch_size=8, return_wait=100.0))  # <= 1 s
    start = threading.Barrier(4, timeout=60)

    def client(c: int) -> None:
        start.wait()
        for j in range(6):
            assert batcher.submit([c, j], 2, "k") == [2 * c, 2 * j]
            time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    sizes = batcher.statistics().sizes
    assert sum(n * count for n, count in sizes.items()) == 24
    assert sizes.get(4, 0) >= 4, sizes  # after the first two, every batch holds all four


def test_a_lone_caller_never_waits_for_a_caller_to_return():
    run = Recorder(delay=0.05)
    batcher = Batcher(run, BatchingPolicy(max_batch_size=8, return_wait=20.0))  # <= 1 s
    for i in range(3):
        started = time.perf_counter()
        assert batcher.submit([i], 1, "k") == [2 * i]
        assert time.perf_counter() - started < 0.5  # it is the only caller returning


def test_callers_that_do_not_return_are_waited_for_at_most_return_wait_runs():
    run = Recorder(delay=0.2)
    batcher = Batcher(run, BatchingPolicy(max_batch_size=8, return_wait=1.5))
    outcomes: dict[int, object] = {}

    def call(row: int) -> None:
        outcomes[row] = batcher.submit([row], 1, "k")

    for thread in lead_then_queue(batcher, run, call, (2, 3)):
        thread.join(timeout=30)
    assert outcomes == {1: [2], 2: [4], 3: [6]}
    assert [items for items, _, _ in run.batches] == [[[1]], [[2], [3]]]
    # Rows 2 and 3 were served together and their threads ended: a new caller
    # waits for one of them (up to 1.5 x the 0.2 s batch), then runs alone.
    started = time.perf_counter()
    assert batcher.submit([4], 1, "k") == [8]
    assert 0.45 <= time.perf_counter() - started < 3.0
    assert [items for items, _, _ in run.batches][-1] == [[4]]


def test_many_threads_many_rounds_never_lose_or_mix_a_request():
    run = Recorder()
    batcher = Batcher(run, BatchingPolicy(max_batch_size=5))
    failures: list[str] = []

    def client(c: int) -> None:
        for j in range(200):
            request = [c * 1000 + j] * (1 + (c + j) % 3)
            if batcher.submit(request, len(request), "k") != [2 * r for r in request]:
                failures.append(f"{c}/{j}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures and not any(t.is_alive() for t in threads)
    assert batcher.statistics().requests == 1600


def test_a_full_queue_refuses_a_request_at_once_and_counts_it():
    run = Recorder(delay=0.5)
    policy = BatchingPolicy(max_batch_size=2, num_batch_threads=1, max_enqueued_batches=1)
    batcher = Batcher(run, policy)
    outcomes: dict[int, object] = {}

    def call(row: int) -> None:
        outcomes[row] = batcher.submit([row], 1, "k")

    threads = lead_then_queue(batcher, run, call, (2, 3))  # the leader's batch runs 0.5 s
    started = time.perf_counter()
    with pytest.raises(lc.QueueFullError, match="2 rows are waiting") as caught:
        batcher.submit([4], 1, "k")  # one batch of 2 rows waits already: full
    assert time.perf_counter() - started < 0.25  # refused at once, not after the batch
    assert "max_enqueued_batches=1" in str(caught.value)
    for thread in threads:
        thread.join(timeout=30)
    assert outcomes == {1: [2], 2: [4], 3: [6]}
    assert [items for items, _, _ in run.batches] == [[[1]], [[2], [3]]]
    stats = batcher.statistics()
    assert (stats.rejected, stats.requests) == (1, 3)
    # Once the queue has drained, requests are taken again.
    assert batcher.submit([5], 1, "k") == [10]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_batch_size": 0}, "`max_batch_size` must be an integer >= 1"),
        ({"max_enqueued_batches": 0}, "`max_enqueued_batches` must be an integer >= 1 or None"),
        ({"batch_timeout_micros": -1}, "`batch_timeout_micros` must be an integer >= 0"),
        ({"allowed_batch_sizes": (4, 2, 8), "max_batch_size": 8}, "strictly ascending"),
        ({"allowed_batch_sizes": (2, 4)}, "must be `max_batch_size` (32)"),
        ({"return_wait": -0.5}, "`return_wait` must be a finite number >= 0"),
        ({"return_wait": float("nan")}, "`return_wait` must be a finite number >= 0"),
        ({"return_wait": float("inf")}, "`return_wait` must be a finite number >= 0"),
        ({"return_wait": True}, "`return_wait` must be a finite number >= 0"),
    ],
)
def test_bad_policies_are_refused(kwargs, fragment):
    with pytest.raises(ValueError) as caught:
        BatchingPolicy(**kwargs)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (3, 1), (4, 2), (16, 8)])
def test_by_default_one_batch_runs_per_two_cores(monkeypatch, cores, threads):
    from lifecycle._core import _batcher

    monkeypatch.setattr(_batcher, "_cores", lambda: cores)
    assert BatchingPolicy().num_batch_threads == threads
