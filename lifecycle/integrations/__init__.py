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

from .._core._lazy import attach

# Each module (under this package) and the public names it defines.
_MODULES = {
    ".sklearn": (
        "ManagedEstimator",
        "ManagedSKLearnClassifier",
        "ManagedSKLearnRegressor",
        "ManagedSKLearnTransformer",
    ),
    ".keras_tuner": ("ManagedTuner", "TunerStatistics", "managed_tuner"),
}

__all__ = sorted(name for names in _MODULES.values() for name in names)

# `ray` needs its extra: reachable as an attribute, left out of dir().
__getattr__, __dir__ = attach(__name__, _MODULES, ("ipython",), unlisted=("ray",))
