"""ManagedModel: a keras.Model that owns its resources and disposes of them.

``dispose()`` runs, in this order: refuse new calls, wait (bounded) for calls in
flight, release every buffer (mechanism A), purge the gradient-registry entries
that pin the model (mechanism B), drop references to traced functions, compiled
state and the optimizer, and run one collection.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import keras

from . import _tf
from ._core import CallGate, ModelState
from .errors import DisposedError, DisposeInProgressError, DrainTimeoutError, NotAModelError

__all__ = ["DEFAULT_DISPOSE_TIMEOUT", "DisposeReport", "ManagedModel", "manage"]

#: Seconds ``dispose()`` waits for calls in flight unless told otherwise.
DEFAULT_DISPOSE_TIMEOUT = 30.0

# Entry points that read or write the model's variables. After dispose() each of
# them raises DisposedError instead of a TensorFlow shape error or a crash.
_ENTRY_POINTS = (
    "__call__",
    "compile",
    "evaluate",
    "export",
    "fit",
    "get_weights",
    "load_weights",
    "predict",
    "predict_on_batch",
    "quantize",
    "save",
    "save_weights",
    "set_weights",
    "test_on_batch",
    "train_on_batch",
)

_Model = TypeVar("_Model", bound=keras.Model)


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
        collect_seconds: Time spent in the final ``gc.collect()`` (0 if skipped).
    """

    model_name: str
    bytes_released: int
    variables_released: int
    registry_entries_purged: int
    drain_seconds: float
    release_seconds: float
    collect_seconds: float

    @property
    def total_seconds(self) -> float:
        """Drain, release and collection together."""
        return self.drain_seconds + self.release_seconds + self.collect_seconds


@attrs.define(eq=False)
class _Lifecycle:
    """Per-model bookkeeping, held by the model as ``_lifecycle``."""

    dispose_timeout: float | None
    gate: CallGate = attrs.field(factory=CallGate, init=False)
    # Invariant: state is DISPOSED iff the gate is closed for good; report is
    # set once the release completed.
    state: ModelState = attrs.field(default=ModelState.LIVE, init=False)
    report: DisposeReport | None = attrs.field(default=None, init=False)
    # Serialises dispose(); never held while a call is in flight on this thread.
    dispose_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # Objects holding traced functions of this model; cleared on dispose.
    dependents: weakref.WeakSet[Any] = attrs.field(factory=weakref.WeakSet, init=False)


def _describe(model: keras.Model) -> str:
    return f"{type(model).__name__} {getattr(model, 'name', '<unnamed>')!r}"


def disposed_error(model: keras.Model, what: str) -> DisposedError:
    """The error raised when ``what`` is attempted on a disposed model."""
    if model._lifecycle.state is ModelState.DISPOSING:
        status = "is being disposed: its variables are being released"
    else:
        status = "has been disposed: its variables were released"
    return DisposedError(
        f"{_describe(model)} {status}, so {what} cannot run. Build or load a new "
        "model instead; a disposed model cannot be revived."
    )


def _guarded(name: str) -> Callable[..., Any]:
    def entry_point(self: ManagedModel, *args: Any, **kwargs: Any) -> Any:
        gate = self._lifecycle.gate
        if not gate.enter():
            raise disposed_error(self, f"`{name}`")
        try:
            return getattr(super(ManagedModel, self), name)(*args, **kwargs)
        finally:
            gate.exit()

    original = getattr(keras.Model, name)
    entry_point.__name__ = name
    entry_point.__qualname__ = f"ManagedModel.{name}"
    entry_point.__doc__ = (
        f"Guarded ``keras.Model.{name}``: raises ``DisposedError`` after ``dispose()``.\n\n"
        + (original.__doc__ or "")
    )
    entry_point.__wrapped__ = original  # type: ignore[attr-defined]
    return entry_point


def _attach(model: keras.Model, dispose_timeout: float | None) -> None:
    # object.__setattr__: Keras's attribute tracking must not see bookkeeping.
    object.__setattr__(model, "_lifecycle", _Lifecycle(dispose_timeout))


_DEFAULT = object()


