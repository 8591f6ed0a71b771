"""Ray Tune: every Keras model a trial builds is disposed when the trial ends.

Ray Tune runs trials in worker processes, and with ``reuse_actors=True`` one
trial after another in the same process. Dropping a TensorFlow model frees
little (TensorFlow's gradient registry pins every traced training step), so a
reused worker grows with every trial. Here, for function trainables::

    tuner = tune.Tuner(managed_trainable(train), param_space=..., tune_config=...)

and for class trainables ``class Trainable(ManagedTrainable, tune.Trainable)``.
The user's code is unchanged: it builds plain ``keras.Model`` s and calls
``ray.tune.report``. Every model built while a trial runs is recorded (a weak
reference, through Keras's ``Model.__new__``; see ``lifecycle/_tf/_recording.py``)
and, when the trial ends, the recorded models still alive are put under
management (:func:`lifecycle.manage`) and disposed, newest first:

* a function trainable's models, on the thread that ran the function, as soon
  as it returns, raises, or is stopped (Tune stops a function at its next
  ``ray.tune.report``, which raises ``SystemExit`` there), before Tune learns
  that the trial ended;
* a class trainable's models, after ``stop()`` (and with it ``cleanup()``) ran,
  or, when Tune reuses the actor, after ``reset()`` (and the class's
  ``reset_config()``) ran; models the trainable still holds in an attribute
  after ``reset_config()`` are the next trial's.

Models that existed before the trial (built when the worker imported its
modules) are not touched. A Keras model passed with ``tune.with_parameters`` is
deserialized inside each trial, so each trial has its own copy, disposed with
it. A model built in a trial belongs to that trial: a model cached across
trials must be built outside them. Tune runs one trial at a time in a worker
process, and the recording is the process's: two trials run at once in one
process would each dispose the other's models.

Threads. Tune runs each function trial on a new thread. glibc gives threads
malloc arenas of their own (up to 8 per core), and what a trial's kernels left
in its thread's arena is not always reused by the next thread. Measured with
``benchmarks/ray_tune.py`` (a reused worker, every model disposed; the figures
are in ``benchmarks/results/ray_tune.json`` and ``docs/scaling.md``, threads and
the CPU allocator): a worker grew several times as much on Tune's new threads as
on one long-lived thread; ``MALLOC_ARENA_MAX=2`` flattened both a little more,
and ``LIFECYCLE_ALLOCATOR=system`` (one arena and a high trim threshold) did
worse than either. The long-lived thread is the flattest setting that needs
nothing from the user's environment, so :func:`managed_trainable` runs the user's function
on one long-lived thread per worker process (``thread="worker"``, the default)
while Tune's trial thread waits for it: ``ray.tune.report`` works from there
(Tune's session is per process), a stop raises there as it would on Tune's
thread, and each trial starts with the Keras state of a new thread (layer
names, dtype policy, seed generator), so that the same seeds give the same
results. ``thread="trial"`` keeps Tune's thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import attrs
import keras

from ... import _tf
from ..._core import ModelState
from ..._model import ManagedModel, manage

try:
    import ray.tune  # noqa: F401 (the extra is there; its internals are read in _internals)
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "lifecycle.integrations.ray needs Ray Tune, an optional extra: "
        'pip install "keras-lifecycle[ray]"'
    ) from error

from ._internals import check_ray_internals, function_trainable_class

# At import, rather than at a trial's end, when Ray moved something.
check_ray_internals(serve=False)

__all__ = ["ManagedTrainable", "WorkerStatistics", "managed_trainable", "worker_statistics"]

_logger = logging.getLogger(__name__)

_Function = TypeVar("_Function", bound=Callable[..., Any])

#: Seconds a trainable's stop or reset waits for its function to end before it
#: disposes; Tune's own wait before reusing an actor (same variable, same default).
_THREAD_TIMEOUT_VARIABLE = "TUNE_FUNCTION_THREAD_TIMEOUT_S"
_THREAD_TIMEOUT_DEFAULT = 2.0
_THREADS = ("worker", "trial")


@attrs.frozen
class WorkerStatistics:
    """What the managed trials of this worker process did with their models.

    Attributes:
        trials: Trials begun in this process (a reused actor runs several).
        models_built: Keras models the trials built (not counting the
            functional model a ``Sequential`` builds for itself).
        models_disposed: Of those, models disposed when their trial ended
            (or by the trial itself). The others were freed by Python before
            the trial ended, or are the current trial's.
        bytes_released: Bytes of buffers those disposals released.
        models_live: Models of the current trial, alive and not disposed: 0
            between trials.
    """

    trials: int
    models_built: int
    models_disposed: int
    bytes_released: int
    models_live: int


@attrs.define(eq=False)
class _Trial:
    """One trial's recording of the models it builds."""

    recorder: _tf.ModelRecorder
    # Exits the recording (record_models' context); None once exited.
    stop_recording: Callable[[], None] | None
    # True once a function trainable's function started (it sets function_done).
    started: bool = False
    # True once its end began; then no other end runs.
    ending: bool = False
    # Set once the trial's models were disposed (or handed to the next trial).
    ended: threading.Event = attrs.field(factory=threading.Event)
    # Set when a function trainable's function has ended; None for a class trainable.
    function_done: threading.Event | None = None


