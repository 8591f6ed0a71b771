"""LifecycleSession: the owner of managed models, and when their cleanup runs.

Every managed model belongs to a session: the session current in the creating
thread, or the process-wide default session. Sessions nest into a tree; closing
one disposes its children, then its models, once, in reverse order of creation,
then runs its cleaner one last time.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

import attrs

from . import _tf
from ._core import (
    KERNEL_CACHE,
    LIVE_MODELS,
    PROCESS,
    Cleaner,
    CleanerStatistics,
    CleanupStrategy,
    SessionState,
    check_optional_int,
    check_timeout,
)
from .errors import ClosedError, DisposeInProgressError, DrainTimeoutError, LifecycleError

__all__ = [
    "DEFAULT_IDLE_COLLECTION",
    "DEFAULT_PRESSURE_THRESHOLD",
    "DEFAULT_TRIM_THRESHOLD",
    "LifecycleSession",
    "SessionStatistics",
    "current_session",
]

#: Bytes that dropped-but-undisposed models may hold that start a collection.
DEFAULT_PRESSURE_THRESHOLD = 128 * 2**20

#: ``IN_BACKGROUND``: seconds without a new allocation after which the cleaner
#: collects, if anything allocated since its last collection may have been dropped.
DEFAULT_IDLE_COLLECTION = 5.0

#: Bytes released by managed models after which the cleaner returns the C
#: heap's free memory to the system (``malloc_trim(0)``, glibc only).
DEFAULT_TRIM_THRESHOLD = 32 * 2**20


class Owned(Protocol):
    """What a session needs of the things it owns (a model's record)."""

    def describe(self) -> str:
        """``"<class> '<name>'"`` for messages."""

    def dispose_owned(self, timeout: float | None) -> None:
        """Dispose the owned model if it is still alive; raise if it cannot drain."""

    def move_to(self, owner: LifecycleSession) -> None:
        """Make ``owner`` the owner (the session hands the model out)."""

    def in_use(self) -> bool:
        """Whether a call of the model is in flight now."""


@attrs.frozen
class SessionStatistics:
    """A snapshot of a session.

    Attributes:
        name: The session's name.
        cleanup: Its cleanup strategy.
        state: ``OPEN``, ``CLOSING`` or ``CLOSED``.
        models: Managed models it owns now (live, or dropped and not yet cleaned).
        children: Child sessions still open.
        models_disposed: Models released by ``dispose()`` (or by closing the session).
        models_cleaned: Models dropped without ``dispose()`` that its cleaner released.
        clear_sessions: Times ``keras.backend.clear_session()`` ran at its close.
        cleaner: The cleaner's counters: collections, their time, byte pressure.
        variables: Buffers of variables made while it was current that it owns
            now (``adopt_all``), managed models' included.
        variable_bytes: Their bytes, by static shape.
        plain_models: Unmanaged Keras models built while it was current, alive
            and owned now.
        variables_released: Buffers it released itself: those of variables the
            collector found whose traced graphs still held them, and at close.
        variable_bytes_released: Their bytes.
    """

    name: str
    cleanup: CleanupStrategy
    state: SessionState
    models: int
    children: int
    models_disposed: int
    models_cleaned: int
    clear_sessions: int
    cleaner: CleanerStatistics
    variables: int = 0
    variable_bytes: int = 0
    plain_models: int = 0
    variables_released: int = 0
    variable_bytes_released: int = 0


def collect() -> None:
    """What a cleaner runs: ``gc.collect()``, then TensorFlow's eager kernel cache when due.

    The kernel cache holds a kernel for every op and traced function that ran,
    those of disposed models included, until it is cleared; the next call of
    each live function then re-creates its kernel, and the next dispose of a
    live model one release kernel per distinct variable shape (the sizes and
    costs are in ``docs/sessions.md#byte-pressure``). So the cache is cleared
    only once managed models released at least
    ``KERNEL_CACHE.statistics().threshold`` buffers (32) since the last
    clear, process-wide: a collection raised by allocations
    alone keeps the kernels of the models just built, and one that follows
    disposals frees what they left. ``keras.backend.clear_session()`` clears
    the cache regardless.
    """
    gc.collect()
    if KERNEL_CACHE.take():
        _tf.memory.clear_kernel_cache()


def clear_kernel_cache_when_due() -> None:
    """Clear TensorFlow's eager kernel cache if managed models released enough buffers.

    See :mod:`lifecycle._core._kernels`: the cache keeps stale kernels of every
    released buffer until it is cleared.
    """
    # due() first: take() counts a "skipped" clear, which is a collection's answer.
    if KERNEL_CACHE.due() and KERNEL_CACHE.take():
        _tf.memory.clear_kernel_cache()


def freeze_heap() -> None:
    """``gc.collect()``, then ``gc.freeze()``: later collections skip every object alive now.

    What is frozen is never collected afterwards; freeze after imports and
    warm-up, before creating the models the process will drop.
    """
    gc.collect()
    gc.freeze()


_T = TypeVar("_T")
_names = itertools.count(1)
_local = threading.local()


def _thread_scopes() -> list[tuple[LifecycleSession, contextlib.ExitStack]]:
    scopes = getattr(_local, "scopes", None)
    if scopes is None:
        scopes = _local.scopes = []
    return scopes


def _stack() -> list[LifecycleSession]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _check_threshold(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    check_optional_int(value, attribute.name, minimum=1, what="a number of bytes")


def _check_bool(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(
            f"`{attribute.name}` must be True or False. Received: {attribute.name}={value!r}"
        )


def _check_strategy(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, CleanupStrategy):
        members = ", ".join(f"CleanupStrategy.{m.name}" for m in CleanupStrategy)
        raise TypeError(f"`cleanup` must be one of {members}. Received: cleanup={value!r}")


_CURRENT: Any = object()


@attrs.define(eq=False)
class LifecycleSession:
    """Owns what is made while it is current, and frees what was dropped by its strategy.

    A context manager, used once: ``with LifecycleSession(...) as session:`` makes
    it the current session of this thread and closes it on exit. Like TensorFlow
    Java's ``EagerSession``, it owns everything created on a thread while it is
    current: managed models, and (``adopt_all``) plain Keras models of any kind,
    optimizers, ``tf.Module`` objects and raw ``tf.Variable`` objects, through
    their variables. Closing it disposes its managed models, releases every
    buffer it owns and makes its plain models raise ``DisposedError``; what
    :meth:`hand_out` hands out moves to the parent session and survives.

    A model dropped without ``dispose()`` is cleaned up by the session's
    cleaner at the strategy's moment (a managed one with a ``ResourceWarning``
    naming it): on its thread within seconds (``IN_BACKGROUND``), at the next
    ``safe_point()`` (``ON_SAFE_POINTS``), or by the end of ``close()``
    (``ON_SESSION_CLOSE``).

    Args:
        cleanup: When deferred cleanup runs; see :class:`CleanupStrategy`.
        name: For messages, statistics and the cleaner thread; ``session-N`` if
            omitted.
        pressure_threshold: Buffer bytes allocated since the last collection by
            the session's models that are neither disposed nor the latest to
            allocate (so might have been dropped) after which the cleaner
            runs a garbage collection (the collector does not see these bytes
            by itself). ``None`` disables.
        idle_collection: ``IN_BACKGROUND`` only: seconds without a new
            allocation after which the cleaner runs a collection if a model or
            variable made since its last collection was not disposed (it may
            have been dropped: the collector finds it, and the session frees
            it). At most one collection per burst of allocations, and none
            while one of its managed models is inside a call (a long ``fit``).
            ``None``: only byte pressure starts collections.
        trim_threshold: Buffer bytes released by the session's models after
            which the cleaner hands the C heap's free memory back to the
            operating system (``malloc_trim(0)``: glibc keeps freed memory for
            reuse otherwise); the cleaner then also trims after each of its
            collections. The trim runs where the strategy runs cleanup (the
            cleaner's thread by default). It frees only memory nobody uses and
            changes no allocator setting; off glibc it does nothing. ``None``
            disables it.
        clear_session: ``True`` runs ``keras.backend.clear_session()`` when the
            session closes, even while managed models are live. It is
            process-wide: it resets every thread's Keras state (dtype policy,
            layer-name counters, name scopes, other settings), whatever models
            the threads hold; only the closing thread gets its dtype policy,
            counters and name scopes back. ``False`` (default): the close
            leaves Keras's state alone.
        freeze_heap: On entering, collect once and ``gc.freeze()`` every
            surviving object, so later collections only scan objects created
            after the warm-up (imports, first traces). Process-wide; objects
            frozen are never collected afterwards.
        close_timeout: Seconds ``close()`` waits for each model's calls in flight.
        collector: The collection the cleaner runs: by default :func:`collect`
            (``gc.collect()``, then TensorFlow's eager kernel cache is cleared once
            enough buffers were released since the last clear).
            A seam for tests.
        parent: The parent session; defaults to the session current in this
            thread when the session is created.
        adopt_all: ``True`` (default): own every Keras model, optimizer,
            ``tf.Module`` and ``tf.Variable`` created on a thread where the
            session is current (``with session:``, ``session.activate()``),
            managed or not. ``False``: own managed models only, as the default
            session does.

    Example:
        >>> import keras, lifecycle as lc
        >>> with lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SAFE_POINTS) as session:
        ...     inputs = keras.Input((4,))
        ...     model = lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs))
        >>> model.state, session.state
        (<ModelState.DISPOSED: 'disposed'>, <SessionState.CLOSED: 'closed'>)
    """

    cleanup: CleanupStrategy = attrs.field(
        default=CleanupStrategy.IN_BACKGROUND, validator=_check_strategy
    )
    name: str = attrs.field(default=None, converter=lambda n: n or f"session-{next(_names)}")
    pressure_threshold: int | None = attrs.field(
        default=DEFAULT_PRESSURE_THRESHOLD, kw_only=True, validator=_check_threshold
    )
    trim_threshold: int | None = attrs.field(
        default=DEFAULT_TRIM_THRESHOLD, kw_only=True, validator=_check_threshold
    )
    idle_collection: float | None = attrs.field(
        default=DEFAULT_IDLE_COLLECTION,
        kw_only=True,
        converter=lambda v: check_timeout(v, "idle_collection"),
    )
    clear_session: bool = attrs.field(default=False, kw_only=True, validator=_check_bool)
    freeze_heap: bool = attrs.field(default=False, kw_only=True)
    close_timeout: float | None = attrs.field(
        default=30.0, kw_only=True, converter=lambda v: check_timeout(v, "close_timeout")
    )
    collector: Callable[[], Any] = attrs.field(default=collect, kw_only=True, repr=False)
    parent: LifecycleSession | None = attrs.field(default=_CURRENT, kw_only=True, repr=False)
    adopt_all: bool = attrs.field(default=True, kw_only=True, validator=_check_bool)
    _state: SessionState = attrs.field(default=SessionState.OPEN, init=False)
    _cleaner: Cleaner = attrs.field(init=False, repr=False)
    # Guards _records, _children and the counters. Never taken by finalizers.
    _lock: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)
    # Serialises close(); held for the whole close.
    _close_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    # Invariant: the records of every model this session owns that is neither
    # disposed nor cleaned, in creation order (dicts keep insertion order).
    _records: dict[int, Owned] = attrs.field(factory=dict, init=False, repr=False)
    _children: dict[int, LifecycleSession] = attrs.field(factory=dict, init=False, repr=False)
    _entered: bool = attrs.field(default=False, init=False, repr=False)
    _models_disposed: int = attrs.field(default=0, init=False, repr=False)
    _models_cleaned: int = attrs.field(default=0, init=False, repr=False)
    _clear_sessions: int = attrs.field(default=0, init=False, repr=False)
    # What it owns besides managed models (adopt_all): variables and plain models.
    _ledger: _tf.Ledger | None = attrs.field(default=None, init=False, repr=False)
    # Weak references to what hand_out() handed out (adopt_all).
    _handed: list[weakref.ref[Any]] = attrs.field(factory=list, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.parent is _CURRENT:
            self.parent = current_session()
        if self.parent is not None:
            self.parent._adopt_child(self)
        self._cleaner = Cleaner(
            strategy=self.cleanup,
            name=self.name,
            pressure_threshold=self.pressure_threshold,
            collector=self.collector,
            trim_threshold=self.trim_threshold,
            idle_collection=self.idle_collection,
            busy=self._in_use,
        )
        if self.adopt_all:
            cleaner = self._cleaner
            self._ledger = _tf.Ledger(
                self.name,
                allocated=cleaner.note_allocated,
                dead=lambda: cleaner.enqueue(self._sweep),
            )

    # -- context ------------------------------------------------------------------

    def __enter__(self) -> LifecycleSession:
        if self._state is not SessionState.OPEN:
            raise ClosedError(
                f"LifecycleSession {self.name!r} is {self._state.value} and cannot be "
                "entered again; create a new session."
            )
        if self._entered:
            raise LifecycleError(
                f"LifecycleSession {self.name!r} was already entered: a session is a "
                "single-use `with` block. Create a new session for each block."
            )
        self._entered = True
        if self.freeze_heap:
            freeze_heap()
        _stack().append(self)
        self._record()
        return self

    def __exit__(self, *exc_info: object) -> None:
        stack = _stack()
        self._stop_recording()
        if not stack or stack[-1] is not self:
            if self in stack:
                stack.remove(self)
            self.close()
            raise LifecycleError(
                f"LifecycleSession {self.name!r} exited out of order: another session "
                "entered after it is still current, or it was entered in another "
                "thread. Nest `with` blocks properly, one thread each."
            )
        stack.pop()
        self.close()

    @contextlib.contextmanager
    def activate(self) -> Iterator[LifecycleSession]:
        """Make the session current in this thread for a block, without closing it.

        Unlike ``with session:``, this may be used any number of times and from
        any thread: worker threads use it to create models in a session that
        another thread opened.

        Raises:
            ClosedError: The session is closing or closed.

        Example:
            >>> import threading, lifecycle as lc
            >>> with lc.LifecycleSession(name="shared") as session:
            ...     def work():
            ...         with session.activate():
            ...             assert lc.current_session() is session
            ...     threading.Thread(target=work).start()
        """
        if self._state is not SessionState.OPEN:
            raise ClosedError(
                f"LifecycleSession {self.name!r} is {self._state.value} and cannot be "
                "activated; create a new session."
            )
        stack = _stack()
        stack.append(self)
        self._record()
        try:
            yield self
        finally:
            self._stop_recording()
            # Remove this activation, wherever later ones left the stack.
            for index in range(len(stack) - 1, -1, -1):
                if stack[index] is self:
                    del stack[index]
                    break

    def _record(self) -> None:
        """Own what the calling thread creates from now on (``adopt_all``)."""
        if self._ledger is None:
            return
        scope = contextlib.ExitStack()
        scope.enter_context(self._ledger.scope())
        _thread_scopes().append((self, scope))

    def _stop_recording(self) -> None:
        if self._ledger is None:
            return
        scopes = _thread_scopes()
        for index in range(len(scopes) - 1, -1, -1):
            if scopes[index][0] is self:
                _, scope = scopes.pop(index)
                # A misnested exit (reported by the caller) leaves TensorFlow's
                # creator stack to the scope entered last.
                with contextlib.suppress(RuntimeError):
                    scope.close()
                return

    # -- ownership ------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        """``OPEN``, ``CLOSING`` or ``CLOSED``."""
        return self._state

    @property
    def cleaner(self) -> Cleaner:
        """The session's cleaner (runs deferred work by its strategy)."""
        return self._cleaner

    def adopt(self, record: Owned) -> None:
        """Take ownership of a model's record.

        Raises:
            ClosedError: The session is closing or closed.
        """
        with self._lock:
            if self._state is not SessionState.OPEN:
                raise ClosedError(
                    f"LifecycleSession {self.name!r} is {self._state.value}: it cannot own "
                    f"the new model {record.describe()}. Create models inside an open "
                    "session (or outside any, in the default session)."
                )
            self._records[id(record)] = record
        LIVE_MODELS.add(1)
        PROCESS.add("models_managed")

    def forget(self, record: Owned, *, cleaned: bool) -> None:
        """Stop owning a record whose model was disposed (or cleaned, if ``cleaned``)."""
        with self._lock:
            if self._records.pop(id(record), None) is None:
                return
            LIVE_MODELS.add(-1)
            PROCESS.add("models_cleaned" if cleaned else "models_disposed")
            if cleaned:
                self._models_cleaned += 1
            else:
                self._models_disposed += 1

    def hand_out(self, obj: _T, *others: Any) -> _T:
        """Hand objects out of the session: they move to the parent session and survive.

        A Keras model (managed or not), layer, optimizer, ``tf.Module`` or
        variable made while the session was current is the session's: closing
        it frees them. Handed out, they and every variable they hold belong to
        the parent session instead (the default session owns only managed
        models: a plain object handed out to it is nobody's, as outside any
        session).

        Args:
            obj: The object to keep.
            *others: More objects to keep.

        Returns:
            ``obj``, for ``model = session.hand_out(build())``.

        Raises:
            TypeError: An object is none of the kinds above.
            ClosedError: The session is closing or closed.

        Example:
            >>> import keras, numpy as np, lifecycle as lc
            >>> def build():
            ...     return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> with lc.LifecycleSession() as session:
            ...     best = session.hand_out(build())
            ...     scratch = build()
            >>> best.predict(np.ones((1, 2)), verbose=0).shape  # scratch's would raise
            (1, 1)
        """
        objects = (obj, *others)
        with self._lock:
            if self._state is not SessionState.OPEN:
                raise ClosedError(
                    f"LifecycleSession {self.name!r} is {self._state.value}: what it owned "
                    "is already released, so nothing can be handed out of it. Hand objects "
                    "out before the session closes."
                )
        self._pass_to_parent(objects)  # raises TypeError first for what it cannot own
        if self._ledger is not None:
            with self._lock:
                # Variables they make later (an optimizer's slots, built by the
                # first fit) are handed out too, when the session closes.
                self._handed.extend(weakref.ref(item) for item in objects)
        parent = self.parent
        for item in objects:
            record = getattr(item, "_lifecycle", None)
            if record is not None and record.owner is self and parent is not None:
                record.move_to(parent)
        return obj

    def _pass_to_parent(self, objects: Iterable[Any]) -> None:
        """Move what ``objects`` hold out of this session's ledger into the parent's."""
        if self._ledger is None:
            return
        taken = self._ledger.take(objects)
        parent = self.parent
        if parent is not None and parent._ledger is not None:
            parent._ledger.put(taken)

    def _release_record(self, record: Owned) -> None:
        """Stop owning ``record`` without counting it disposed (it moves elsewhere)."""
        with self._lock:
            if self._records.pop(id(record), None) is not None:
                LIVE_MODELS.add(-1)

    def forget_variables(self, variables: list[Any]) -> None:
        """Variables whose buffers a dispose released: no longer the session's to free."""
        if self._ledger is not None:
            self._ledger.discard(variables)

    def _in_use(self) -> bool:
        """Whether one of its managed models is inside a call (no idle collection now)."""
        with self._lock:
            records = list(self._records.values())
        return any(record.in_use() for record in records)

    def _sweep(self) -> None:
        """Free what the collector found dropped (a cleaner task)."""
        if self._ledger is not None:
            self._cleaner.note_released(self._ledger.sweep())

    def _adopt_child(self, child: LifecycleSession) -> None:
        with self._lock:
            if self._state is not SessionState.OPEN:
                raise ClosedError(
                    f"LifecycleSession {self.name!r} is {self._state.value}: it cannot "
                    f"own the new session {child.name!r}. Open the new session inside an "
                    "open one (or outside any)."
                )
            self._children[id(child)] = child

    def _forget_child(self, child: LifecycleSession) -> None:
        with self._lock:
            self._children.pop(id(child), None)

    def safe_point(self) -> None:
        """A safe point: under ``ON_SAFE_POINTS``, run pending cleanup now.

        Managed models call it on entering a call, ``fit``, ``predict`` and the
        other entry points, and on creation. Called by you, it also collects
        whenever a model or variable made since the last collection may have
        been dropped, so that what was dropped before it is freed by its end:
        call it where a pause is harmless (between days, folds or trials).
        """
        if self._ledger is not None:
            self._ledger.ensure_recording()
        self._cleaner.safe_point(explicit=True)

    # -- close ----------------------------------------------------------------------

    def close(self) -> None:
        """Dispose child sessions, then models, then run the cleaner one last time.

        Children and models go in reverse order of creation, each once. Safe to
        call twice and from any thread. Waits for each model's calls in flight
        (up to ``close_timeout``); it never frees under a running call.

        Raises:
            DrainTimeoutError: Some model's calls did not finish in time. Those
                models stay live and owned, the session stays open, and
                ``close()`` can be retried; everything else was disposed.
            DisposeInProgressError: Called from inside a call to one of the
                session's models.
        """
        with self._close_lock:
            if self._state is SessionState.CLOSED:
                return
            with self._lock:
                self._state = SessionState.CLOSING
                children = list(self._children.values())
                records = list(self._records.values())
            if self._ledger is not None:
                self._ledger.stop_recording()
            errors: list[LifecycleError] = []
            for child in reversed(children):
                try:
                    child.close()
                except (DrainTimeoutError, DisposeInProgressError) as error:
                    errors.append(error)
            for record in reversed(records):
                try:
                    record.dispose_owned(self.close_timeout)
                except (DrainTimeoutError, DisposeInProgressError) as error:
                    errors.append(error)
            if errors:
                with self._lock:
                    self._state = SessionState.OPEN
                if self._ledger is not None:
                    self._ledger.resume_recording()
                raise _close_error(self, errors)
            if self._ledger is not None:
                with self._lock:
                    handed, self._handed = self._handed, []
                self._pass_to_parent(item for ref in handed if (item := ref()) is not None)
                # After the managed models' drained disposals: the rest has no gate.
                _, released = self._ledger.close()
                self._cleaner.note_released(released)
            else:
                released = 0
            successor = self.parent.cleaner if self.parent is not None else None
            if successor is not None and KERNEL_CACHE.due():
                # Models disposed by a close leave their released buffers' stale
                # kernels (dispose(collect=False)); the cleaner taking over clears
                # them where its strategy runs work. Without a successor the last
                # collection below does.
                successor.enqueue(clear_kernel_cache_when_due)
            with self._lock:
                # Records left after disposing every live model belong to models
                # dropped without dispose(): only they need a collection to be found
                # (their buffers were released above if the session made them).
                dropped = bool(self._records)
            # What the close released goes back to the system now (a trim), not
            # whenever the successor's threshold is next reached.
            self._cleaner.close(successor, collect=dropped or successor is None, trim=released > 0)
            self._maybe_clear_session()
            with self._lock:
                self._state = SessionState.CLOSED
        if self.parent is not None:
            self.parent._forget_child(self)

    def _maybe_clear_session(self) -> None:
        # Opt-in only: Keras's state is per thread, and clear_session() resets it
        # for every thread, so no count of live models can tell that it is harmless.
        if not self.clear_session:
            return
        _tf.clear_session_preserving_caller_state()
        with self._lock:
            self._clear_sessions += 1

    def statistics(self) -> SessionStatistics:
        """A frozen snapshot of the session and its cleaner."""
        buffers = nbytes = models = released = released_bytes = 0
        if self._ledger is not None:
            buffers, nbytes, models = self._ledger.counts()
            released, released_bytes = self._ledger.released()
        with self._lock:
            return SessionStatistics(
                name=self.name,
                cleanup=self.cleanup,
                state=self._state,
                models=len(self._records),
                children=len(self._children),
                models_disposed=self._models_disposed,
                models_cleaned=self._models_cleaned,
                clear_sessions=self._clear_sessions,
                cleaner=self._cleaner.statistics(),
                variables=buffers,
                variable_bytes=nbytes,
                plain_models=models,
                variables_released=released,
                variable_bytes_released=released_bytes,
            )


def _close_error(session: LifecycleSession, errors: list[LifecycleError]) -> LifecycleError:
    if len(errors) == 1:
        return errors[0]
    in_flight = sum(getattr(error, "in_flight", 0) for error in errors)
    details = "\n".join(f"  - {error}" for error in errors)
    return DrainTimeoutError(
        f"LifecycleSession {session.name!r} could not close: {len(errors)} models could "
        f"not be disposed; the session stays open, retry close():\n{details}",
        in_flight=in_flight,
    )


_default_lock = threading.Lock()
_default: LifecycleSession | None = None


def _root() -> LifecycleSession:
    global _default
    with _default_lock:
        if _default is None:
            _default = LifecycleSession(name="default", parent=None, adopt_all=False)
        return _default


def current_session() -> LifecycleSession:
    """The session current in this thread, or the process-wide default session.

    The default session (``IN_BACKGROUND``) owns models created outside any
    ``with LifecycleSession()`` block, and is never closed. Each thread has its
    own current session: a new thread starts in the default session.

    Example:
        >>> import lifecycle as lc
        >>> lc.current_session().name
        'default'
    """
    stack = _stack()
    return stack[-1] if stack else _root()
