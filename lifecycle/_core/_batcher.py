"""Adaptive request batching: concurrent calls merged into one, without a batching thread.

The callers themselves run the batches (leader/follower). A call that finds
fewer than ``num_batch_threads`` batches running leads: it takes the queued
requests that fit one batch (its own first), runs them with one call of the
batch function, hands each its result, and passes the lead to the oldest
request still queued. Calls that arrive while every batch slot is busy wait
in the queue and go together in the next batch. So a lone caller runs at once
on its own thread, and batches grow with the load.

Adaptive wait: the callers a batch served mostly send their next request
soon after (a client answered sends the next one), but the lead passes at
once, before they are back, so a batch would hold only the callers of the
batch before it, and two groups would take turns. A leader therefore waits
for the callers of the last batch to submit again, at most ``return_wait``
times as long as that batch ran; a lone caller, the only one returning,
never waits. ``batch_timeout_micros`` can add a fixed wait for fuller
batches (TensorFlow Serving's knob); by default there is none.

Only requests of one *kind* (their inputs' shapes beyond the batch dimension)
share a batch; a request of another kind waits for a batch of its own kind. If
a batch fails, each of its requests runs again alone, so a request that
breaks the batch (a value the model's ops refuse) fails alone and the others
succeed.

Pure Python: what a request is, how requests are merged and how a result is
split is the batch function's business.
"""

from __future__ import annotations

import _thread
import bisect
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import attrs

from ..errors import QueueFullError
from ._checks import is_int

__all__ = ["Batcher", "BatchingPolicy", "BatchingStatistics"]


