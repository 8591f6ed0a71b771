"""KerasTuner: every model a trial builds is disposed when the trial ends.

Needs ``keras-tuner`` (extra ``tuner``). Two lines turn any tuner class into a
managed one::

    from lifecycle.integrations.keras_tuner import managed_tuner

    tuner = managed_tuner(kt.RandomSearch)(build_model, objective="val_accuracy", max_trials=20)

How: the tuner's hypermodel is wrapped so that every model it builds is put
under management (:func:`lifecycle.manage`) and, when it is built inside the
tuner's constructor (which builds the search space once) or inside a trial,
recorded. The models recorded in the constructor are disposed when the
constructor returns; those of a trial, once the trial has ended — after the
trial's best-epoch checkpoint was written (during ``fit``), its metrics were
reported to the oracle and the tuner's state was saved. Models built outside
(``get_best_models()``, ``tuner.hypermodel.build(hp)``) are managed and returned
to the caller, who owns them.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import attrs
import keras

from .._model import manage

try:
    import keras_tuner
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "lifecycle.integrations.keras_tuner needs keras-tuner, an optional extra: "
        'pip install "keras-lifecycle[tuner]"'
    ) from error

__all__ = ["ManagedTuner", "TunerStatistics", "managed_tuner"]

_Tuner = TypeVar("_Tuner", bound=type)


@attrs.frozen
class TunerStatistics:
    """What a managed tuner did with the models its hypermodel built.

    Attributes:
        models_built: Models the hypermodel built through this tuner (the
            constructor's, every trial's, and those returned by
            ``get_best_models()``), each put under management.
        models_disposed: Of those, models the tuner disposed: at the end of its
            constructor, of a trial, or of a search that raised.
        bytes_released: Bytes of buffers those disposals released.
        models_live: Models built inside the current trial (or constructor), to be
            disposed when it ends; 0 between trials.
    """

    models_built: int
    models_disposed: int
    bytes_released: int
    models_live: int


@attrs.define(eq=False)
class _Trials:
    """The models of the phase that owns them now (the constructor or a trial)."""

    # True inside the constructor and between on_trial_begin and on_trial_end:
    # models built then are the phase's, disposed when it ends.
    recording: bool = False
    # The phase's models, in build order; empty when not recording.
    models: list[keras.Model] = attrs.field(factory=list)
    models_built: int = 0
    models_disposed: int = 0
    bytes_released: int = 0
    # Guards the fields above: a hypermodel may build on another thread.
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def built(self, model: keras.Model) -> None:
        with self.lock:
            self.models_built += 1
            if self.recording:
                self.models.append(model)

    def begin(self) -> None:
        with self.lock:
            self.recording = True

    def end(self) -> None:
        """Dispose the phase's models, each once, newest first."""
        with self.lock:
            models, self.models, self.recording = self.models, [], False
        for model in reversed(models):
            report = model.dispose()
            with self.lock:
                self.models_disposed += 1
                self.bytes_released += report.bytes_released

    def statistics(self) -> TunerStatistics:
        with self.lock:
            return TunerStatistics(
                models_built=self.models_built,
                models_disposed=self.models_disposed,
                bytes_released=self.bytes_released,
                models_live=len(self.models),
            )


class _ManagedHyperModel(keras_tuner.HyperModel):
    """The tuner's view of the user's hypermodel: builds managed, recorded models.

    Every other attribute (``fit``, ``declare_hyperparameters``, ``name``,
    ``tunable``, the user's own) is the user's hypermodel's.
    """

    def __init__(self, hypermodel: keras_tuner.HyperModel, trials: _Trials) -> None:
        # HyperModel.__init__ is not called: it would shadow `build` on the instance.
        self.wrapped = hypermodel
        self._trials = trials

    def build(self, hp: keras_tuner.HyperParameters) -> Any:
        """Build with the user's hypermodel, manage the model and record it."""
        model = self.wrapped.build(hp)
        if isinstance(model, keras.Model):
            manage(model)
            self._trials.built(model)
        return model  # anything else: the tuner raises its own error

    def fit(self, hp: keras_tuner.HyperParameters, model: keras.Model, *args: Any, **kwargs: Any):
        """The user's hypermodel's ``fit``."""
        return self.wrapped.fit(hp, model, *args, **kwargs)

    def declare_hyperparameters(self, hp: keras_tuner.HyperParameters) -> None:
        """The user's hypermodel's ``declare_hyperparameters``."""
        self.wrapped.declare_hyperparameters(hp)

    def __getattr__(self, name: str) -> Any:
        if name in {"wrapped", "_trials"}:  # not set yet (copying, unpickling)
            raise AttributeError(name)
        return getattr(self.wrapped, name)