@attrs.define(eq=False)
class _Worker:
    """The process's trials: the current one and the totals."""

    current: _Trial | None = None
    trials: int = 0
    models_built: int = 0
    models_disposed: int = 0
    bytes_released: int = 0
    # Guards the fields above and each trial's end.
    lock: threading.RLock = attrs.field(factory=threading.RLock)

    def begin(self) -> _Trial:
        """Start recording a trial's models; it becomes the current trial."""
        # The self-check builds models of its own: not inside a recording.
        _tf.check_compatibility()
        stack = contextlib.ExitStack()
        recorder = stack.enter_context(_tf.record_models())
        trial = _Trial(recorder, stack.close)
        with self.lock:
            self.trials += 1
            self.current = trial
        return trial

    def end(self, trial: _Trial, keep: tuple[keras.Model, ...] = ()) -> None:
        """Dispose ``trial``'s live models, newest first, except ``keep``; once per trial."""
        with self.lock:
            if trial.ending:
                return
            trial.ending = True
            if trial.stop_recording is not None:
                trial.stop_recording()
                trial.stop_recording = None
            if self.current is trial:
                self.current = None
        models = trial.recorder.alive()
        kept = {id(model) for model in keep}
        disposed, released = 0, 0
        # Outside the lock: a dispose waits (bounded) for calls in flight.
        for model in reversed(models):
            if id(model) in kept:
                continue
            if isinstance(model, ManagedModel) and model.state is ModelState.DISPOSED:
                disposed += 1  # the trial disposed it itself
                continue
            try:
                report = manage(model).dispose()
            except Exception as exc:  # one model's failure leaves the others to dispose
                _logger.warning("keras-lifecycle: could not dispose %r: %s", model, exc)
                continue
            disposed += 1
            released += report.bytes_released
        with self.lock:
            # Models kept for the next trial count there.
            self.models_built += trial.recorder.recorded - sum(id(m) in kept for m in models)
            self.models_disposed += disposed
            self.bytes_released += released
        trial.ended.set()

    def statistics(self) -> WorkerStatistics:
        with self.lock:
            live = 0
            if self.current is not None:
                live = sum(
                    not (isinstance(m, ManagedModel) and m.state is ModelState.DISPOSED)
                    for m in self.current.recorder.alive()
                )
            return WorkerStatistics(
                trials=self.trials,
                models_built=self.models_built,
                models_disposed=self.models_disposed,
                bytes_released=self.bytes_released,
                models_live=live,
            )


_worker = _Worker()


def worker_statistics() -> WorkerStatistics:
    """Trials, models built and disposed, and bytes released in this worker process.

    Call it inside a trial (or a trainable) to see its worker: the driver
    process runs no trials.

    Returns:
        A frozen :class:`WorkerStatistics`.

    Example:
        >>> from lifecycle.integrations.ray import worker_statistics
        >>> worker_statistics().models_live
        0
    """
    return _worker.statistics()


def _thread_timeout() -> float:
    try:
        return float(os.environ.get(_THREAD_TIMEOUT_VARIABLE, _THREAD_TIMEOUT_DEFAULT))
    except ValueError:
        return _THREAD_TIMEOUT_DEFAULT


def _held_models(trainable: Any) -> tuple[keras.Model, ...]:
    """Models a trainable holds in its attributes, directly or in a list, tuple or dict."""
    found = []
    for value in vars(trainable).values():
        if isinstance(value, dict):
            values = list(value.values())
        elif isinstance(value, list | tuple):
            values = list(value)
        else:
            values = [value]
        found += [item for item in values if isinstance(item, keras.Model)]
    return tuple(found)


