"""scikit-learn: a Keras model inside model selection is disposed when it is done with.

Needs scikit-learn (extra ``sklearn``). Builds on the scikit-learn wrappers that
Keras ships (``keras.wrappers.SKLearnClassifier``, ``SKLearnRegressor``,
``SKLearnTransformer``, Keras >= 3.8): change the import, nothing else::

    from lifecycle.integrations.sklearn import ManagedSKLearnClassifier as SKLearnClassifier

``cross_val_score``, ``GridSearchCV`` and the rest clone the estimator, fit each
clone, score it and drop it. A managed estimator's fitted Keras model (``model_``)
is put under management when it is fitted, and disposed when the estimator lets
go of it: when the estimator is dropped (scikit-learn drops each fold's clone
once it is scored), refitted (the new model replaces the old) or disposed
(:meth:`ManagedEstimator.dispose`). Estimators the search keeps —
``best_estimator_``, ``return_estimator=True`` — keep their models.

:class:`ManagedEstimator` is the mixin behind these classes; put it first among
the bases of any estimator that keeps its fitted Keras model in ``model_``.
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import keras

from .._model import DisposeReport, manage

try:
    import sklearn.base
    from keras.wrappers import SKLearnClassifier, SKLearnRegressor, SKLearnTransformer
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "lifecycle.integrations.sklearn needs scikit-learn, an optional extra: "
        'pip install "keras-lifecycle[sklearn]"'
    ) from error

__all__ = [
    "ManagedEstimator",
    "ManagedSKLearnClassifier",
    "ManagedSKLearnRegressor",
    "ManagedSKLearnTransformer",
]

# Threads inside a garbage collection now. A finalizer that runs inside one may
# interrupt a thread holding any lock (the library's own included), so it only
# queues the disposal on the model's session cleaner; a finalizer run because
# the last reference went (scikit-learn dropping a fold's clone) disposes at once.
_collecting: set[int] = set()


def _track_collections(phase: str, _info: dict[str, Any]) -> None:
    if phase == "start":
        _collecting.add(threading.get_ident())
    else:
        _collecting.discard(threading.get_ident())


gc.callbacks.append(_track_collections)


class _Holder:
    """The fitted model of one estimator, held apart so a finalizer can reach it."""

    __slots__ = ("model",)

    def __init__(self) -> None:
        self.model: keras.Model | None = None


def _dispose_held(holder: _Holder) -> None:
    """The estimator is gone: dispose its model (now, or via the cleaner in a collection)."""
    model, holder.model = holder.model, None
    if model is None:
        return
    if _collecting:
        model.session.cleaner.enqueue(model.dispose)
    else:
        model.dispose()


# Each managed estimator's holder, found by identity; the finalizer owns it too.
_holders: weakref.WeakKeyDictionary[Any, _Holder] = weakref.WeakKeyDictionary()
_holders_lock = threading.Lock()


def _holder_of(estimator: Any) -> _Holder:
    with _holders_lock:
        holder = _holders.get(estimator)
        if holder is None:
            holder = _holders[estimator] = _Holder()
            finalizer = weakref.finalize(estimator, _dispose_held, holder)
            # At interpreter exit TensorFlow may be gone; the process frees all.
            finalizer.atexit = False
    return holder


class ManagedEstimator:
    """A mixin: the estimator's fitted Keras model is managed and disposed with it.

    Put it first among the bases of a scikit-learn estimator that keeps its
    fitted Keras model in ``model_`` (Keras's own wrappers; not scikeras's,
    whose import replaces Keras's pickling, which the library refuses).
    Whatever assigns ``model_`` —
    ``fit``, or another method of the wrapper — the model is put under
    management (:func:`lifecycle.manage`), and the estimator owns it:

    * assigning another model (a refit) disposes the previous one;
    * :meth:`dispose` (or ``del estimator.model_``) disposes it now;
    * when the estimator itself is garbage — scikit-learn drops each clone it
      fitted and scored — its model is disposed: at once when the last
      reference goes, or by the model's session cleaner when a garbage
      collection finds the estimator.

    The mixin adds no parameter: ``get_params``, ``set_params`` and ``clone``
    are the wrapper's. A pickled or copied estimator comes back with its model
    managed and owned by the copy.
    """

    @property
    def model_(self) -> keras.Model:
        """The fitted Keras model, managed and owned by this estimator."""
        try:
            return self.__dict__["model_"]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute 'model_': "
                "it is not fitted, or its model was disposed"
            ) from None

    @model_.setter
    def model_(self, model: keras.Model) -> None:
        holder = _holder_of(self)
        previous = holder.model
        if model is previous:
            return
        if isinstance(model, keras.Model):
            manage(model)
            holder.model = model
        else:  # not a Keras model: stored, never disposed
            holder.model = None
        self.__dict__["model_"] = model
        if previous is not None:
            previous.dispose()

    @model_.deleter
    def model_(self) -> None:
        self.dispose()

    def dispose(self) -> DisposeReport | None:
        """Dispose the fitted model now; the estimator is unfitted afterwards.

        Returns:
            The model's :class:`~lifecycle.DisposeReport`, or ``None`` if there
            was no fitted model.
        """
        holder = _holder_of(self)
        model, holder.model = holder.model, None
        self.__dict__.pop("model_", None)
        return None if model is None else model.dispose()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A copy or an unpickled estimator: its model is its own, managed again.
        model = state.pop("model_", None)
        super().__setstate__(state)  # type: ignore[misc]
        if model is not None:
            self.model_ = model


def _clone_with_fit_kwargs(estimator: Any, clone: Any) -> Any:
    # Keras 3.15's __sklearn_clone__ rebuilds the wrapper from `model`,
    # `warm_start` and `model_kwargs` only, so a clone lost `fit_kwargs`;
    # copy it as scikit-learn copies a parameter.
    clone.fit_kwargs = sklearn.base.clone(estimator.fit_kwargs, safe=False)
    return clone


def _fit_without_changing_parameters(estimator: Any, fit: Any, X: Any, y: Any, kwargs: Any) -> Any:
    # Keras's wrapper merges fit()'s keyword arguments into the `fit_kwargs`
    # dict it was given, changing a parameter in place; fit on a copy instead.
    given = estimator.fit_kwargs
    if given is not None:
        estimator.fit_kwargs = dict(given)
    try:
        return fit(X, y, **kwargs)
    finally:
        estimator.fit_kwargs = given


class ManagedSKLearnClassifier(ManagedEstimator, SKLearnClassifier):
    """``keras.wrappers.SKLearnClassifier`` whose fitted model is disposed with it.

    Same parameters, same results; see :class:`ManagedEstimator` for when the
    model is disposed. Two fixes over Keras 3.15's wrapper: ``clone()`` keeps
    ``fit_kwargs``, and ``fit(X, y, **kwargs)`` no longer writes ``kwargs`` into
    the ``fit_kwargs`` dict it was given.

    Example:
        >>> from sklearn.model_selection import cross_val_score
        >>> from lifecycle.integrations.sklearn import ManagedSKLearnClassifier
        >>> clf = ManagedSKLearnClassifier(build, fit_kwargs={"epochs": 2})  # doctest: +SKIP
        >>> cross_val_score(clf, x, y, cv=5)  # each fold's model disposed  # doctest: +SKIP
    """

    def __sklearn_clone__(self) -> ManagedSKLearnClassifier:
        return _clone_with_fit_kwargs(self, super().__sklearn_clone__())

    def fit(self, X: Any, y: Any, **kwargs: Any) -> ManagedSKLearnClassifier:
        """Fit a new model (the previous one, if any, is disposed); see Keras's ``fit``."""
        return _fit_without_changing_parameters(self, super().fit, X, y, kwargs)


class ManagedSKLearnRegressor(ManagedEstimator, SKLearnRegressor):
    """``keras.wrappers.SKLearnRegressor`` whose fitted model is disposed with it.

    See :class:`ManagedSKLearnClassifier`: same behaviour, same two fixes.
    """

    def __sklearn_clone__(self) -> ManagedSKLearnRegressor:
        return _clone_with_fit_kwargs(self, super().__sklearn_clone__())

    def fit(self, X: Any, y: Any, **kwargs: Any) -> ManagedSKLearnRegressor:
        """Fit a new model (the previous one, if any, is disposed); see Keras's ``fit``."""
        return _fit_without_changing_parameters(self, super().fit, X, y, kwargs)


class ManagedSKLearnTransformer(ManagedEstimator, SKLearnTransformer):
    """``keras.wrappers.SKLearnTransformer`` whose fitted model is disposed with it.

    See :class:`ManagedSKLearnClassifier`: same behaviour, same two fixes.
    """

    def __sklearn_clone__(self) -> ManagedSKLearnTransformer:
        return _clone_with_fit_kwargs(self, super().__sklearn_clone__())

    def fit(self, X: Any, y: Any, **kwargs: Any) -> ManagedSKLearnTransformer:
        """Fit a new model (the previous one, if any, is disposed); see Keras's ``fit``."""
        return _fit_without_changing_parameters(self, super().fit, X, y, kwargs)
