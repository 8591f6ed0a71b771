"""ManagedModel: a keras.Model that owns its resources and disposes of them.

``dispose()`` runs, in this order: refuse new calls, wait (bounded) for calls in
flight, release every buffer (mechanism A), purge the gradient-registry entries
that pin the model (mechanism B), drop references to traced functions, compiled
state and the optimizer, and collect (now, or through the session's cleaner).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import keras

from . import _tf
from ._checkpoints import CheckpointKeeper, keeper_of
from ._core import ModelState, check_timeout
from ._disposal import (
    DEFAULT,
    DEFAULT_DISPOSE_TIMEOUT,
    DisposeReport,
    Managed,
    ModelRecord,
    Refresh,
    held,
    run_guarded,
)
from ._objects import is_manageable_object, manage_object
from ._session import LifecycleSession, current_session
from .errors import NotAModelError

__all__ = ["DEFAULT_DISPOSE_TIMEOUT", "DisposeReport", "ManagedModel", "ModelStatistics", "manage"]


# Entry points that read or write the model's variables (the names are
# _tf.keras_internals.ENTRY_POINTS, which the self-check looks up). Each is a
# safe point of the owning session, and after dispose() raises DisposedError
# instead of a TensorFlow shape error or a crash.
_ENTRY_POINTS = {
    "__call__": Refresh.FIRST,
    "compile": Refresh.ALWAYS,
    "evaluate": Refresh.ALWAYS,
    "export": Refresh.NEVER,
    "fit": Refresh.ALWAYS,
    "get_weights": Refresh.NEVER,
    "load_weights": Refresh.ALWAYS,
    "predict": Refresh.ALWAYS,
    "predict_on_batch": Refresh.FIRST,
    "quantize": Refresh.ALWAYS,
    "save": Refresh.NEVER,
    "save_weights": Refresh.NEVER,
    "set_weights": Refresh.NEVER,
    "test_on_batch": Refresh.FIRST,
    "train_on_batch": Refresh.FIRST,
}

_Model = TypeVar("_Model", bound=keras.Model)


def _guarded(name: str, refresh: Refresh) -> Callable[..., Any]:
    def entry_point(self: ManagedModel, *args: Any, **kwargs: Any) -> Any:
        method = _tf.keras_internals.model_method(super(ManagedModel, self), name)
        return run_guarded(self, name, method, refresh, *args, **kwargs)

    # Looked up again on each call: a method Keras renamed fails the self-check
    # (and the call) with a CompatibilityError, not `import lifecycle`.
    original = getattr(keras.Model, name, None)
    entry_point.__name__ = name
    entry_point.__qualname__ = f"ManagedModel.{name}"
    entry_point.__doc__ = (
        f"Guarded ``keras.Model.{name}``: raises ``DisposedError`` after ``dispose()``.\n\n"
        + (getattr(original, "__doc__", None) or "")
    )
    if original is not None:
        entry_point.__wrapped__ = original  # type: ignore[attr-defined]
    return entry_point


def _adopt(model: keras.Model, session: LifecycleSession | None, timeout: float | None) -> None:
    owner = session if session is not None else current_session()
    owner.cleaner.safe_point()  # creating a managed model is a safe point
    ModelRecord.attach(model, owner, timeout)


@attrs.frozen
class ModelStatistics:
    """A snapshot of one managed model (``model.statistics()``).

    Attributes:
        name: ``model.name``.
        state: ``LIVE``, ``DISPOSING`` or ``DISPOSED``.
        session: Name of the owning session.
        owned_bytes: Bytes of the buffers it owns (0 once disposed).
        owned_variables: Buffers it owns, replicas and shards counted.
        calls_in_flight: Threads inside one of its entry points now.
        checkpoint_keepers: Open checkpoint keepers.
    """

    name: str
    state: ModelState
    session: str
    owned_bytes: int
    owned_variables: int
    calls_in_flight: int
    checkpoint_keepers: int


@keras.saving.register_keras_serializable(package="lifecycle")
class ManagedModel(Managed, keras.Model):
    """A ``keras.Model`` that owns its variables and disposes of them on demand.

    Use it like ``keras.Model``: subclass it and implement ``call``, or build it
    functionally with ``ManagedModel(inputs, outputs)``. ``compile``, ``fit``,
    ``evaluate``, ``predict`` and ``save`` are unchanged. ``dispose()`` (or leaving
    a ``with model:`` block) releases every buffer the model owns — weights,
    optimizer slots, metric state, seed-generator state — even while stray Python
    references remain, and every later call raises :class:`DisposedError`.

    The model belongs to the :class:`LifecycleSession` current when it is
    created (the default session outside any). Dropped without ``dispose()``, it
    is cleaned up by that session's cleaner, with a ``ResourceWarning``.

    To put an existing model of any class under management, use :func:`manage`.

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
        _adopt(model, None, DEFAULT_DISPOSE_TIMEOUT)
        return model

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A functional model has its variables now; a subclassed one, later.
        self._lifecycle.refresh(self)

    def statistics(self) -> ModelStatistics:
        """A frozen snapshot of the model: state, bytes, buffers, calls, keepers."""
        record = self._lifecycle
        return ModelStatistics(
            name=getattr(self, "name", record.name),
            state=record.state,
            session=record.owner.name,
            owned_bytes=self.owned_bytes,
            owned_variables=self.owned_variables,
            calls_in_flight=record.gate.in_flight(),
            checkpoint_keepers=len(record.keepers),
        )

    def dispose(
        self, *, timeout: Any = DEFAULT, collect: bool | None = None, coordinate: bool = True
    ) -> DisposeReport:
        """Release every buffer the model owns; idempotent.

        New calls are refused at once; calls already running on other threads
        are waited for (up to ``timeout``), so nothing is freed under a running
        graph. A second call returns the first call's report.

        Args:
            timeout: Seconds to wait for calls in flight; ``None`` waits forever.
                Defaults to ``model.dispose_timeout`` (30 s).
            collect: ``True`` runs the session's collection now
                (``gc.collect()``, then TensorFlow's eager kernel cache is
                cleared once enough buffers were released since its last
                clear), so the model's Python-side cycles go at once (its
                cost is reported as ``collect_seconds``);
                ``False`` never collects; ``None`` (default) leaves the
                model's Python garbage to Python's own collector (its
                buffers are free: nothing is owed to a collection), and the
                stale kernels to the session's cleaner.
            coordinate: Under ``MultiWorkerMirroredStrategy`` with several
                workers, first wait (up to ``timeout``) until every worker is
                disposing the model too, so no peer is left blocked in an
                all-reduce with a worker whose replicas are gone. ``False``
                releases this worker's replicas alone.

        Returns:
            A frozen :class:`DisposeReport`.

        Raises:
            DisposeInProgressError: Called from inside a call to this model
                (a callback of its ``fit``, its own ``call``). Nothing changed.
            DrainTimeoutError: Calls in flight did not finish in time. The model
                is live again, unchanged.
            CoordinationError: Another worker did not reach ``dispose()`` in
                time. Nothing was released; the model is live.
            ValueError: ``timeout`` is not a number >= 0 or ``None``.

        Example:
            >>> report = model.dispose()  # doctest: +SKIP
            >>> report.bytes_released  # doctest: +SKIP
            10485760
        """
        return self._lifecycle.dispose(self, timeout, collect, coordinate)

    def checkpoints(
        self,
        directory: str | os.PathLike[str],
        *,
        max_to_keep: int | None = 5,
        keep_every_n_hours: float | None = None,
        async_save: bool = False,
    ) -> CheckpointKeeper:
        """The model's checkpoint keeper for ``directory``, created on first use.

        The keeper saves and restores the model, its optimizer and a step
        counter by object graph (``tf.train.Checkpoint``), keeps the newest
        ``max_to_keep`` (``tf.train.CheckpointManager``), and belongs to the
        model: ``dispose()`` flushes its pending write and closes it.

        Args:
            directory: Where the checkpoints go; created on the first save.
            max_to_keep: How many recent checkpoints to keep; ``None`` keeps all.
            keep_every_n_hours: Also keep one checkpoint per this many hours.
            async_save: Write in a background thread after a quick copy to host
                memory; the copy is released on ``dispose()``.

        Returns:
            The :class:`CheckpointKeeper`; the same one on later calls with the
            same directory.

        Raises:
            DisposedError: The model was disposed.
            ValueError: A bad option, or options that differ from those of the
                keeper already open for ``directory``.
            CheckpointError: ``directory`` exists and is not a directory.

        Example:
            >>> keeper = model.checkpoints("ckpts", max_to_keep=3)  # doctest: +SKIP
            >>> keeper.save(), keeper.list()  # doctest: +SKIP
            ('ckpts/ckpt-1', ['ckpts/ckpt-1'])
        """
        return keeper_of(
            self,
            directory,
            max_to_keep=max_to_keep,
            keep_every_n_hours=keep_every_n_hours,
            async_save=async_save,
        )

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

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle (and ``copy.deepcopy``) like the Keras model it is.

        Keras pickles a model as an in-memory ``.keras`` archive, and unpickling
        loads it back as the class that ``model.save()`` names: a model put
        under management with :func:`manage` comes back as a plain model of its
        own class (``Sequential``, ``Functional``, ...), and an instance of a
        ``ManagedModel`` class comes back as a new ``ManagedModel`` owned by the
        session current where it is unpickled. A pickling in progress holds the
        model like a call: ``dispose()`` waits for it.

        Raises:
            DisposedError: The model was disposed: its weights are gone.
        """
        with held(self, "pickling or copying it"):
            return _tf.keras_internals.reduce_as_declared(super().__reduce__(), type(self))


for _name, _refresh in _ENTRY_POINTS.items():
    setattr(ManagedModel, _name, _guarded(_name, _refresh))
del _name, _refresh


def manage(
    model: _Model,
    *,
    dispose_timeout: float | None = DEFAULT_DISPOSE_TIMEOUT,
    session: LifecycleSession | None = None,
) -> _Model:
    """Put an existing Keras model, ``tf.Module`` or Keras optimizer under management, in place.

    Works for any ``keras.Model`` — ``Sequential``, functional, subclassed,
    ``keras.applications`` — without changing how it is defined. The model
    object is returned: it is still an instance of its class (and now also of
    :class:`ManagedModel`), saves and loads as before, and gains ``dispose()``,
    ``state``, ``owned_bytes`` and ``with model:``.

    A ``tf.Module`` (raw ``tf.Variable`` objects trained in a custom
    ``GradientTape`` step) or a Keras optimizer built outside any model gets
    the same guarantees: ``dispose()`` releases every buffer it owns (slots
    included) and purges the registry entries that pin them, its calls in
    flight are waited for (a module's ``__call__``, an optimizer's
    ``apply_gradients`` and ``apply``), and every later use raises
    ``DisposedError``. It becomes an instance of
    :class:`lifecycle.introspection.ManagedObject` as well as of its class.

    Args:
        model: The model, module or optimizer to manage. Managing twice is a no-op.
        dispose_timeout: Default seconds ``dispose()`` waits for calls in flight.
        session: The owning session; defaults to the current session.

    Returns:
        The same model object.

    Raises:
        NotAModelError: ``model`` is not a ``keras.Model``, a ``tf.Module`` or a
            Keras optimizer.
        ValueError: ``dispose_timeout`` is not a number >= 0 or ``None``, or the
            model is already managed by another session than ``session``.
        LifecycleError: ``session`` is closed.

    Example:
        >>> import keras, lifecycle as lc
        >>> model = lc.manage(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))
        >>> isinstance(model, keras.Sequential), model.owned_bytes
        (True, 16)
        >>> model.dispose().bytes_released
        16
    """
    if not isinstance(model, keras.Model) and not is_manageable_object(model):
        raise NotAModelError(
            "manage() takes a keras.Model (Sequential, functional, subclassed or a "
            "keras.applications model), a tf.Module or a Keras optimizer. Received: "
            f"{type(model).__module__}.{type(model).__qualname__} object {model!r:.80}"
        )
    dispose_timeout = check_timeout(dispose_timeout, "dispose_timeout")
    if isinstance(model, Managed):
        owner = model._lifecycle.owner
        if session is not None and session is not owner:
            raise ValueError(
                f"{model._lifecycle.describe()} is already owned by LifecycleSession "
                f"{owner.name!r}; it has one owner. Received: session={session.name!r}"
            )
        return model
    if not isinstance(model, keras.Model):
        return manage_object(model, dispose_timeout=dispose_timeout, session=session)
    _tf.check_compatibility()
    managed_class = _tf.keras_internals.subclass_variant(ManagedModel, type(model))
    _adopt(model, session, dispose_timeout)
    _tf.keras_internals.set_class(model, managed_class)
    model._lifecycle.refresh(model)
    return model
