"""Record the Keras models built while a recorder is active; give a thread fresh Keras state.

Code that runs someone else's training function (a Ray Tune trial) has to find
every model the function builds, without the function calling the library.
Every Keras 3 model goes through ``keras.src.models.model.Model.__new__``: a
``Sequential``, a subclass, a ``ManagedModel`` (their ``__new__`` calls
``super().__new__``), and a functional ``keras.Model(inputs, outputs)``, which
goes ``Model.__new__`` -> ``Functional.__new__`` -> ``Model.__new__`` again (one
model, seen twice: recorders dedupe by identity). :func:`record_models`
installs, once, a wrapper of that ``__new__`` that hands each new model to the
active recorders. Recorders are process-wide, not per thread: a training
function may build on threads of its own. A recorder holds weak references, so
a model that was really freed is not kept alive by it.

A ``Sequential`` builds a ``Functional`` of its own over its layers
(``Sequential._functional``, in ``Sequential.build``), which the ``Sequential``
holds and whose variables are its own: that one is not recorded. Disposing the
``Sequential`` releases them, and a ``Sequential`` that existed before the
recording and builds itself during it has its variables left alone.

A thread that runs one training function after another keeps Keras's
per-thread state (layer-name counters, name scopes, the dtype policy, the
global seed generator) from one to the next; :func:`fresh_keras_thread_state`
gives the calling thread the state a new thread starts with.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import keras
from keras.src.backend.common import global_state
from keras.src.models import functional as keras_functional_module
from keras.src.models import model as keras_model_module
from keras.src.models import sequential as keras_sequential_module

from ._internal import internal

__all__ = [
    "ModelRecorder",
    "fresh_keras_thread_state",
    "observe_thread_models",
    "record_models",
]

# Guards the recorders and the installation of the wrapper.
_lock = threading.Lock()
# The recorders active now; read without the lock on the hot path (a tuple).
_active: tuple[ModelRecorder, ...] = ()
# Keras's own __new__ (the staticmethod's function), once the wrapper is installed.
_original_new: Any = None
# Per thread: the callbacks that see each model built on that thread (a session's).
_thread = threading.local()
# The code of Functional.__new__ and of Sequential.build, which builds a
# Sequential's own functional model; set with the wrapper.
_functional_new: Any = None
_sequential_build: Any = None


class ModelRecorder:
    """Weak references to the models built while it was active, in build order.

    Not thread-safe to read while another thread builds: read it once the
    recording ended (``with record_models() as recorder: ...``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # id(model) -> weak reference; dicts keep insertion (build) order.
        self._models: dict[int, weakref.ReferenceType[keras.Model]] = {}

    def add(self, model: keras.Model) -> None:
        """Record ``model`` (once, whatever the number of calls)."""
        with self._lock:
            found = self._models.get(id(model))
            if found is None or found() is not model:  # new, or an id reused after a free
                self._models[id(model)] = weakref.ref(model)

    @property
    def recorded(self) -> int:
        """How many distinct models were recorded, freed ones included."""
        with self._lock:
            return len(self._models)

    def alive(self) -> list[keras.Model]:
        """The recorded models still alive, in build order."""
        with self._lock:
            refs = list(self._models.values())
        return [model for model in (ref() for ref in refs) if model is not None]


def _recording_new(cls: type, *args: Any, **kwargs: Any) -> Any:
    model = _original_new(cls, *args, **kwargs)
    observers = getattr(_thread, "observers", ())
    if (_active or observers) and not _built_by_a_sequential(sys._getframe(1)):
        for recorder in _active:
            recorder.add(model)
        if observers:
            # The innermost observer only: a model has one owner.
            observers[-1](model)
    return model


def _built_by_a_sequential(frame: Any) -> bool:
    """Whether the caller is ``Functional.__new__`` called by ``Sequential.build``."""
    if frame.f_code is not _functional_new:
        return False
    caller = frame.f_back
    return caller is not None and caller.f_code is _sequential_build


def _install() -> None:
    """Wrap ``Model.__new__`` once; the caller holds ``_lock``."""
    global _original_new
    if _original_new is not None:
        return
    model_class = keras_model_module.Model
    found = internal(model_class, "__new__", "keras.src.models.model.Model.__new__")
    declared = vars(model_class).get("__new__")
    if not isinstance(declared, staticmethod) or declared.__func__ is not found:
        raise TypeError(
            "keras.src.models.model.Model no longer defines __new__ as a static method; "
            f"found {declared!r}"
        )
    global _functional_new, _sequential_build
    functional_new = internal(keras_functional_module.Functional, "__new__", "Functional.__new__")
    build = internal(keras_sequential_module.Sequential, "build", "Sequential.build")
    _functional_new, _sequential_build = functional_new.__code__, build.__code__
    _original_new = found
    model_class.__new__ = staticmethod(_recording_new)


@contextlib.contextmanager
def record_models() -> Iterator[ModelRecorder]:
    """Record every Keras model built (on any thread) inside the block.

    Yields:
        The recorder; its :meth:`ModelRecorder.alive` gives the models built
        and still alive.

    Raises:
        CompatibilityError: Keras no longer has ``Model.__new__``.
        TypeError: It is no longer a static method of ``Model``.
    """
    global _active
    recorder = ModelRecorder()
    with _lock:
        _install()
        _active = (*_active, recorder)
    try:
        yield recorder
    finally:
        with _lock:
            _active = tuple(r for r in _active if r is not recorder)


@contextlib.contextmanager
def observe_thread_models(observer: Callable[[keras.Model], None]) -> Iterator[None]:
    """Hand ``observer`` each Keras model built on the calling thread inside the block.

    Observers nest: only the innermost one sees a model. ``observer`` runs
    inside ``Model.__new__``, before the model's ``__init__``: it may keep a
    weak reference, nothing more.

    Raises:
        CompatibilityError: Keras no longer has ``Model.__new__``.
        TypeError: It is no longer a static method of ``Model``.
    """
    with _lock:
        _install()
    observers = getattr(_thread, "observers", ())
    _thread.observers = (*observers, observer)
    try:
        yield
    finally:
        current = _thread.observers
        # Remove this one, wherever later (misnested) blocks left the stack.
        for index in range(len(current) - 1, -1, -1):
            if current[index] is observer:
                _thread.observers = current[:index] + current[index + 1 :]
                break


def fresh_keras_thread_state() -> None:
    """Clear the calling thread's Keras state, as a new thread starts.

    Layer-name counters, name scopes, the dtype policy, the global seed
    generator and the seed set by ``keras.utils.set_random_seed`` on this
    thread, and Keras's per-thread settings.

    Raises:
        CompatibilityError: Keras keeps its per-thread state elsewhere now.
    """
    for name in ("GLOBAL_STATE_TRACKER", "GLOBAL_SETTINGS_TRACKER"):
        tracker = internal(global_state, name, f"keras global_state.{name}")
        vars(tracker).clear()


def self_check() -> None:
    """The hook sees every kind of model once, and a thread's Keras state can be cleared."""
    inputs = keras.Input((2,))
    with record_models() as recorder:
        functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        sequential = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

        class Subclassed(keras.Model):
            def call(self, x: Any) -> Any:
                return x

        subclassed = Subclassed()
    alive = recorder.alive()
    missed = [m for m in (functional, sequential, subclassed) if not any(m is a for a in alive)]
    assert not missed, f"Model.__new__ no longer sees every model: {missed} not recorded"
    helper = internal(sequential, "_functional", "Sequential._functional")
    assert isinstance(helper, keras.Model), f"Sequential._functional is {helper!r}"
    assert not any(helper is model for model in alive), (
        "a Sequential's own functional model (built by Sequential.build) was recorded"
    )
    assert recorder.recorded == len(alive) == 3, alive
    with record_models() as outside:
        pass
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert outside.recorded == 0, "a model built after the recording was recorded"
    keras.config.set_dtype_policy("mixed_float16")
    keras.layers.Dense(1)  # counts a "dense" on this thread
    fresh_keras_thread_state()
    assert keras.config.dtype_policy().name == "float32", keras.config.dtype_policy()
    assert keras.layers.Dense(1).name == "dense", "layer-name counters kept"
