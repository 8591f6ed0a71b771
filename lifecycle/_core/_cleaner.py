"""The cleaner: decides *when* deferred cleanup work runs.

Modelled on TensorFlow Java's ``EagerSession.ResourceCleanupStrategy``. Work
arrives on a queue — from finalizers of models that were dropped without
``dispose()``, as collection requests raised by byte pressure, and as trims
of the C heap once enough buffer bytes were released — and runs:

* ``IN_BACKGROUND``: on a daemon thread of the cleaner's own;
* ``ON_SAFE_POINTS``: synchronously, when a call into the library reaches a
  safe point (the caller may be briefly blocked);
* ``ON_SESSION_CLOSE``: only when the owning session closes.

Finalizers run inside Python's garbage collector, on whatever thread triggered
it, possibly while that thread holds arbitrary locks. They therefore only ever
call :meth:`Cleaner.enqueue`, which takes no lock (``queue.SimpleQueue.put`` is
reentrant and documented as safe in weakref callbacks).

A trim (``malloc_trim(0)``, glibc only) hands the free pages the C allocator
kept back to the operating system. It frees nothing in use and changes no
allocator setting, so the cleaner runs one after each of its collections and
after every ``trim_threshold`` bytes released, where its strategy runs other
work.

Byte pressure counts only bytes a collection may find: those allocated, since
the last collection, by models that are neither disposed nor the one that
allocated last (the model being built or fitted is in use; a disposed one's
buffers are free already). A process that disposes every model it is done
with therefore never pays a collection for them; one that drops models
without ``dispose()`` collects once the models superseded by newer ones hold
``pressure_threshold`` bytes.

The work they defer warns the way Python's own finalizers do
(:func:`warn_from_finalizer`): a warning that a filter turns into an error goes
to ``sys.unraisablehook`` and the clean-up carries on.
"""

from __future__ import annotations

import atexit
import enum
import gc
import logging
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import attrs

from . import _malloc
from ._counters import PROCESS

__all__ = ["Cleaner", "CleanerStatistics", "CleanupStrategy", "warn_from_finalizer"]

logger = logging.getLogger("lifecycle")


class CleanupStrategy(enum.Enum):
    """When a session's deferred cleanup runs (TensorFlow Java's three strategies)."""

    #: A daemon thread of the session's own runs cleanup as soon as work is
    #: queued, off the callers' threads. Stopped when the session closes. The
    #: most reliable; the default.
    IN_BACKGROUND = "in_background"
    #: No extra thread: cleanup runs synchronously when a call into the library
    #: reaches a safe point, and may briefly block that caller.
    ON_SAFE_POINTS = "on_safe_points"
    #: Nothing is cleaned until the session closes. Only for short sessions.
    ON_SESSION_CLOSE = "on_session_close"


@attrs.frozen
class CleanerStatistics:
    """A snapshot of what a cleaner has done.

    Attributes:
        strategy: The cleanup strategy.
        queued: Work items waiting to run.
        tasks_run: Deferred work items run so far (releases of dropped models).
        task_errors: Work items that raised; each is logged to the ``lifecycle`` logger.
        collections: Garbage collections the cleaner ran.
        collection_seconds: Time spent in those collections, in total.
        max_collection_seconds: The longest of them.
        blocking_seconds: Time the cleaner's work held the interpreter lock,
            so that no other thread could run Python: every collection whole
            (CPython collects holding it), and the CPU time of the deferred
            tasks (an upper bound: TensorFlow may release the lock inside
            them). Trims hold no lock and are not counted.
        bytes_allocated: Buffer bytes that managed models reported allocating.
        bytes_released: Buffer bytes released by managed models.
        pressure_bytes: Bytes a collection may find: allocated since the last
            collection by models neither disposed nor the latest to allocate.
        pressure_threshold: Pressure that starts a collection (``None``: never).
        trims: Times the cleaner returned free C-heap memory to the system
            (``malloc_trim(0)``; a no-op off glibc).
        trim_seconds: Time spent in those trims, in total.
        max_trim_seconds: The longest of them.
        trim_threshold: Bytes released that start a trim (``None``: the cleaner
            trims only after collections, and only under
            :func:`~lifecycle.tuning.tune_allocator`).
    """

    strategy: CleanupStrategy
    queued: int
    tasks_run: int
    task_errors: int
    collections: int
    collection_seconds: float
    max_collection_seconds: float
    blocking_seconds: float
    bytes_allocated: int
    bytes_released: int
    pressure_bytes: int
    pressure_threshold: int | None
    trims: int
    trim_seconds: float
    max_trim_seconds: float
    trim_threshold: int | None