class ManagedTuner:
    """A mixin that makes any KerasTuner tuner dispose the models of each trial.

    Put it first among the bases of a tuner class (or use :func:`managed_tuner`,
    which does so): ``class Search(ManagedTuner, kt.BayesianOptimization): pass``.
    The tuner then behaves as its base does — same trials, scores, checkpoints
    and ``get_best_models()`` — and in addition:

    * every model its hypermodel builds is a managed model (``lc.manage``);
    * the models the constructor builds to learn the search space are disposed
      before the constructor returns;
    * the models a trial builds (one per execution) are disposed when the trial
      ends: after ``on_trial_end`` of the base class has run, so the trial's
      checkpoint, metrics and the tuner's saved state are already written;
    * if ``search()`` raises, the models of the interrupted trial are disposed;
    * models built outside those phases — by ``get_best_models()``, or by
      ``tuner.hypermodel.build(hp)`` after the search — are managed and yours:
      dispose them (or close their session) when done.

    ``tuner.hypermodel`` is a view of the hypermodel given to the constructor:
    its ``build`` returns managed models, every other attribute is the
    original's, which is ``tuner.hypermodel.wrapped``.

    Example:
        >>> import keras_tuner as kt
        >>> from lifecycle.integrations.keras_tuner import ManagedTuner
        >>> class Search(ManagedTuner, kt.RandomSearch):
        ...     pass
        >>> tuner = Search(build_model, objective="val_loss", max_trials=3)  # doctest: +SKIP
        >>> tuner.search(x, y, validation_split=0.2, epochs=2)  # doctest: +SKIP
        >>> tuner.lifecycle_statistics().models_live  # doctest: +SKIP
        0
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Set before the base constructor, which assigns self.hypermodel and
        # builds the search space.
        self._lifecycle_trials = _Trials()
        self._lifecycle_trials.begin()
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._lifecycle_trials.end()

    @property
    def hypermodel(self) -> keras_tuner.HyperModel | None:
        """The hypermodel, as a view whose ``build`` returns managed models."""
        return self.__dict__.get("_lifecycle_hypermodel")

    @hypermodel.setter
    def hypermodel(self, value: keras_tuner.HyperModel | None) -> None:
        if isinstance(value, _ManagedHyperModel):
            value = value.wrapped
        self.__dict__["_lifecycle_hypermodel"] = (
            None if value is None else _ManagedHyperModel(value, self._lifecycle_trials)
        )

    def on_trial_begin(self, trial: Any) -> None:
        """Start recording the trial's models, then the base class's hook."""
        self._lifecycle_trials.begin()
        super().on_trial_begin(trial)  # type: ignore[misc]

    def on_trial_end(self, trial: Any) -> None:
        """The base class's hook (results and state saved), then dispose the trial's models."""
        try:
            super().on_trial_end(trial)  # type: ignore[misc]
        finally:
            self._lifecycle_trials.end()

    def search(self, *fit_args: Any, **fit_kwargs: Any) -> None:
        """The base class's search; if it raises, the interrupted trial's models are disposed."""
        try:
            super().search(*fit_args, **fit_kwargs)  # type: ignore[misc]
        finally:
            self._lifecycle_trials.end()

    def lifecycle_statistics(self) -> TunerStatistics:
        """Models built, disposed and still recorded by this tuner, and bytes released."""
        return self._lifecycle_trials.statistics()


_managed_classes: dict[type, type] = {}
_managed_classes_lock = threading.Lock()


def managed_tuner(tuner_class: _Tuner) -> _Tuner:
    """The managed variant of a KerasTuner tuner class (see :class:`ManagedTuner`).

    Works for every subclass of ``keras_tuner.Tuner``: ``RandomSearch``,
    ``BayesianOptimization``, ``Hyperband``, ``GridSearch`` and your own. The
    same class is returned for the same argument, and a managed class is
    returned as it is.

    Args:
        tuner_class: A subclass of ``keras_tuner.Tuner``.

    Returns:
        A subclass of ``ManagedTuner`` and of ``tuner_class``, named
        ``Managed<Name>``, constructed with the same arguments.

    Raises:
        TypeError: ``tuner_class`` is not a subclass of ``keras_tuner.Tuner``.

    Example:
        >>> import keras_tuner as kt
        >>> from lifecycle.integrations.keras_tuner import managed_tuner
        >>> managed_tuner(kt.Hyperband).__name__
        'ManagedHyperband'
    """
    if not (isinstance(tuner_class, type) and issubclass(tuner_class, keras_tuner.Tuner)):
        raise TypeError(
            "managed_tuner() takes a KerasTuner tuner class, a subclass of keras_tuner.Tuner "
            f"such as keras_tuner.RandomSearch. Received: {tuner_class!r:.80}"
        )
    if issubclass(tuner_class, ManagedTuner):
        return tuner_class
    with _managed_classes_lock:
        managed = _managed_classes.get(tuner_class)
        if managed is None:
            name = f"Managed{tuner_class.__name__}"
            managed = type(
                name,
                (ManagedTuner, tuner_class),
                {"__module__": __name__, "__qualname__": name, "__doc__": tuner_class.__doc__},
            )
            _managed_classes[tuner_class] = managed
    return managed  # type: ignore[return-value]