def _sizes(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(value)


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@attrs.frozen
class BatchingPolicy:
    """How concurrent requests to one version are merged (TensorFlow Serving's batching parameters).

    Attributes:
        max_batch_size: The most rows one call of the model takes. A request
            with more rows runs alone.
        batch_timeout_micros: How long a batch that is not full waits for
            more requests before it runs, in microseconds. 0 (the default):
            it runs at once, and batches form only from requests that arrive
            while the previous batch runs, so a lone caller never waits.
        allowed_batch_sizes: Sizes a batch is padded up to (by repeating its
            first row), ascending, the last equal to ``max_batch_size``; the
            model then only ever sees these few shapes, each warmed up at
            load. Empty (the default): no padding.
        num_batch_threads: Batches of one version that may run at once
            (TensorFlow Serving's name), each on the thread of one of its
            callers; while they run, the next batch forms. By default half
            the cores this process may use, at least 1 (TensorFlow Serving's
            default is every core): each batch's ops already spread over the
            cores through TensorFlow's intra-op threads, and two batches at
            once halve the batch size (docs/registry.md).
        max_enqueued_batches: The most batches that may wait to run
            (TensorFlow Serving's name): a request that would queue more rows
            than ``max_enqueued_batches * max_batch_size`` is refused at once
            with :class:`~lifecycle.QueueFullError` instead of waiting.
            ``None`` (the default): no limit, every request waits its turn.
        return_wait: How long a batch that is not full waits for the callers
            the previous batch served to send their next request, as a
            fraction of the time that batch ran (not a TensorFlow Serving
            parameter). Callers that send their next request once answered
            (threads in a loop, most clients) then share one full batch,
            where without it they split into groups whose batches take
            turns. A lone caller never waits: it is the only caller
            returning. 1.0 (the default): at most as long as the previous
            batch ran; 0: never.

    Raises:
        ValueError: A size is not a positive integer, the allowed sizes are
            not ascending, or the last is not ``max_batch_size``.

    Example:
        >>> import lifecycle as lc
        >>> lc.BatchingPolicy(max_batch_size=16, allowed_batch_sizes=(4, 8, 16)).padded(5)
        8
    """

    max_batch_size: int = 32
    batch_timeout_micros: int = 0
    allowed_batch_sizes: tuple[int, ...] = attrs.field(default=(), converter=_sizes)
    num_batch_threads: int = attrs.field(factory=lambda: max(1, _cores() // 2))
    max_enqueued_batches: int | None = None
    return_wait: float = 1.0

    def __attrs_post_init__(self) -> None:
        if not is_int(self.max_batch_size) or self.max_batch_size < 1:
            raise ValueError(
                f"`max_batch_size` must be an integer >= 1. Received: {self.max_batch_size!r}"
            )
        if not is_int(self.batch_timeout_micros) or self.batch_timeout_micros < 0:
            raise ValueError(
                "`batch_timeout_micros` must be an integer >= 0. "
                f"Received: {self.batch_timeout_micros!r}"
            )
        if not is_int(self.num_batch_threads) or self.num_batch_threads < 1:
            raise ValueError(
                f"`num_batch_threads` must be an integer >= 1. Received: {self.num_batch_threads!r}"
            )
        wait = self.return_wait
        number = isinstance(wait, (int, float)) and not isinstance(wait, bool)
        if not number or not 0 <= wait < math.inf:  # NaN fails the comparison too
            raise ValueError(
                f"`return_wait` must be a finite number >= 0. Received: {self.return_wait!r}"
            )
        limit = self.max_enqueued_batches
        if limit is not None and (not is_int(limit) or limit < 1):
            raise ValueError(
                f"`max_enqueued_batches` must be an integer >= 1 or None. Received: {limit!r}"
            )
        sizes = self.allowed_batch_sizes
        if not sizes:
            return
        if not all(is_int(s) and s >= 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
            raise ValueError(
                "`allowed_batch_sizes` must be strictly ascending integers >= 1. "
                f"Received: {sizes!r}"
            )
        if sizes[-1] != self.max_batch_size:
            raise ValueError(
                f"The last of `allowed_batch_sizes` {sizes!r} must be `max_batch_size` "
                f"({self.max_batch_size}), as in TensorFlow Serving."
            )

    def padded(self, rows: int) -> int:
        """The rows a batch of ``rows`` is padded to: the next allowed size, or ``rows``."""
        sizes = self.allowed_batch_sizes
        if not sizes or rows > sizes[-1]:
            return rows
        return sizes[bisect.bisect_left(sizes, rows)]


@attrs.frozen
class BatchingStatistics:
    """What a version's batching did so far.

    Attributes:
        batches: Calls of the model that served requests.
        requests: Requests served (each in one batch).
        rows: Rows of those requests.
        padded_rows: Rows added to reach an allowed batch size.
        queue_seconds: Total time requests waited between their arrival and
            the start of their batch.
        retried: Requests run again alone after their batch failed.
        rejected: Requests refused because ``max_enqueued_batches`` batches
            were waiting (:class:`~lifecycle.QueueFullError`).
        sizes: ``{requests in a batch: batches}``.
    """

    batches: int = 0
    requests: int = 0
    rows: int = 0
    padded_rows: int = 0
    queue_seconds: float = 0.0
    retried: int = 0
    rejected: int = 0
    sizes: Mapping[int, int] = attrs.field(factory=dict)

    @property
    def mean_batch_requests(self) -> float:
        """Requests per batch, on average (0 before the first batch)."""
        return self.requests / self.batches if self.batches else 0.0


class _Request:
    """One call waiting for, or in, a batch."""

    __slots__ = ("arrived", "done", "error", "item", "kind", "lead", "result", "rows")

    def __init__(self, item: Any, rows: int, kind: Hashable) -> None:
        self.item = item
        self.rows = rows
        self.kind = kind
        self.arrived = time.perf_counter()
        # Held while the request waits, released once: when it is served or
        # made to lead. Only a request that waits gets one. A bare lock rather
        # than an Event: it costs a tenth as much to make, wait on and set.
        self.done: _thread.LockType | None = None
        self.lead = False
        self.result: Any = None
        self.error: BaseException | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


# run(items, pad_to) -> one result per item, in order.
BatchFunction = Callable[[list[Any], int], list[Any]]


class Batcher:
    """Merges concurrent :meth:`submit` calls into calls of one batch function.

    Args:
        run: ``run(items, pad_to)`` serves ``items`` (requests of one kind
            whose rows add up to at most ``max_batch_size``, or a single
            larger one) in one call padded to ``pad_to`` rows, and returns
            one result per item, in order. It may raise: every item of the
            batch then runs again alone.
        policy: Batch sizes and timeout.
    """

    def __init__(self, run: BatchFunction, policy: BatchingPolicy) -> None:
        self._run = run
        self.policy = policy
        self._lock = threading.Lock()
        self._arrival = threading.Condition(self._lock)
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        limit = policy.max_enqueued_batches
        self._max_queued_rows = None if limit is None else limit * policy.max_batch_size
        # Leaders waiting for their batch to fill, whom arrivals notify.
        self._waiting = 0
        # Callers the last batch served that have not submitted again, and how
        # long that batch ran: a leader waits for them, at most that long.
        self._returning = 0
        self._last_run = 0.0
        # Batches running now, each led by one of its callers.
        self._leaders = 0
        # Statistics, under the lock.
        self._batches = self._requests = self._rows = self._padded = self._retried = 0
        self._rejected = 0
        self._queue_seconds = 0.0
        self._sizes: Counter[int] = Counter()

    def submit(self, item: Any, rows: int, kind: Hashable) -> Any:
        """Serve ``item`` (``rows`` rows, of ``kind``) in a batch; its result.

        Raises:
            QueueFullError: ``max_enqueued_batches`` batches are waiting already.
            Whatever ``run`` raised for this item run alone.
        """
        policy = self.policy
        with self._lock:
            if self._returning:
                self._returning -= 1
            lead = self._leaders < policy.num_batch_threads
            if lead:
                self._leaders += 1
                # No request to batch with and none to wait for: it runs alone, now.
                alone = not (self._queue or self._returning or policy.batch_timeout_micros)
                if not alone:
                    request = _Request(item, rows, kind)
            else:
                full = self._max_queued_rows
                if full is not None and self._queued_rows + rows > full:
                    self._rejected += 1
                    raise QueueFullError(
                        "The batch scheduling queue to which this request was submitted is "
                        f"full: {self._queued_rows} rows are waiting, as many as "
                        f"max_enqueued_batches={policy.max_enqueued_batches} batches of "
                        f"max_batch_size={policy.max_batch_size} allow. Retry later."
                    )
                request = _Request(item, rows, kind)
                done = request.done = threading.Lock()
                done.acquire()
                self._queue.append(request)
                self._queued_rows += rows
            if self._waiting:  # a leader waits for this arrival, or for returning callers
                self._arrival.notify()
        if not lead:
            done.acquire()  # until released by the batch's leader
            if not request.lead:
                return request.outcome()
        elif alone:
            return self._serve_alone(item, rows)
        self._lead(request)
        return request.outcome()

    def statistics(self) -> BatchingStatistics:
        """A frozen snapshot of what the batcher did."""
        with self._lock:
            return BatchingStatistics(
                batches=self._batches,
                requests=self._requests,
                rows=self._rows,
                padded_rows=self._padded,
                queue_seconds=self._queue_seconds,
                retried=self._retried,
                rejected=self._rejected,
                sizes=dict(sorted(self._sizes.items())),
            )

    def _lead(self, head: _Request) -> None:
        """Run ``head``'s batch, then pass the lead to the oldest request still queued."""
        try:
            with self._lock:
                batch = self._take(head)
            self._serve(batch)
        finally:
            with self._lock:
                self._pass_lead()

    def _pass_lead(self) -> None:
        """Under the lock: a leader is done; the oldest request queued leads next."""
        if self._queue:
            successor = self._queue.popleft()
            self._queued_rows -= successor.rows
            successor.lead = True
            # Released here; its own batch must not release it again.
            done, successor.done = successor.done, None
            done.release()  # type: ignore[union-attr]
        else:
            self._leaders -= 1

    def _serve_alone(self, item: Any, rows: int) -> Any:
        """Lead a batch of ``item`` alone, run at once: ``_lead`` and ``_serve`` for one.

        The common case of a lone caller, which must not pay for batching, so
        it makes no request, takes nothing from the queue and waits for nothing.
        """
        pad_to = self.policy.padded(rows)
        started = time.perf_counter()
        try:
            return self._run([item], pad_to)[0]
        finally:
            ran = time.perf_counter() - started
            with self._lock:
                self._count(1, rows, pad_to, ran, 0.0)
                self._pass_lead()

    def _count(self, requests: int, rows: int, pad_to: int, ran: float, queued: float) -> None:
        """Under the lock: a batch of ``requests`` ran for ``ran`` seconds; its statistics.

        Its callers are the ones returning, and its run bounds the next wait
        for them. ``queued``: the seconds its requests waited in all.
        """
        self._returning = requests
        self._last_run = ran
        self._batches += 1
        self._requests += requests
        self._rows += rows
        self._padded += pad_to - rows
        self._queue_seconds += queued
        self._sizes[requests] += 1

    def _take(self, head: _Request) -> list[_Request]:
        """Under the lock: ``head``'s batch, waiting up to the timeout to fill it.

        And, while callers of the last batch have not submitted again, up to
        ``return_wait`` times that batch's run.
        """
        limit = self.policy.max_batch_size
        batch, rows = [head], head.rows
        now = time.perf_counter()
        deadline = now + self.policy.batch_timeout_micros / 1e6
        returning_deadline = now + self._last_run * self.policy.return_wait
        while rows < limit:
            rows = self._fill(batch, rows, limit, head.kind)
            if rows >= limit:
                break
            until = max(deadline, returning_deadline) if self._returning else deadline
            remaining = until - time.perf_counter()
            if remaining <= 0:
                break
            self._waiting += 1
            try:
                self._arrival.wait(remaining)
            finally:
                self._waiting -= 1
        return batch

    def _fill(self, batch: list[_Request], rows: int, limit: int, kind: Hashable) -> int:
        """Move queued requests of ``kind`` that still fit into ``batch``; its rows."""
        kept: deque[_Request] = deque()
        while self._queue:
            request = self._queue.popleft()
            if request.kind == kind and rows + request.rows <= limit:
                batch.append(request)
                rows += request.rows
                self._queued_rows -= request.rows
            else:
                kept.append(request)
        self._queue = kept
        return rows

    def _serve(self, batch: list[_Request]) -> None:
        started = time.perf_counter()
        rows = sum(r.rows for r in batch)
        pad_to = self.policy.padded(rows)
        try:
            results = self._run([r.item for r in batch], pad_to)
        except BaseException as error:
            if len(batch) == 1:
                batch[0].error = error
            else:
                self._retry_alone(batch)
        else:
            for request, result in zip(batch, results, strict=True):
                request.result = result
        ran = time.perf_counter() - started
        with self._lock:
            self._count(len(batch), rows, pad_to, ran, sum(started - r.arrived for r in batch))
        for request in batch:  # the leader does not wait
            if request.done is not None:
                request.done.release()

    def _retry_alone(self, batch: list[_Request]) -> None:
        """After a failed batch: each request alone, so only the one at fault fails."""
        for request in batch:
            try:
                request.result = self._run([request.item], self.policy.padded(request.rows))[0]
            except BaseException as error:
                request.error = error
        with self._lock:
            self._retried += len(batch)