# Background cleaners not yet stopped: stopped at interpreter exit, so no cleaner
# thread is inside TensorFlow while the interpreter tears down.
_running_cleaners: weakref.WeakSet[Cleaner] = weakref.WeakSet()


# Every cleaner not yet garbage-collected, running or stopped, for process statistics.
_all_cleaners: weakref.WeakSet[Cleaner] = weakref.WeakSet()


def all_cleaners() -> list[Cleaner]:
    """Every cleaner still referenced (for process statistics)."""
    return list(_all_cleaners)


@atexit.register
def _stop_all_cleaners() -> None:
    for cleaner in list(_running_cleaners):
        cleaner.stop()


class _FinalizerWarning:
    """A warning emitted from ``__del__``, so that Python reports it as a finalizer's.

    An exception raised in ``__del__`` (a warning that ``filterwarnings("error")``
    turned into one) goes to ``sys.unraisablehook`` — "Exception ignored in:
    ..." — as for an unclosed file. Python code has no other way to hand that
    hook the ``UnraisableHookArgs`` its default implementation requires.
    """

    __slots__ = ("category", "message")

    def __init__(self, message: str, category: type[Warning]) -> None:
        self.message = message
        self.category = category

    def __del__(self) -> None:
        warnings.warn(self.message, self.category, stacklevel=1)


def warn_from_finalizer(message: str, category: type[Warning] = ResourceWarning) -> None:
    """Warn about deferred finalizer work, as Python's own finalizers warn.

    The warning shows, is recorded by ``warnings.catch_warnings`` and
    ``pytest.warns``, and is filtered like any other. Where a filter turns it
    into an error (``-W error``, ``filterwarnings = error``), the error does
    not propagate: it goes to ``sys.unraisablehook``, like the
    ``ResourceWarning`` of a file that was never closed, and the caller — a
    cleanup task — goes on.

    Args:
        message: The warning's text.
        category: The warning's class.
    """
    # CPython finalizes the object as its only reference drops, here.
    _FinalizerWarning(message, category)


class _Token(enum.Enum):
    COLLECT = "collect"
    TRIM = "trim"
    STOP = "stop"
    # Wakes the background thread to time an idle collection.
    WAKE = "wake"


