"""IPython and Jupyter: ``%load_ext lifecycle`` disposes the models a notebook let go of.

Re-running ``model = build()`` or ``del model`` drops a name, not the model:
TensorFlow's gradient registry and Keras's traced functions keep it, and its
buffers, alive. With the extension loaded, after each cell every Keras model
built since the load that nothing in the notebook refers to any more is put
under management (:func:`lifecycle.manage`) and disposed, newest first.
``%unload_ext lifecycle`` stops it.

Referred to: reachable from the notebook's names (directly, or through
containers, objects, closures, classes defined in the notebook), from other
threads' running functions, or from pending asyncio tasks. IPython's input and
output history (``In``, ``Out``, ``_``, ``_N``, ...) does not count: a model
only shown as a cell's output is disposed. A model that shares a variable with
one referred to stays: its dispose would release the shared buffers. Nothing is
disposed while a cell runs (a cell that runs cells, another subshell's cell).
``docs/notebooks.md`` says more, and what the walk of the namespace costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import keras

from .. import _tf
from .._core import ModelState
from .._model import ManagedModel, manage
from ..errors import DrainTimeoutError, LifecycleError
from ._reach import reach

if TYPE_CHECKING:
    from IPython.core.interactiveshell import ExecutionResult, InteractiveShell

__all__ = [
    "NotebookStatistics",
    "load_ipython_extension",
    "statistics",
    "unload_ipython_extension",
]

_logger = logging.getLogger(__name__)

# IPython's input and output history: In, Out, _ih, _oh, _dh, _, __, ___, _N, _i, _ii,
# _iii, _iN. A model only shown as a cell's output is not kept by being shown.
_HISTORY = re.compile(r"In|Out|_ih|_oh|_dh|_{1,3}|_\d+|_i{1,3}|_i\d+")
# Objects a walk enters at most; past it, nothing is disposed after that cell.
_WALK_LIMIT = 500_000


@attrs.frozen
class NotebookStatistics:
    """What the extension did since ``%load_ext lifecycle``.

    Attributes:
        cells: Cells that ran since.
        walks: Cells after which the namespace was walked: a model built since
            the load was not itself the value of a name.
        models_disposed: Models disposed because nothing referred to them.
        bytes_released: Bytes of buffers those disposals released.
        models_live: Models built since the load, alive and not disposed after
            the last cell.
        objects_walked: Objects the last walk entered.
        last_walk_seconds: How long the last walk took.
        max_walk_seconds: How long the longest walk took.
    """

    cells: int
    walks: int
    models_disposed: int
    bytes_released: int
    models_live: int
    objects_walked: int
    last_walk_seconds: float
    max_walk_seconds: float


@attrs.define(eq=False)
class _NotebookCleaner:
    """Records the models built while it is loaded; disposes those the notebook let go of."""

    shell: InteractiveShell
    # Weak references to the models built since the load, and the call that ends
    # their recording. A new recording starts after each cell, carrying over the
    # live models, so that models Python freed do not pile up in it.
    _recorder: Any = attrs.field(init=False, default=None)
    _stop_recording: Callable[[], None] | None = attrs.field(init=False, default=None)
    # True from load to unload: the hook does nothing once closed.
    _open: bool = attrs.field(init=False, default=False)
    # Held by the hook and by close(): one cell's clean-up at a time, and none after close().
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _cells: int = attrs.field(init=False, default=0)
    _walks: int = attrs.field(init=False, default=0)
    _models_disposed: int = attrs.field(init=False, default=0)
    _bytes_released: int = attrs.field(init=False, default=0)
    _models_live: int = attrs.field(init=False, default=0)
    _objects_walked: int = attrs.field(init=False, default=0)
    _last_walk_seconds: float = attrs.field(init=False, default=0.0)
    _max_walk_seconds: float = attrs.field(init=False, default=0.0)
    # The walk-limit warning is given once per load.
    _warned_limit: bool = attrs.field(init=False, default=False)

    def open(self) -> None:
        """Start recording and register the hook."""
        # The self-check builds models of its own: before the recording starts.
        _tf.check_compatibility()
        self._recorder, self._stop_recording = _start_recording()
        self._open = True
        self.shell.events.register("post_run_cell", self.post_run_cell)

    def close(self) -> None:
        """Unregister the hook and stop recording; safe to call twice."""
        with self._lock:
            if not self._open:
                return
            self._open = False
            with contextlib.suppress(ValueError):  # unregistered by someone else
                self.shell.events.unregister("post_run_cell", self.post_run_cell)
            if self._stop_recording is not None:
                self._stop_recording()
            self._recorder = self._stop_recording = None

    def post_run_cell(self, result: ExecutionResult | None) -> None:
        """IPython's ``post_run_cell`` event: dispose the models the notebook let go of.

        Never raises: a failure is logged as a warning, and the cell's outcome
        is left as it was.
        """
        # Another thread's cell (a subshell) is being cleaned up after: that one will do.
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._open:
                self._cells += 1
                self._clean_up(result)
        except Exception as error:
            # Only the message goes to the log: a traceback would hold the walk's models.
            message = f"{type(error).__name__}: {error}"
            _logger.warning("keras-lifecycle: the notebook clean-up failed: %s", message)
        finally:
            self._lock.release()

    def _clean_up(self, result: ExecutionResult | None) -> None:
        namespaces = _namespaces(self.shell)
        if _cell_running(namespaces):
            return
        models = [model for model in self._recorder.alive() if _live(model)]
        failed = set()
        for model in reversed(self._unreferenced(models, namespaces, result)):  # newest first
            if not self._dispose(model):
                failed.add(id(model))
        self._rotate(failed)

    def _unreferenced(
        self,
        models: list[keras.Model],
        namespaces: list[dict[str, Any]],
        result: ExecutionResult | None,
    ) -> list[keras.Model]:
        """The ``models`` nothing in the notebook refers to, in their order."""
        if not models:
            return []
        roots = list(_named(namespaces))
        direct = {id(root) for root in roots}
        if all(id(model) in direct for model in models):
            return []  # the usual cell: each model is the value of a name
        roots += _held_elsewhere()
        shell = self.shell
        stops = [
            shell,
            self,
            result,
            *namespaces,
            getattr(shell, "user_ns_hidden", None),
            getattr(shell, "displayhook", None),
            getattr(shell, "history_manager", None),
            getattr(shell, "kernel", None),
            *(ns.get(name) for ns in namespaces for name in ("In", "Out", "_ih", "_oh")),
        ]
        started = time.perf_counter()
        found = reach(
            roots,
            stops=stops,
            wanted={id(model) for model in models},
            own_module=namespaces[0].get("__name__", "__main__"),
            limit=_WALK_LIMIT,
        )
        seconds = time.perf_counter() - started
        self._walks += 1
        self._objects_walked = found.objects
        self._last_walk_seconds = seconds
        self._max_walk_seconds = max(self._max_walk_seconds, seconds)
        if not found.complete:
            self._warn_limit()
            return []
        reached = {id(model) for model in found.models}
        unreached = [model for model in models if id(model) not in reached]
        if not unreached:
            return []
        # A model sharing a variable with a reached one (a layer, its optimizer) stays:
        # its dispose would release the shared buffers.
        shared = {id(v) for model in found.models for v in _variables(model)}
        return [m for m in unreached if not any(id(v) in shared for v in _variables(m))]

    def _dispose(self, model: keras.Model) -> bool:
        """Dispose ``model``; False if it failed and should be forgotten."""
        try:
            report = manage(model).dispose(timeout=0)
        except DrainTimeoutError:
            return True  # a call is running on another thread: after a later cell
        except Exception as error:  # one model's failure leaves the others to dispose
            message = f"{type(error).__name__}: {error}"
            _logger.warning(
                "keras-lifecycle: could not dispose %s %r, which the notebook no longer "
                "refers to; it is left alone: %s",
                type(model).__name__,
                getattr(model, "name", "?"),
                message,
            )
            return False
        self._models_disposed += 1
        self._bytes_released += report.bytes_released
        _logger.info(
            "keras-lifecycle: disposed %s %r (%d bytes): no name in the notebook refers to it",
            type(model).__name__,
            report.model_name,
            report.bytes_released,
        )
        return True

    def _rotate(self, failed: set[int]) -> None:
        """Record into a new recorder, carrying over the live models not given up on."""
        recorder, stop = _start_recording()
        assert self._stop_recording is not None
        self._stop_recording()
        # Models built meanwhile on other threads are in one of the two, or both.
        carried = [m for m in self._recorder.alive() if _live(m) and id(m) not in failed]
        for model in carried:
            recorder.add(model)
        self._recorder, self._stop_recording = recorder, stop
        self._models_live = len(carried)

    def _warn_limit(self) -> None:
        """Warn (once per load) that a walk stopped at its limit."""
        if self._warned_limit:
            return
        self._warned_limit = True
        _logger.warning(
            "keras-lifecycle: the notebook's namespace holds more than %d objects to look "
            "through, so the models it no longer refers to were not disposed after this "
            "cell (nor will be after cells where that stays so). Dispose them with "
            "model.dispose(), or keep large collections of Python objects (lists of "
            "lists, of tuples) out of the namespace.",
            _WALK_LIMIT,
        )

    def statistics(self) -> NotebookStatistics:
        """A frozen snapshot of the counters."""
        return NotebookStatistics(
            cells=self._cells,
            walks=self._walks,
            models_disposed=self._models_disposed,
            bytes_released=self._bytes_released,
            models_live=self._models_live,
            objects_walked=self._objects_walked,
            last_walk_seconds=self._last_walk_seconds,
            max_walk_seconds=self._max_walk_seconds,
        )


def _start_recording() -> tuple[Any, Callable[[], None]]:
    stack = contextlib.ExitStack()
    recorder = stack.enter_context(_tf.record_models())
    return recorder, stack.close


def _live(model: keras.Model) -> bool:
    """Whether ``model`` has buffers to release: not disposed, nor being disposed."""
    return not isinstance(model, ManagedModel) or model.state is ModelState.LIVE


def _namespaces(shell: InteractiveShell) -> list[dict[str, Any]]:
    """The namespaces cells run in (one dict, unless the shell was given two)."""
    user_ns, global_ns = shell.user_ns, shell.user_global_ns
    return [user_ns] if global_ns is user_ns else [user_ns, global_ns]


def _cell_running(namespaces: list[dict[str, Any]]) -> bool:
    """Whether notebook code is running: on this thread, or a cell on another one."""
    this = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        while frame is not None:
            if any(frame.f_globals is ns for ns in namespaces) and (
                ident == this or frame.f_code.co_name == "<module>"
            ):
                return True
            frame = frame.f_back
    return False


def _variables(model: keras.Model) -> list[Any]:
    try:
        return _tf.keras_variables(model)
    except Exception:  # a model half built, or disposed: no variable worth keeping for
        return []


def _named(namespaces: list[dict[str, Any]]) -> Iterator[Any]:
    """The values of the notebook's names, IPython's history left out."""
    for ns in namespaces:
        for name, value in list(ns.items()):  # a copy: another thread may bind a name
            if not (isinstance(name, str) and _HISTORY.fullmatch(name)):
                yield value


def _held_elsewhere() -> list[Any]:
    """What other threads' running functions and this thread's pending tasks hold."""
    held = []
    this = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        if ident == this:
            continue
        while frame is not None:
            # A function's locals; a module's (another library's globals) are not roots.
            # Before Python 3.13 the read leaves a copy on the frame, refreshed at
            # the next read: a local rebound since is kept until the next cell.
            if frame.f_code.co_flags & inspect.CO_OPTIMIZED:
                held.extend(frame.f_locals.values())
            frame = frame.f_back
    with contextlib.suppress(RuntimeError):  # no event loop runs on this thread
        current = asyncio.current_task()
        held.extend(task for task in asyncio.all_tasks() if task is not current)
    return held


# The extension loaded in this process, if any (one shell per process).
_loaded: _NotebookCleaner | None = None
_loaded_lock = threading.Lock()


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Start disposing the models the notebook lets go of: ``%load_ext lifecycle``.

    IPython calls it; ``%load_ext lifecycle`` (or
    ``%load_ext lifecycle.integrations.ipython``) does. Loading it again into the
    same shell changes nothing.

    Args:
        ipython: The running shell.

    Example:
        >>> %load_ext lifecycle  # doctest: +SKIP
    """
    global _loaded
    with _loaded_lock:
        if _loaded is not None:
            if _loaded.shell is ipython:
                return
            _loaded.close()
        cleaner = _NotebookCleaner(ipython)
        cleaner.open()
        _loaded = cleaner


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """Stop it: ``%unload_ext lifecycle``. Models already disposed stay disposed.

    Args:
        ipython: The running shell.
    """
    global _loaded
    with _loaded_lock:
        if _loaded is not None and _loaded.shell is ipython:
            _loaded.close()
            _loaded = None


def statistics() -> NotebookStatistics:
    """What the extension did since it was loaded, and what its walks cost.

    Returns:
        A frozen :class:`NotebookStatistics`.

    Raises:
        LifecycleError: The extension is not loaded.

    Example:
        >>> from lifecycle.integrations import ipython  # doctest: +SKIP
        >>> ipython.statistics().models_disposed  # doctest: +SKIP
        1
    """
    cleaner = _loaded
    if cleaner is None:
        raise LifecycleError(
            "The notebook extension is not loaded, so it has no statistics. Run "
            "`%load_ext lifecycle` in the notebook first."
        )
    return cleaner.statistics()
