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
from collections.abc import Callable, Iterator
from typing import Any, Protocol

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
from .errors import DisposeInProgressError, DrainTimeoutError, LifecycleError

__all__ = [
    "DEFAULT_PRESSURE_THRESHOLD",
    "DEFAULT_TRIM_THRESHOLD",
    "LifecycleSession",
    "SessionStatistics",
    "current_session",
]

#: Bytes that dropped-but-undisposed models may hold that start a collection.
DEFAULT_PRESSURE_THRESHOLD = 128 * 2**20

#: Bytes released by managed models after which the cleaner returns the C
#: heap's free memory to the system (``malloc_trim(0)``, glibc only).
DEFAULT_TRIM_THRESHOLD = 32 * 2**20


class Owned(Protocol):
    """What a session needs of the things it owns (a model's record)."""

    def describe(self) -> str:
        """``"<class> '<name>'"`` for messages."""

    def dispose_owned(self, timeout: float | None) -> None:
        """Dispose the owned model if it is still alive; raise if it cannot drain."""


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


def collect() -> None:
    """What a cleaner runs: ``gc.collect()``, then TensorFlow's eager kernel cache when due.

    The kernel cache holds a kernel for every op and traced function that ran,
    those of disposed models included (about 35 KiB per buffer they held,
    0.1-0.7 MiB per model), until it is cleared; the next call of each live
    function then re-creates its kernel (about 6 ms for a served MLP), and the
    next dispose of a live model one release kernel per distinct variable
    shape (about 1 ms each). So the cache is cleared only once managed models
    released at least ``KERNEL_CACHE.statistics().threshold`` buffers (32)
    since the last clear, process-wide: a collection raised by allocations
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


_names = itertools.count(1)
_local = threading.local()


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
    """Owns the managed models created while it is current, and cleans up after them.

    A context manager, used once: ``with LifecycleSession(...) as session:`` makes
    it the current session of this thread and closes it on exit. Models created
    (or passed to ``manage()``) while it is current belong to it. A model dropped
    without ``dispose()`` is cleaned up by the session's cleaner, when the
    ``cleanup`` strategy says, with a ``ResourceWarning`` naming it.

    Args:
        cleanup: When deferred cleanup runs; see :class:`CleanupStrategy`.
        name: For messages, statistics and the cleaner thread; ``session-N`` if
            omitted.
        pressure_threshold: Buffer bytes allocated since the last collection by
            the session's models that are neither disposed nor the latest to
            allocate (so might have been dropped) after which the cleaner
            runs a garbage collection (the collector does not see these bytes
            by itself). ``None`` disables.
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
    clear_session: bool = attrs.field(default=False, kw_only=True, validator=_check_bool)
    freeze_heap: bool = attrs.field(default=False, kw_only=True)
    close_timeout: float | None = attrs.field(
        default=30.0, kw_only=True, converter=lambda v: check_timeout(v, "close_timeout")
    )
    collector: Callable[[], Any] = attrs.field(default=collect, kw_only=True, repr=False)
    parent: LifecycleSession | None = attrs.field(default=_CURRENT, kw_only=True, repr=False)
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
        )

    # -- context ------------------------------------------------------------------

    def __enter__(self) -> LifecycleSession:
        if self._state is not SessionState.OPEN:
            raise LifecycleError(
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
        return self

    def __exit__(self, *exc_info: object) -> None:
        stack = _stack()
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
            LifecycleError: The session is closing or closed.

        Example:
            >>> import threading, lifecycle as lc
            >>> with lc.LifecycleSession(name="shared") as session:
            ...     def work():
            ...         with session.activate():
            ...             assert lc.current_session() is session
            ...     threading.Thread(target=work).start()
        """
        if self._state is not SessionState.OPEN:
            raise LifecycleError(
                f"LifecycleSession {self.name!r} is {self._state.value} and cannot be "
                "activated; create a new session."
            )
        stack = _stack()
        stack.append(self)
        try:
            yield self
        finally:
            # Remove this activation, wherever later ones left the stack.
            for index in range(len(stack) - 1, -1, -1):
                if stack[index] is self:
                    del stack[index]
                    break

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
            LifecycleError: The session is closing or closed.
        """
        with self._lock:
            if self._state is not SessionState.OPEN:
                raise LifecycleError(
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

    def _adopt_child(self, child: LifecycleSession) -> None:
        with self._lock:
            if self._state is not SessionState.OPEN:
                raise LifecycleError(
                    f"LifecycleSession {self.name!r} is {self._state.value}: it cannot "
                    f"own the new session {child.name!r}."
                )
            self._children[id(child)] = child

    def _forget_child(self, child: LifecycleSession) -> None:
        with self._lock:
            self._children.pop(id(child), None)

    def safe_point(self) -> None:
        """A safe point: under ``ON_SAFE_POINTS``, run pending cleanup now.

        Managed models call it on entering a call, ``fit``, ``predict`` and the
        other entry points, and on creation; call it from your own loop too.
        """
        self._cleaner.safe_point()

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
                raise _close_error(self, errors)
            successor = self.parent.cleaner if self.parent is not None else None
            if successor is not None and KERNEL_CACHE.due():
                # Models disposed by a close leave their released buffers' stale
                # kernels (dispose(collect=False)); the cleaner taking over clears
                # them where its strategy runs work. Without a successor the last
                # collection below does.
                successor.enqueue(clear_kernel_cache_when_due)
            with self._lock:
                # Records left after disposing every live model belong to models
                # dropped without dispose(): only they need a collection to be found.
                dropped = bool(self._records)
            self._cleaner.close(successor, collect=dropped or successor is None)
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
            _default = LifecycleSession(name="default", parent=None)
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