@keras.saving.register_keras_serializable(package="lifecycle")
class ManagedModel(keras.Model):
    """A ``keras.Model`` that owns its variables and disposes of them on demand.

    Use it like ``keras.Model``: subclass it and implement ``call``, or build it
    functionally with ``ManagedModel(inputs, outputs)``. ``compile``, ``fit``,
    ``evaluate``, ``predict`` and ``save`` are unchanged. ``dispose()`` (or leaving
    a ``with model:`` block) releases every buffer the model owns — weights,
    optimizer slots, metric state, seed-generator state — even while stray Python
    references remain, and every later call raises :class:`DisposedError`.

    To put an existing model of any class under management, use :func:`manage`.

    Attributes:
        dispose_timeout: Default seconds ``dispose()`` waits for calls in flight
            (``None`` waits forever). Set it on the class or the instance.

    Example:
        >>> import keras, lifecycle as lc
        >>> inputs = keras.Input((4,))
        >>> model = lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs))
        >>> with model:
        ...     _ = model(keras.ops.ones((1, 4)))
        >>> model.state
        <ModelState.DISPOSED: 'disposed'>
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> ManagedModel:
        _tf.check_compatibility()
        if _tf.keras_internals.is_functional_call(args, kwargs):
            # Never let keras.Model.__init__ rewrite our bases; see _tf/_keras.py.
            cls = _tf.keras_internals.functional_variant(cls)
        model = super().__new__(cls, *args, **kwargs)
        _attach(model, DEFAULT_DISPOSE_TIMEOUT)
        return model

    @property
    def state(self) -> ModelState:
        """Where the model is in its life: ``LIVE``, ``DISPOSING`` or ``DISPOSED``."""
        return self._lifecycle.state

    @property
    def dispose_timeout(self) -> float | None:
        """Default seconds ``dispose()`` waits for calls in flight."""
        return self._lifecycle.dispose_timeout

    @dispose_timeout.setter
    def dispose_timeout(self, value: float | None) -> None:
        self._lifecycle.dispose_timeout = _check_timeout(value)

    @property
    def owned_variables(self) -> int:
        """Number of buffers the model owns (replicas and shards counted); 0 once disposed."""
        if self._lifecycle.state is ModelState.DISPOSED:
            return 0
        return len(_tf.model_leaves(self))

    @property
    def owned_bytes(self) -> int:
        """Bytes of the buffers the model owns, by static shape; 0 once disposed."""
        if self._lifecycle.state is ModelState.DISPOSED:
            return 0
        return sum(_tf.leaf_nbytes(leaf) for leaf in _tf.model_leaves(self))

    def dispose(self, *, timeout: Any = _DEFAULT, collect: bool = True) -> DisposeReport:
        """Release every buffer the model owns; idempotent.

        New calls are refused at once; calls already running on other threads
        are waited for (up to ``timeout``), so nothing is freed under a running
        graph. A second call returns the first call's report.

        Args:
            timeout: Seconds to wait for calls in flight; ``None`` waits forever.
                Defaults to ``model.dispose_timeout``.
            collect: Run ``gc.collect()`` at the end so the model's Python-side
                cycles go at once. Its cost is reported as ``collect_seconds``.

        Returns:
            A frozen :class:`DisposeReport`.

        Raises:
            DisposeInProgressError: Called from inside a call to this model
                (a callback of its ``fit``, its own ``call``). Nothing changed.
            DrainTimeoutError: Calls in flight did not finish in time. The model
                is live again, unchanged.

        Example:
            >>> report = model.dispose()  # doctest: +SKIP
            >>> report.bytes_released  # doctest: +SKIP
            10485760
        """
        lifecycle = self._lifecycle
        timeout = lifecycle.dispose_timeout if timeout is _DEFAULT else _check_timeout(timeout)
        if lifecycle.gate.held_by_current_thread():
            raise DisposeInProgressError(
                f"dispose() of {_describe(self)} was called from inside a call to the same "
                "model on this thread (for example a callback of its fit()). Disposing "
                "would wait for itself; dispose after the call returns."
            )
        with lifecycle.dispose_lock:
            if lifecycle.report is not None:
                return lifecycle.report
            started = time.perf_counter()
            lifecycle.state = ModelState.DISPOSING
            still_running = lifecycle.gate.close(timeout)
            if still_running:
                lifecycle.state = ModelState.LIVE
                raise DrainTimeoutError(
                    f"dispose() of {_describe(self)} gave up after waiting {timeout} s for "
                    f"calls in flight: {still_running} call(s) still running. The model is "
                    "live and unchanged; retry later or pass a longer timeout=.",
                    in_flight=still_running,
                )
            drained = time.perf_counter()
            # From here on the gate stays closed: the model is unusable even if
            # a step below fails, and a later dispose() retries the release.
            lifecycle.state = ModelState.DISPOSED
            leaves = _tf.model_leaves(self)
            bytes_released, variables_released = _tf.release(leaves)
            purged = _tf.purge_gradient_registry(leaves)
            del leaves
            _tf.keras_internals.drop_compiled_state(self)
            for dependent in list(lifecycle.dependents):
                dependent._drop()
            released = time.perf_counter()
            if collect:
                gc.collect()
            lifecycle.report = DisposeReport(
                model_name=self.name,
                bytes_released=bytes_released,
                variables_released=variables_released,
                registry_entries_purged=purged,
                drain_seconds=drained - started,
                release_seconds=released - drained,
                collect_seconds=time.perf_counter() - released,
            )
            return lifecycle.report

    def compile_from_config(self, config: dict[str, Any]) -> None:
        """Compile from a saved config, as ``keras.Model.compile_from_config`` does.

        Keras skips this step (with a warning) for models that override
        ``compile``; the guard ManagedModel puts on ``compile`` changes nothing
        about it, so a plain managed model loads compiled. A class that really
        customises ``compile`` keeps Keras's behaviour.
        """
        cls = type(self)
        if cls.compile is not ManagedModel.compile or (
            super(ManagedModel, cls).compile is not keras.Model.compile
        ):
            return super().compile_from_config(config)
        self.compile(**keras.saving.deserialize_keras_object(config))
        if getattr(self, "optimizer", None) is not None and self.built:
            self.optimizer.build(self.trainable_variables)
        return None

    def __enter__(self) -> ManagedModel:
        if self._lifecycle.state is not ModelState.LIVE:
            raise disposed_error(self, "`with model:`")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.dispose()


for _name in _ENTRY_POINTS:
    setattr(ManagedModel, _name, _guarded(_name))
del _name


def _check_timeout(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(
            f"`timeout` must be a number of seconds >= 0 or None. Received: timeout={value!r}"
        )
    return float(value)


def manage(model: _Model, *, dispose_timeout: float | None = DEFAULT_DISPOSE_TIMEOUT) -> _Model:
    """Put an existing Keras model under management, in place.

    Works for any ``keras.Model`` — ``Sequential``, functional, subclassed,
    ``keras.applications.*`` — without changing how it is defined. The model
    object is returned: it is still an instance of its class (and now also of
    :class:`ManagedModel`), saves and loads as before, and gains ``dispose()``,
    ``state``, ``owned_bytes`` and ``with model:``.

    Args:
        model: The model to manage. Managing a model twice is a no-op.
        dispose_timeout: Default seconds ``dispose()`` waits for calls in flight.

    Returns:
        The same model object.

    Raises:
        NotAModelError: ``model`` is not a ``keras.Model``.
        ValueError: ``dispose_timeout`` is not a number >= 0 or ``None``.

    Example:
        >>> import keras, lifecycle as lc
        >>> model = lc.manage(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))
        >>> isinstance(model, keras.Sequential), model.owned_bytes
        (True, 16)
        >>> model.dispose().bytes_released
        16
    """
    if not isinstance(model, keras.Model):
        raise NotAModelError(
            "manage() takes a keras.Model (Sequential, functional, subclassed or a "
            f"keras.applications model). Received: {type(model).__module__}."
            f"{type(model).__qualname__} object {model!r:.80}"
        )
    dispose_timeout = _check_timeout(dispose_timeout)
    if isinstance(model, ManagedModel):
        return model
    _tf.check_compatibility()
    managed_class = _tf.keras_internals.subclass_variant(ManagedModel, type(model))
    _attach(model, dispose_timeout)
    object.__setattr__(model, "__class__", managed_class)
    return model
