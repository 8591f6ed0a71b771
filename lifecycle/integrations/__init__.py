"""Integrations with tools that build or serve many models: KerasTuner, scikit-learn, Ray, IPython.

Each lives in its own module, imported on first use, so ``import lifecycle``
never imports KerasTuner, scikit-learn or Ray:

* :mod:`lifecycle.integrations.keras_tuner` (extra ``tuner``):
  :func:`~lifecycle.integrations.keras_tuner.managed_tuner` and the
  :class:`~lifecycle.integrations.keras_tuner.ManagedTuner` mixin — any tuner
  disposes every model of a trial when the trial ends, and the model its
  constructor builds to learn the search space;
* :mod:`lifecycle.integrations.sklearn` (extra ``sklearn``):
  ``ManagedSKLearnClassifier``, ``ManagedSKLearnRegressor``,
  ``ManagedSKLearnTransformer`` (Keras's own scikit-learn wrappers) and the
  :class:`~lifecycle.integrations.sklearn.ManagedEstimator` mixin — each fitted
  model is disposed when scikit-learn's model selection is done with it;
* :mod:`lifecycle.integrations.ray` (extra ``ray``): Ray Serve multiplexing
  whose evicted models are disposed once their requests end, and Ray Tune
  trainables that dispose every model of a trial (its names are reached
  through that subpackage only);
* :mod:`lifecycle.integrations.ipython`: the IPython extension
  (``%load_ext lifecycle``) that disposes, after each cell, the models a
  notebook no longer refers to (its names are reached through that module
  only).

The names are also reachable here (``lifecycle.integrations.managed_tuner``),
which imports their module then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core._lazy import attach

if TYPE_CHECKING:
    from . import ipython as ipython
    from . import ray as ray
    from .keras_tuner import ManagedTuner as ManagedTuner
    from .keras_tuner import TunerStatistics as TunerStatistics
    from .keras_tuner import managed_tuner as managed_tuner
    from .sklearn import ManagedEstimator as ManagedEstimator
    from .sklearn import ManagedSKLearnClassifier as ManagedSKLearnClassifier
    from .sklearn import ManagedSKLearnRegressor as ManagedSKLearnRegressor
    from .sklearn import ManagedSKLearnTransformer as ManagedSKLearnTransformer

# `ray` needs its extra: reachable as an attribute, left out of dir().
__getattr__, __dir__, __all__ = attach(__name__, unlisted=("ray",))