class _Idle:
    """A marker that the background thread sets once every earlier item has run."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


@attrs.define(eq=False)
class Cleaner:
    """Runs deferred cleanup work according to a :class:`CleanupStrategy`.

    Args:
        strategy: When queued work runs.
        name: Used for the background thread's name and in log messages.
        pressure_threshold: Byte pressure (see the module's documentation)
            that starts a garbage collection; ``None`` disables.
        collector: The collection to run; ``gc.collect`` unless a test injects
            its own (the seam that makes strategies testable deterministically).
        trim_threshold: Bytes released (since the last trim) after which the
            cleaner returns free C-heap memory to the system; it then also
            trims after each collection. ``None`` disables both (unless
            :func:`~lifecycle.tuning.tune_allocator` asked for trims after collections).
        trimmer: The trim to run; ``None`` (default) runs ``malloc_trim(0)``
            (a no-op off glibc). A seam for tests.
        idle_collection: ``IN_BACKGROUND`` only: seconds without a new
            allocation after which the cleaner collects if any owner allocated
            since the last collection and was not disposed, the latest one
            included (it may have been dropped since). Garbage of no owner
            waits for byte pressure. ``None``: only byte pressure starts
            collections.
        busy: Whether an owner is in use now (a managed model inside a call):
            an idle collection then waits for another idle spell, since the
            owner that allocated last is most likely the one in use (a long
            ``fit``).
    """

    strategy: CleanupStrategy
    name: str
    pressure_threshold: int | None
    collector: Callable[[], Any] = gc.collect
    trim_threshold: int | None = None
    trimmer: Callable[[], bool] | None = None
    idle_collection: float | None = None
    busy: Callable[[], bool] | None = None
    # Deferred work: callables, _Token and _Idle items. put() is lock-free.
    _queue: queue.SimpleQueue[Any] = attrs.field(factory=queue.SimpleQueue, init=False)
    # Guards the counters below; never taken from a finalizer.
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # Held while queued work runs, so one thread at a time runs it.
    _running: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _collect_requested: bool = attrs.field(default=False, init=False)
    # Set once _released passes trim_threshold; cleared when a trim starts.
    _trim_requested: bool = attrs.field(default=False, init=False)
    # Bytes released since the last trim.
    _released: int = attrs.field(default=0, init=False)
    _thread: threading.Thread | None = attrs.field(default=None, init=False)
    # Set by close(): takes the work that arrives afterwards.
    _successor: Cleaner | None = attrs.field(default=None, init=False)
    _tasks_run: int = attrs.field(default=0, init=False)
    _task_errors: int = attrs.field(default=0, init=False)
    _collections: int = attrs.field(default=0, init=False)
    _collection_seconds: float = attrs.field(default=0.0, init=False)
    _max_collection_seconds: float = attrs.field(default=0.0, init=False)
    _blocking_seconds: float = attrs.field(default=0.0, init=False)
    _bytes_allocated: int = attrs.field(default=0, init=False)
    _bytes_released: int = attrs.field(default=0, init=False)
    # Bytes allocated since the last collection, per owner neither disposed
    # nor collected (None: bytes of no owner, always pressure).
    _pending: dict[Hashable | None, int] = attrs.field(factory=dict, init=False)
    # The owner that allocated last: in use, so its bytes are not pressure.
    _newest: Hashable | None = attrs.field(default=None, init=False)
    # time.monotonic() of the last allocation noted (idle collections).
    _allocated_at: float = attrs.field(default=0.0, init=False)
    _pressure: int = attrs.field(default=0, init=False)
    _trims: int = attrs.field(default=0, init=False)
    _trim_seconds: float = attrs.field(default=0.0, init=False)
    _max_trim_seconds: float = attrs.field(default=0.0, init=False)

    def __attrs_post_init__(self) -> None:
        _all_cleaners.add(self)
        if self.strategy is CleanupStrategy.IN_BACKGROUND:
            self._thread = threading.Thread(
                target=self._loop, name=f"lifecycle-cleaner-{self.name}", daemon=True
            )
            self._thread.start()
            _running_cleaners.add(self)

    # -- producers ---------------------------------------------------------------

    def enqueue(self, task: Callable[[], Any]) -> None:
        """Queue deferred work. Takes no lock: safe from finalizers and weakref callbacks.

        After :meth:`close`, work goes to the successor given there.
        """
        successor = self._successor
        if successor is None:
            self._queue.put(task)
        else:
            successor.enqueue(task)

    def note_allocated(self, nbytes: int, owner: Hashable | None = None) -> None:
        """Count buffer bytes that ``owner`` (a model's record) allocated.

        They become pressure once another owner allocates after it, unless
        :meth:`note_disposed` says it was disposed first. Bytes of no owner
        are pressure at once.
        """
        if nbytes <= 0:
            return
        if self._successor is not None:
            self._successor.note_allocated(nbytes, owner)
            return
        with self._lock:
            self._bytes_allocated += nbytes
            self._allocated_at = time.monotonic()
            # A new owner may need an idle collection timed; a known one has it.
            wake = owner is not None and owner not in self._pending
            self._pending[owner] = self._pending.get(owner, 0) + nbytes
            if owner is not None:
                self._newest = owner
            collect = self._update_pressure()
        if collect:
            self._request_collection()
        elif wake:
            self._wake()

    def note_garbage(self, nbytes: int) -> None:
        """Count bytes held by reference cycles that only a collection frees, as pressure.

        A disposed model's traced step functions (their graphs), a SavedModel's
        restored copy of its variables: not buffers a model allocated, so not
        in ``bytes_allocated``.
        """
        if nbytes <= 0:
            return
        if self._successor is not None:
            self._successor.note_garbage(nbytes)
            return
        with self._lock:
            self._pending[None] = self._pending.get(None, 0) + nbytes
            collect = self._update_pressure()
        if collect:
            self._request_collection()

    def _wake(self) -> None:
        """Have the background thread time an idle collection for what was just noted."""
        if self.idle_collection is not None and self.strategy is CleanupStrategy.IN_BACKGROUND:
            self._queue.put(_Token.WAKE)

    def note_disposed(self, owner: Hashable) -> None:
        """``owner`` released its buffers: what it allocated is no longer pressure."""
        if self._successor is not None:
            self._successor.note_disposed(owner)
            return
        with self._lock:
            self._pending.pop(owner, None)
            if self._newest == owner:
                self._newest = None
            self._update_pressure()

    def note_released(self, nbytes: int) -> None:
        """Count buffer bytes a managed model released, towards the next trim."""
        if nbytes <= 0:
            return
        with self._lock:
            self._bytes_released += nbytes
        self._add_released(nbytes)

    def _add_released(self, nbytes: int) -> None:
        with self._lock:
            self._released += nbytes
            threshold = self.trim_threshold
            if threshold is None or self._released < threshold or self._trim_requested:
                return
            self._trim_requested = True
        if self.strategy is CleanupStrategy.IN_BACKGROUND:
            self._queue.put(_Token.TRIM)

    def _update_pressure(self) -> bool:
        """Recompute the pressure (lock held); True when a collection is newly due."""
        in_use = self._pending.get(self._newest, 0) if self._newest is not None else 0
        self._pressure = sum(self._pending.values()) - in_use
        threshold = self.pressure_threshold
        if threshold is None or self._pressure < threshold or self._collect_requested:
            return False
        self._collect_requested = True
        return True

    def _request_collection(self) -> None:
        if self.strategy is CleanupStrategy.IN_BACKGROUND:
            self._queue.put(_Token.COLLECT)

    # -- consumers ---------------------------------------------------------------

    def safe_point(self, *, explicit: bool = False) -> None:
        """Run pending work now if the strategy is ``ON_SAFE_POINTS`` and work is pending.

        Costs one attribute check when there is nothing to do. If another
        thread is already running the work, returns at once.

        Args:
            explicit: The program asked for a safe point (``session.safe_point()``),
                where a pause is harmless: then any owner that allocated since the
                last collection and was not disposed may have been dropped, the
                one that allocated last included, and a collection runs to find
                it. Garbage alone (a disposed model's step functions) waits for
                byte pressure, as at implicit safe points (a model's entry
                points), which collect only under byte pressure.
        """
        if self.strategy is not CleanupStrategy.ON_SAFE_POINTS:
            return
        if explicit and self._undisposed():
            with self._lock:
                self._collect_requested = True
            self.run_pending()
        elif self._collect_requested or self._trim_requested or not self._queue.empty():
            self.run_pending(block=False)

    def run_pending(self, *, block: bool = True) -> None:
        """Run a requested collection or trim and every queued item, in the calling thread.

        Args:
            block: Wait for another thread that is running the work; if False,
                return at once instead.
        """
        if not self._running.acquire(blocking=block):
            return
        try:
            if self._collect_requested:
                self._collect()
            if self._trim_requested:
                self._trim()
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    return
                self._run(item)
        finally:
            self._running.release()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the background thread has run everything queued before this call.

        Returns:
            True once idle. For the other strategies nothing runs by itself:
            returns whether nothing is queued, without waiting.
        """
        thread = self._thread
        if thread is None or not thread.is_alive():
            return self._queue.empty() and not (self._collect_requested or self._trim_requested)
        marker = _Idle()
        self._queue.put(marker)
        return marker.event.wait(timeout)

    def close(
        self, successor: Cleaner | None = None, *, collect: bool = True, trim: bool = False
    ) -> None:
        """Stop the background thread, collect once, and run everything still queued.

        The final collection finds models dropped without ``dispose()`` that no
        collection has seen yet, so their finalizers queue their release. A
        ``gc.collect()`` returns at once while another thread collects, so a
        straggler may still be found later: its work goes to ``successor``.
        Safe to call twice.

        Args:
            successor: The cleaner that takes work (and byte pressure) arriving
                after the close.
            collect: Run the final collection (and a trim after it). Without
                it, the pressure not yet collected and the released bytes not
                yet trimmed pass to ``successor``.
            trim: Without a collection, trim anyway (the closing owner released
                buffers itself), unless trims are off.
        """
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self._queue.put(_Token.STOP)
            thread.join()
            _running_cleaners.discard(self)
        if collect:
            with self._running:
                self._collect()
        elif trim and (self.trim_threshold is not None or _malloc.trimming()):
            with self._running:
                self._trim()
        if not collect and successor is not None:
            with self._lock:
                pending, self._pending, self._collect_requested = self._pending, {}, False
                self._newest, self._pressure = None, 0
                # The successor trims where its strategy says, not the closing thread.
                released, self._released, self._trim_requested = self._released, 0, False
            successor._take_pending(pending)
            successor._add_released(released)
        self.run_pending()
        self._successor = successor
        self.run_pending()  # what arrived before the successor took over

    def _take_pending(self, pending: dict[Hashable | None, int]) -> None:
        """Adopt a closing cleaner's pending bytes (not counted as allocated twice)."""
        with self._lock:
            for owner, nbytes in pending.items():
                self._pending[owner] = self._pending.get(owner, 0) + nbytes
            collect = self._update_pressure()
        if collect:
            self._request_collection()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the background thread without running what is queued (at exit)."""
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            self._queue.put(_Token.STOP)
            thread.join(timeout)

    def statistics(self) -> CleanerStatistics:
        """A frozen snapshot of the cleaner's counters."""
        with self._lock:
            return CleanerStatistics(
                strategy=self.strategy,
                queued=self._queue.qsize(),
                tasks_run=self._tasks_run,
                task_errors=self._task_errors,
                collections=self._collections,
                collection_seconds=self._collection_seconds,
                max_collection_seconds=self._max_collection_seconds,
                blocking_seconds=self._blocking_seconds,
                bytes_allocated=self._bytes_allocated,
                bytes_released=self._bytes_released,
                pressure_bytes=self._pressure,
                pressure_threshold=self.pressure_threshold,
                trims=self._trims,
                trim_seconds=self._trim_seconds,
                max_trim_seconds=self._max_trim_seconds,
                trim_threshold=self.trim_threshold,
            )

    # -- internals ---------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._idle_wait())
            except queue.Empty:
                with self._running:
                    self._collect_if_idle()
                continue
            if item is _Token.STOP:
                return
            with self._running:
                self._run(item)

    def _undisposed(self) -> bool:
        """Whether an owner allocated since the last collection and was not disposed."""
        return any(owner is not None for owner in list(self._pending))

    def _idle_wait(self) -> float | None:
        """Seconds until an idle collection is due; ``None`` while none can be."""
        idle = self.idle_collection
        if idle is None or not self._undisposed():
            return None
        return max(0.0, self._allocated_at + idle - time.monotonic()) + 0.01

    def _collect_if_idle(self) -> None:
        idle = self.idle_collection
        with self._lock:
            due = (
                idle is not None
                and self._undisposed()
                and time.monotonic() - self._allocated_at >= idle
            )
        if not due:
            return
        if self.busy is not None and self.busy():
            with self._lock:
                self._allocated_at = time.monotonic()  # look again after another spell
            return
        self._collect()

    def _run(self, item: Any) -> None:
        if item is _Token.COLLECT:
            if self._collect_requested:
                self._collect()
        elif item is _Token.TRIM:
            if self._trim_requested:
                self._trim()
        elif isinstance(item, _Idle):
            item.event.set()
        elif item is _Token.WAKE:
            return
        elif item is not _Token.STOP:
            started = time.thread_time()
            try:
                item()
            except Exception:
                with self._lock:
                    self._task_errors += 1
                logger.exception("cleanup task of cleaner %r failed", self.name)
            # CPU time, not wall time: waiting for the lock blocks nobody.
            busy = time.thread_time() - started
            PROCESS.add("blocking_seconds", busy)
            with self._lock:
                self._tasks_run += 1
                self._blocking_seconds += busy

    def _collect(self) -> None:
        with self._lock:
            self._collect_requested = False
            self._pending, self._newest, self._pressure = {}, None, 0
        started = time.perf_counter()
        self.collector()
        elapsed = time.perf_counter() - started
        PROCESS.add("collections")
        PROCESS.add("collection_seconds", elapsed)
        PROCESS.add("blocking_seconds", elapsed)
        PROCESS.maximum("max_collection_seconds", elapsed)
        with self._lock:
            self._collections += 1
            self._collection_seconds += elapsed
            self._blocking_seconds += elapsed
            self._max_collection_seconds = max(self._max_collection_seconds, elapsed)
        # What the collection freed (graphs, kernels) goes back with the buffers.
        if self.trim_threshold is not None or _malloc.trimming():
            self._trim()

    def _trim(self) -> None:
        with self._lock:
            self._trim_requested = False
            self._released = 0
        started = time.perf_counter()
        # A foreign call without the GIL: other threads run meanwhile. glibc
        # locks one arena at a time while it walks that arena's free chunks.
        (self.trimmer or _malloc.trim)()
        elapsed = time.perf_counter() - started
        PROCESS.add("trims")
        PROCESS.add("trim_seconds", elapsed)
        with self._lock:
            self._trims += 1
            self._trim_seconds += elapsed
            self._max_trim_seconds = max(self._max_trim_seconds, elapsed)
