"""A managed model's record: its gate, state, owner and the handles it owns.

The record is what outlives the model: the session owns records, not models, and
the finalizer of a model holds only its record. A record never references its
model strongly, so it never keeps a dropped model alive.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import keras

from . import _model_index, _tf
from ._core import (
    KERNEL_CACHE,
    PROCESS,
    CallGate,
    CleanupStrategy,
    ModelState,
    check_timeout,
    warn_from_finalizer,
)
from ._session import clear_kernel_cache_when_due
from .errors import (
    CoordinationError,
    DisposedError,
    DisposeInProgressError,
    DrainTimeoutError,
)

if TYPE_CHECKING:
    from ._session import LifecycleSession

__all__ = [
    "DEFAULT_DISPOSE_TIMEOUT",
    "Dependent",
    "DeviceRelease",
    "DisposeReport",
    "Keeper",
    "Managed",
    "ModelRecord",
    "disposed_error",
    "held",
    "run_guarded",
]

#: Seconds ``dispose()`` waits for calls in flight unless told otherwise.
DEFAULT_DISPOSE_TIMEOUT = 30.0
# Byte pressure each traced step function (train, test, predict) a dispose lets
# go adds to its session's cleaner: the graphs behind it are reference cycles
# that only a collection frees, larger for larger models. At the default pressure
# threshold, one collection per 8 step functions: a scikit-learn sweep (2 per fit)
# stays flat (docs/sweeps.md); a 5-fold ResNet50 loop with evaluate pays one
# (docs/benchmarks.md#k-fold-training-throughput-benchmarkskfoldpy).
STEP_FUNCTION_PRESSURE = 16 * 2**20


@attrs.frozen
class DeviceRelease:
    """What one ``dispose()`` released on one device.

    Attributes:
        device: The full device name, e.g. ``/job:ps/replica:0/task:0/device:CPU:0``.
        bytes_released: Bytes released there.
        variables_released: Buffers released there.
    """

    device: str
    bytes_released: int
    variables_released: int


@attrs.frozen
class DisposeReport:
    """What one ``dispose()`` released and how long it took.

    Attributes:
        model_name: ``model.name`` of the disposed model.
        bytes_released: Bytes of variable buffers released (by static shape),
            every replica and shard counted.
        variables_released: Number of buffers released.
        registry_entries_purged: Gradient-registry entries deleted because they
            pinned this model (or Keras's scratch graphs).
        drain_seconds: Time spent waiting for calls in flight.
        release_seconds: Time spent releasing, purging and dropping references.
        collect_seconds: Time spent in a collection run by this dispose
            (0 when the collection was left to the session's cleaner).
        devices: What was released on each device (every replica, parameter
            server and shard), sorted by device name.
        pooled: Whether the released CPU buffers went to oneDNN's pool, which
            keeps them for this process's reuse, rather than back to the
            system (``lc.statistics().cpu_pooled_bytes`` says how much the pool
            holds; ``LIFECYCLE_ALLOCATOR=system`` before ``import lifecycle``
            avoids the pool).
    """

    model_name: str
    bytes_released: int
    variables_released: int
    registry_entries_purged: int
    drain_seconds: float
    release_seconds: float
    collect_seconds: float
    devices: tuple[DeviceRelease, ...] = ()
    pooled: bool = False

    @property
    def total_seconds(self) -> float:
        """Drain, release and collection together."""
        return self.drain_seconds + self.release_seconds + self.collect_seconds


class Dependent(Protocol):
    """What a model's record needs from an object that holds part of the model.

    A serving function (``_serving.py``) or a checkpoint keeper
    (``_checkpoints/``) adds itself to its model's ``record.dependents``. The
    record knows it only through this protocol: those modules import this one,
    never the other way round.
    """

    def _drop(self) -> None:
        """Let go of the model and what it holds of it (a dispose, after the release)."""


class Keeper(Dependent, Protocol):
    """A dependent that writes the model to disk: a checkpoint keeper."""

    def _flush(self) -> None:
        """Wait for a pending write (a dispose, before any buffer is released)."""


def _pooled(cpu_bytes: int) -> bool:
    """Whether ``cpu_bytes`` released went to oneDNN's pool rather than the system."""
    return cpu_bytes > 0 and _tf.memory.cpu_allocator() == "onednn-pool"


@attrs.define(eq=False)
class ModelRecord:
    """Per-model bookkeeping, held by the model as ``_lifecycle`` and by its session.

    The "model" may also be a managed ``tf.Module`` or Keras optimizer
    (``lifecycle._objects``): the record reaches its variables through
    ``_tf.object_variables``.
    """

    owner: LifecycleSession
    kind: str
    dispose_timeout: float | None
    name: str = attrs.field(default="<unbuilt>", init=False)
    gate: CallGate = attrs.field(factory=CallGate, init=False)
    # Invariant: state is DISPOSED iff the gate is closed for good; report is
    # set once the release completed.
    state: ModelState = attrs.field(default=ModelState.LIVE, init=False)
    report: DisposeReport | None = attrs.field(default=None, init=False)
    # Serialises dispose(); never held while a call is in flight on this thread.
    dispose_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # Objects holding traced functions of this model; cleared on dispose.
    dependents: weakref.WeakSet[Dependent] = attrs.field(factory=weakref.WeakSet, init=False)
    # Open checkpoint keepers by absolute directory, one per directory. Each is
    # also in dependents (so dispose() drops it), is flushed by dispose() first,
    # and leaves this dict when it closes; one is added only while state is LIVE.
    keepers: dict[str, Keeper] = attrs.field(factory=dict, init=False)
    # Guards keepers.
    keepers_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # Weak references to the handle tensors of the model's buffers and to the
    # variables holding them, with their sizes, dtypes and devices, as of the
    # last refresh. Weak:
    # the record must never keep buffers (or the model) alive; a dropped model's
    # pinned handles stay reachable through the gradient registry, which is
    # exactly what gets purged, while a variable still alive is held elsewhere.
    handles: list[tuple[weakref.ref[Any], weakref.ref[Any], int, Any, str]] = attrs.field(
        factory=list, init=False
    )
    accounted_bytes: int = attrs.field(default=0, init=False)
    # Guards handles and accounted_bytes against concurrent refreshes.
    accounting_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # Entry points whose first outermost call has refreshed the handles.
    refreshed: set[str] = attrs.field(factory=set, init=False)
    _finalizer: weakref.finalize | None = attrs.field(default=None, init=False)
    _model: weakref.ref[keras.Model] | None = attrs.field(default=None, init=False)

    @classmethod
    def attach(
        cls, model: keras.Model, owner: LifecycleSession, dispose_timeout: float | None
    ) -> ModelRecord:
        """Create the record of ``model``, owned by ``owner``, with its finalizer."""
        record = cls(owner=owner, kind=type(model).__name__, dispose_timeout=dispose_timeout)
        owner.adopt(record)
        record._model = weakref.ref(model)
        # The finalizer only queues: it runs inside the garbage collector.
        _model_index.note_managed(model)
        record._finalizer = weakref.finalize(model, owner.cleaner.enqueue, record.clean_up)
        record._finalizer.atexit = False
        # object.__setattr__: Keras's attribute tracking must not see bookkeeping.
        object.__setattr__(model, "_lifecycle", record)
        return record

    def describe(self) -> str:
        """``"<class> '<name>'"`` for messages."""
        return f"{self.kind} {self.name!r}"

    def move_to(self, owner: LifecycleSession) -> None:
        """Make ``owner`` the model's session (its old one hands it out)."""
        model = self._model() if self._model is not None else None
        if model is None or self.state is not ModelState.LIVE:
            return
        owner.adopt(self)
        old, self.owner = self.owner, owner
        old._release_record(self)
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(model, owner.cleaner.enqueue, self.clean_up)
        self._finalizer.atexit = False
        with self.accounting_lock:
            owned = self.accounted_bytes
        old.cleaner.note_disposed(self)
        owner.cleaner.note_allocated(owned, owner=self)

    # -- accounting ------------------------------------------------------------

    def refresh(self, model: keras.Model) -> None:
        """Re-read which buffers the model owns and report new bytes to the cleaner."""
        self.name = getattr(model, "name", self.name)
        handles = []
        total = 0
        leaves = _tf.variable_leaves(_tf.object_variables(model))
        for leaf in leaves:
            nbytes = _tf.leaf_nbytes(leaf)
            handles.append(
                (weakref.ref(leaf.handle), weakref.ref(leaf), nbytes, leaf.dtype, leaf.device)
            )
            total += nbytes
        with self.accounting_lock:
            self.handles = handles
            grown = total - self.accounted_bytes
            self.accounted_bytes = total
        PROCESS.add("bytes_owned", grown)
        cleaner = self.owner.cleaner
        cleaner.note_allocated(grown, owner=self)
        if cleaner.strategy is CleanupStrategy.IN_BACKGROUND:
            # The kernels its release will run, built now off the caller's
            # thread: a first dispose would build one per variable shape.
            missing = _tf.release_kernel_keys(leaves)
            if missing:
                cleaner.enqueue(functools.partial(_tf.warm_release, missing))

    # -- dispose ---------------------------------------------------------------

    def dispose(
        self, model: keras.Model, timeout: Any, collect: bool | None, coordinate: bool = True
    ) -> DisposeReport:
        """The body of ``ManagedModel.dispose()``; see there."""
        timeout = self.dispose_timeout if timeout is DEFAULT else check_timeout(timeout)
        if self.gate.held_by_current_thread():
            raise DisposeInProgressError(
                f"dispose() of {self.describe()} was called from inside a call to the same "
                "model on this thread (for example a callback of its fit()). Disposing "
                "would wait for itself; dispose after the call returns."
            )
        with self.dispose_lock:
            if self.report is not None:
                return self.report
            started = time.perf_counter()
            self.state = ModelState.DISPOSING
            still_running = self.gate.close(timeout)
            if still_running:
                self.state = ModelState.LIVE
                raise DrainTimeoutError(
                    f"dispose() of {self.describe()} gave up after waiting {timeout} s for "
                    f"calls in flight: {still_running} call(s) still running. The model is "
                    "live and unchanged; retry later or pass a longer timeout=.",
                    in_flight=still_running,
                )
            # Read once: walking a large model's layers takes milliseconds.
            variables = _tf.object_variables(model)
            if coordinate:
                self._coordinate(variables, timeout)
            drained = time.perf_counter()
            # From here on the gate stays closed: the model is unusable even if
            # a step below fails, and a later dispose() retries the release.
            self.state = ModelState.DISPOSED
            self.name = model.name
            self._flush_keepers()
            per_device, purged, detached, steps = self._release(model, variables)
            del variables
            bytes_released = sum(nbytes for nbytes, _ in per_device.values())
            variables_released = sum(count for _, count in per_device.values())
            self._account_release(bytes_released)
            KERNEL_CACHE.note_released(variables_released)
            cleaner = self.owner.cleaner
            if collect or cleaner.strategy is not CleanupStrategy.IN_BACKGROUND:
                detached.clear()
            else:
                # Destroying a large traced step function takes TensorFlow tens
                # of milliseconds: the cleaner's thread does it.
                cleaner.enqueue(_LetGo(detached))
            del detached
            released = time.perf_counter()
            if collect:
                self.owner.collector()  # gc.collect(), and the kernel cache when due
            elif collect is None and KERNEL_CACHE.due():
                # No collection needed (the buffers are free), but the stale
                # kernels of the buffers released so far are: the cleaner clears
                # them where its strategy runs work.
                cleaner.enqueue(clear_kernel_cache_when_due)
            # Its buffers are free: nothing left for a collection to find but
            # the graphs of its traced step functions, reference cycles.
            cleaner.note_disposed(self)
            cleaner.note_released(bytes_released)
            cleaner.note_garbage(steps * STEP_FUNCTION_PRESSURE)
            self.report = DisposeReport(
                model_name=self.name,
                bytes_released=bytes_released,
                variables_released=variables_released,
                registry_entries_purged=purged,
                drain_seconds=drained - started,
                release_seconds=released - drained,
                collect_seconds=time.perf_counter() - released,
                devices=tuple(
                    DeviceRelease(device, nbytes, count)
                    for device, (nbytes, count) in sorted(per_device.items())
                ),
                pooled=_pooled(
                    sum(n for device, (n, _) in per_device.items() if ":CPU:" in device.upper())
                ),
            )
            return self.report

    def _release(
        self, model: keras.Model, variables: list[Any]
    ) -> tuple[dict[str, tuple[int, int]], int, list[Any]]:
        """Release the buffers, purge the registry, take compiled state off, drop dependents.

        Args:
            model: The model.
            variables: Its Keras variables (``_tf.keras_variables(model)``).

        Returns:
            What was released per device, how many registry entries were
            purged, the compiled state taken off the model (its traced step
            functions among it) for the caller to let go of, and how many step
            functions it held.
        """
        leaves = _tf.variable_leaves(variables)
        handles = [leaf.handle for leaf in leaves]
        _model_index.note_disposed(model, variables, handles)
        per_device = _tf.release_by_device(leaves)
        # Released: not the session's to release again when it closes.
        self.owner.forget_variables(leaves)
        del leaves
        purged = _tf.purge_gradient_registry(handles)
        del handles
        if isinstance(model, keras.Model):
            steps = _tf.keras_internals.step_functions(model)
            detached = _tf.keras_internals.detach_compiled_state(model)
        else:  # a tf.Module or an optimizer: its traced functions are its class's
            steps, detached = 0, []
        for dependent in list(self.dependents):
            dependent._drop()
        self._forget(cleaned=False)
        return per_device, purged, detached, steps

    def _coordinate(self, variables: list[Any], timeout: float | None) -> None:
        """Under a multi-worker strategy, wait until every worker is disposing too."""
        strategy = _tf.strategies.variables_strategy(variables)
        if strategy is None or not _tf.strategies.needs_barrier(strategy):
            return
        try:
            _tf.strategies.barrier(strategy, timeout)
        except Exception as error:  # a timeout, or a peer that is gone
            self.gate.reopen()
            self.state = ModelState.LIVE
            raise CoordinationError(
                f"dispose() of {self.describe()} waited {timeout} s for the other workers "
                f"of its {type(strategy).__name__} to dispose it too, and they did not "
                f"({type(error).__name__}). Nothing was released; the model is live. "
                "Call dispose() on every worker; after this timeout TensorFlow has aborted "
                "this worker's collectives, so to free this worker's replicas alone call "
                "dispose(coordinate=False)."
            ) from error

    def _flush_keepers(self) -> None:
        # Pending checkpoint writes go to disk before any buffer is released.
        with self.keepers_lock:
            keepers = list(self.keepers.values())
        for keeper in keepers:
            try:
                keeper._flush()
            except Exception as error:  # the model is disposed regardless
                warnings.warn(
                    f"dispose() of {self.describe()}: {error}", RuntimeWarning, stacklevel=3
                )

    def in_use(self) -> bool:
        """Whether a call of the model is in flight now."""
        return self.gate.in_flight() > 0

    def dispose_owned(self, timeout: float | None) -> None:
        """Dispose the model if it is still alive (its session is closing)."""
        model = self._model() if self._model is not None else None
        if model is not None:
            model.dispose(timeout=timeout, collect=False)

    def clean_up(self) -> None:
        """Release what a model dropped without ``dispose()`` still pins (cleaner task).

        The model is gone, so nothing can be calling it. Its buffers are held
        only by the gradient-registry entries that captured their handles, and
        by whoever else still references their variables (a layer shared with
        a live model, a stray variable): purging the entries frees the former
        and leaves the latter alone, as Python would. The bytes released are
        those of buffers whose variables are gone (freed by the collection that
        found the model, or by the purge); the others are not counted.
        """
        with self.dispose_lock:
            if self.state is not ModelState.LIVE:
                return
            self.state = ModelState.DISPOSED
            started = time.perf_counter()
            alive = [handle for ref, *_ in self.handles if (handle := ref()) is not None]
            # A buffer whose variable is gone but whose handle a traced graph
            # still holds (a reference cycle, a registry entry) is released
            # through the handle now, not when a later collection finds the graph.
            orphans = [
                (handle, dtype, device, nbytes)
                for ref, variable, nbytes, dtype, device in self.handles
                if variable() is None and (handle := ref()) is not None
            ]
            if orphans:
                _tf.release_handles(orphans)
            del orphans
            purged = _tf.purge_gradient_registry(alive)
            del alive
            # A buffer whose variable is gone is freed; one whose variable
            # lives is someone else's now.
            released = sum(n for _, variable, n, *_ in self.handles if variable() is None)
            # Their creation kernels are stale whoever holds the variables now.
            KERNEL_CACHE.note_released(len(self.handles))
            self.handles = []
            self._forget(cleaned=True)
            owned = self._account_release(released)
            clear_kernel_cache_when_due()
            self.report = DisposeReport(
                model_name=self.name,
                bytes_released=released,
                variables_released=0,
                registry_entries_purged=purged,
                drain_seconds=0.0,
                release_seconds=time.perf_counter() - started,
                collect_seconds=0.0,
                pooled=_pooled(released),  # a dropped model's devices are not known
            )
            self.owner.cleaner.note_disposed(self)
            self.owner.cleaner.note_released(released)
        if owned:
            cleaned = (
                f"its {owned} bytes of buffers"
                if released == owned
                else f"{released} of its {owned} bytes of buffers ({owned - released} stay "
                "with variables still referenced elsewhere, such as a layer shared with a "
                "live model)"
            )
            # Like an unclosed file's: under -W error it reaches sys.unraisablehook,
            # not the cleaner (the clean-up above is done either way).
            warn_from_finalizer(
                f"{self.describe()} was garbage-collected without dispose(); session "
                f"{self.owner.name!r} cleaned up {cleaned}. Call model.dispose() or use "
                "`with model:` to release them deterministically.",
                ResourceWarning,
            )

    def _account_release(self, released: int) -> int:
        """Move the model's bytes from owned to released; returns the bytes it owned."""
        with self.accounting_lock:
            owned, self.accounted_bytes = self.accounted_bytes, 0
        PROCESS.add("bytes_owned", -owned)
        PROCESS.add("bytes_released", released)
        return owned

    def _forget(self, *, cleaned: bool) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        self.owner.forget(self, cleaned=cleaned)


class Refresh(enum.Enum):
    """When a guarded entry point re-reads the object's buffers (for byte accounting)."""

    ALWAYS = "always"  # may create variables and is not on a per-request path
    FIRST = "first"  # hot path: only its first outermost call
    NEVER = "never"  # creates no variables


def run_guarded(
    obj: Any, name: str, method: Callable[..., Any], refresh: Refresh, *args: Any, **kwargs: Any
) -> Any:
    """Call ``method`` as ``obj``'s entry point ``name``: gated, a safe point, bytes counted.

    A call after ``dispose()`` raises ``DisposedError``; a call in flight is
    what ``dispose()`` waits for; an outermost call is a safe point of the
    owning session; and the buffers it may have created are counted as
    ``refresh`` says.
    """
    record: ModelRecord = object.__getattribute__(obj, "_lifecycle")
    depth = record.gate.enter()
    if not depth:
        raise disposed_error(obj, f"`{name}`")
    try:
        if depth == 1:
            record.owner.cleaner.safe_point()
        result = method(*args, **kwargs)
        if depth == 1 and (
            refresh is Refresh.ALWAYS or (refresh is Refresh.FIRST and name not in record.refreshed)
        ):
            record.refreshed.add(name)
            record.refresh(obj)
        return result
    finally:
        record.gate.exit()


class Managed:
    """What a managed model, module or optimizer shows of its record (a mixin).

    ``ManagedModel`` and ``ManagedObject`` put it in front of the object's own
    class; each has its own ``dispose()``, which leaving a ``with`` block calls.
    """

    _lifecycle: ModelRecord

    @property
    def state(self) -> ModelState:
        """Where it is in its life: ``LIVE``, ``DISPOSING`` or ``DISPOSED``."""
        return self._lifecycle.state

    @property
    def session(self) -> LifecycleSession:
        """The session that owns it."""
        return self._lifecycle.owner

    @property
    def dispose_timeout(self) -> float | None:
        """Default seconds ``dispose()`` waits for calls in flight (``None``: forever)."""
        return self._lifecycle.dispose_timeout

    @dispose_timeout.setter
    def dispose_timeout(self, value: float | None) -> None:
        self._lifecycle.dispose_timeout = check_timeout(value)

    @property
    def owned_variables(self) -> int:
        """Number of buffers it owns (replicas and shards counted); 0 once disposed."""
        if self._lifecycle.state is ModelState.DISPOSED:
            return 0
        return len(_tf.variable_leaves(_tf.object_variables(self)))

    @property
    def owned_bytes(self) -> int:
        """Bytes of the buffers it owns, by static shape; 0 once disposed."""
        if self._lifecycle.state is ModelState.DISPOSED:
            return 0
        leaves = _tf.variable_leaves(_tf.object_variables(self))
        return sum(_tf.leaf_nbytes(leaf) for leaf in leaves)

    def __enter__(self) -> Any:
        if self._lifecycle.state is not ModelState.LIVE:
            raise disposed_error(self, "`with`")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.dispose()  # type: ignore[attr-defined]  # ManagedModel's or ManagedObject's


def disposed_error(model: keras.Model, what: str) -> DisposedError:
    """The error raised when ``what`` is attempted on a disposed model."""
    record: ModelRecord = model._lifecycle
    if record.state is ModelState.DISPOSING:
        status = "is being disposed: its variables are being released"
    else:
        status = "has been disposed: its variables were released"
    kind = "model" if isinstance(model, keras.Model) else "object"
    return DisposedError(
        f"{type(model).__name__} {getattr(model, 'name', record.name)!r} {status}, so "
        f"{what} cannot run. Build or load a new {kind} instead; a disposed {kind} cannot "
        "be revived."
    )


class _LetGo:
    """A cleaner task that drops the last references to what a dispose took off a model."""

    __slots__ = ("objects",)

    def __init__(self, objects: list[Any]) -> None:
        self.objects = objects

    def __call__(self) -> None:
        # Emptied in place: the cleaner's loop still holds this task until
        # its next item arrives.
        self.objects.clear()


# A dispose timeout not given: use the record's own (None already means "no limit").
DEFAULT: Any = object()


@contextlib.contextmanager
def held(model: keras.Model, what: str) -> Iterator[None]:
    """Hold ``model``'s gate (like a call) for the block: ``dispose()`` waits for it.

    A model that is not managed is used as is.

    Raises:
        DisposedError: The model was disposed.
    """
    record: ModelRecord | None = getattr(model, "_lifecycle", None)
    if record is None:
        yield
        return
    if not record.gate.enter():
        raise disposed_error(model, what)
    try:
        yield
    finally:
        record.gate.exit()