class ManagedTrainable:
    """A mixin: the Keras models of each trial of a Tune trainable are disposed when it ends.

    Put it first among the bases of a class trainable:
    ``class Train(ManagedTrainable, tune.Trainable)``. The trainable behaves as
    before (same ``setup``, ``step``, ``save_checkpoint``, ``reset_config``),
    and in addition every Keras model built while a trial runs — in ``setup``,
    ``step``, ``reset_config`` or anywhere on any thread meanwhile — is
    recorded and disposed when the trial ends:

    * at ``stop()``, after the base class's ``stop()`` (and so ``cleanup()``)
      ran: a trial that finished, failed, or that a scheduler or stopper ended;
    * at ``reset()``, when Tune reuses the actor for the next trial, after the
      base class's ``reset()`` and your ``reset_config()`` ran. A model your
      ``reset_config()`` keeps in an attribute of the trainable (directly, or
      in a list, tuple or dict) goes on to the next trial; the others are
      disposed. Models built by ``reset_config()`` are the next trial's.

    Models that existed before the trial are not touched.
    :func:`managed_trainable` uses this mixin for function trainables.

    Example:
        >>> from ray import tune
        >>> from lifecycle.integrations.ray import ManagedTrainable
        >>> class Train(ManagedTrainable, tune.Trainable):
        ...     def setup(self, config):
        ...         self.model = build(config)  # doctest: +SKIP
        ...     def step(self):
        ...         return {"loss": fit_one_epoch(self.model)}  # doctest: +SKIP
    """

    _lifecycle_trial: _Trial

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lifecycle_trial = self._lifecycle_begin()
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            _worker.end(self._lifecycle_trial)
            raise

    def reset(self, new_config: dict[str, Any], *args: Any, **kwargs: Any) -> bool:
        """Reuse the actor: the base class's ``reset()``, then dispose the last trial's models."""
        old = self._lifecycle_trial
        if old.function_done is not None:
            # Tune's reset_config stops the function (and waits for it); its
            # models were disposed on its thread when it ended.
            try:
                return super().reset(new_config, *args, **kwargs)  # type: ignore[misc]
            finally:
                self._lifecycle_end(old)
                self._lifecycle_trial = self._lifecycle_begin()
        # Models built from here on (by reset_config too) are the next trial's.
        with _worker.lock:
            if old.stop_recording is not None:
                old.stop_recording()
                old.stop_recording = None
        new = self._lifecycle_trial = self._lifecycle_begin()
        try:
            return super().reset(new_config, *args, **kwargs)  # type: ignore[misc]
        finally:
            keep = _held_models(self)
            for model in keep:
                new.recorder.add(model)
            self._lifecycle_end(old, keep)

    def stop(self) -> None:
        """The base class's ``stop()`` (and ``cleanup()``), then dispose the trial's models."""
        try:
            super().stop()  # type: ignore[misc]
        finally:
            self._lifecycle_end(self._lifecycle_trial)

    def _lifecycle_begin(self) -> _Trial:
        trial = _worker.begin()
        if _is_function_trainable(self):
            trial.function_done = threading.Event()
        return trial

    @staticmethod
    def _lifecycle_end(trial: _Trial, keep: tuple[keras.Model, ...] = ()) -> None:
        done = trial.function_done
        if done is not None and trial.started and not done.wait(_thread_timeout()):
            # The function still runs (it has not reached a report since it was
            # told to stop): its models may be in use, and are left to it.
            _logger.warning(
                "keras-lifecycle: the trial's function did not end within %s s; its models "
                "are disposed when it ends (%s sets the wait).",
                _thread_timeout(),
                _THREAD_TIMEOUT_VARIABLE,
            )
            return
        _worker.end(trial, keep)


def _is_function_trainable(trainable: Any) -> bool:
    return isinstance(trainable, function_trainable_class())


class _TrialThread:
    """One daemon thread per process on which the trials' functions run, one after another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._busy = False

    def run(self, job: Callable[[], Any]) -> Any:
        """``job()`` on the long-lived thread; this thread waits. Inline if it is busy."""
        with self._lock:
            busy = self._busy
            if not busy:
                self._busy = True
                if self._thread is None or self._pid != os.getpid():  # forked: no thread
                    self._pid = os.getpid()
                    self._jobs = queue.SimpleQueue()
                    self._thread = threading.Thread(
                        target=self._serve, name="lifecycle-tune-trials", daemon=True
                    )
                    self._thread.start()
        if busy:  # another trial's function still runs there: never wait behind it
            return job()
        outcome: list[Any] = []
        done = threading.Event()
        context = contextvars.copy_context()
        try:
            self._jobs.put((functools.partial(context.run, job), outcome, done))
            done.wait()
        finally:
            with self._lock:
                self._busy = False
        succeeded, value = outcome
        if not succeeded:
            raise value
        return value

    def _serve(self) -> None:
        while True:
            job, outcome, done = self._jobs.get()
            try:
                # Each trial starts with the Keras state of a new thread, as on Tune's.
                _tf.fresh_keras_thread_state()
                outcome += [True, job()]
            except BaseException as exc:  # SystemExit: Tune stopped the trial
                outcome += [False, exc]
            finally:
                done.set()
            del job, outcome, done


_trial_thread = _TrialThread()


def _run_trial(
    function: Callable[..., Any], thread: str, config: dict[str, Any], kwargs: dict[str, Any]
) -> Any:
    """Run one trial's function, then dispose its models on the same thread."""
    trial = _worker.current
    own = trial is None or trial.ending
    if own:  # called outside a managed trainable: the call is the trial
        trial = _worker.begin()
    assert trial is not None
    trial.started = True

    def body() -> Any:
        try:
            return function(config, **kwargs)
        finally:
            try:
                _worker.end(trial)
            finally:
                if trial.function_done is not None:
                    trial.function_done.set()

    if thread == "worker":
        return _trial_thread.run(body)
    return body()


def managed_trainable(
    function: _Function | None = None, *, thread: Literal["worker", "trial"] = "worker"
) -> Any:
    """A Tune function trainable whose trials dispose every Keras model they build.

    Use it where the function goes: ``tune.Tuner(managed_trainable(train), ...)``,
    also inside or around ``tune.with_parameters`` and ``tune.with_resources``,
    or as a decorator (``@managed_trainable``). The function is called as Tune
    calls it (``train(config)``, with ``with_parameters``' keyword arguments),
    keeps its name, and reports with ``ray.tune.report``. Every Keras model
    built while it runs (on any thread) is disposed on the thread that ran it,
    as soon as it returns, raises, or is stopped by a scheduler or stopper (at
    its next ``ray.tune.report``), before Tune sees the trial end; with or
    without ``reuse_actors``. The trainable Tune makes of it also has the
    :class:`ManagedTrainable` mixin, which waits for the function before the
    actor is stopped or reused.

    Args:
        function: The trainable function, taking ``config``.
        thread: ``"worker"`` (default): run the function of every trial of a
            worker process on one long-lived thread, while Tune's trial thread
            waits, so that memory one trial freed is reused by the next (on
            Tune's new thread per trial, glibc's per-thread arenas grew a
            reused worker several times as much; see the module's notes). Each
            trial starts with the Keras state of a new thread. ``"trial"``:
            run it on Tune's trial thread, as Tune does.

    Returns:
        The managed trainable (a function), or a decorator when ``function``
        is omitted.

    Raises:
        TypeError: ``function`` is a class (use :class:`ManagedTrainable`), a
            generator function, or not callable.
        ValueError: ``thread`` is neither ``"worker"`` nor ``"trial"``.

    Example:
        >>> from ray import tune
        >>> from lifecycle.integrations.ray import managed_trainable
        >>> def train(config):
        ...     model = build(config)  # doctest: +SKIP
        ...     for epoch in range(config["epochs"]):  # doctest: +SKIP
        ...         history = model.fit(x, y, epochs=1, verbose=0)  # doctest: +SKIP
        ...         tune.report({"loss": history.history["loss"][-1]})  # doctest: +SKIP
        >>> managed_trainable(train).__name__
        'train'
    """
    if thread not in _THREADS:
        raise ValueError(
            f"managed_trainable() runs a trial on the worker's thread ('worker') or on Tune's "
            f"('trial'). Received: thread={thread!r}"
        )
    if function is None:
        return functools.partial(managed_trainable, thread=thread)
    if inspect.isclass(function):
        raise TypeError(
            "managed_trainable() takes a function trainable; for a class trainable, put the "
            "ManagedTrainable mixin first among its bases (class T(ManagedTrainable, "
            f"tune.Trainable)). Received: the class {function.__qualname__}"
        )
    if not callable(function):
        raise TypeError(
            "managed_trainable() takes a function trainable, train(config). "
            f"Received: {type(function).__qualname__} object {function!r:.80}"
        )
    if inspect.isgeneratorfunction(function):
        raise TypeError(
            "managed_trainable() takes a function that reports with ray.tune.report(); a "
            f"generator (yield) trainable is not supported. Received: {function!r:.80}"
        )
    if getattr(function, "__lifecycle_thread__", None) == thread:
        return function
    if hasattr(function, "__lifecycle_thread__"):  # managed for the other thread
        function = function.__wrapped__

    @functools.wraps(function)
    def trainable(config: dict[str, Any], **kwargs: Any) -> Any:
        return _run_trial(function, thread, config, kwargs)

    mixins = getattr(function, "__mixins__", ())
    mixins = tuple(m for m in mixins if m is not ManagedTrainable)
    trainable.__mixins__ = (ManagedTrainable, *mixins)  # type: ignore[attr-defined]
    trainable.__lifecycle_thread__ = thread  # type: ignore[attr-defined]
    return trainable
