"""Integrations with the tools that build many models: KerasTuner and scikit-learn.

Each lives in its own module, imported on first use, so ``import lifecycle``
never imports KerasTuner or scikit-learn:

* :mod:`lifecycle.integrations.keras_tuner` (extra ``tuner``):
  :func:`~lifecycle.integrations.keras_tuner.managed_tuner` and the
  :class:`~lifecycle.integrations.keras_tuner.ManagedTuner` mixin — any tuner
  disposes every model of a trial when the trial ends, and the model its
  constructor builds to learn the search space;
* :mod:`lifecycle.integrations.sklearn` (extra ``sklearn``):
  ``ManagedSKLearnClassifier``, ``ManagedSKLearnRegressor``,
  ``ManagedSKLearnTransformer`` (Keras's own scikit-learn wrappers) and the
  :class:`~lifecycle.integrations.sklearn.ManagedEstimator` mixin — each fitted
  model is disposed when scikit-learn's model selection is done with it.

The names are also reachable here (``lifecycle.integrations.managed_tuner``),
which imports their module then.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module (under this package) that defines it.
_MODULES = {
    "ManagedEstimator": "sklearn",
    "ManagedSKLearnClassifier": "sklearn",
    "ManagedSKLearnRegressor": "sklearn",
    "ManagedSKLearnTransformer": "sklearn",
    "ManagedTuner": "keras_tuner",
    "TunerStatistics": "keras_tuner",
    "managed_tuner": "keras_tuner",
}

__all__ = [
    "ManagedEstimator",
    "ManagedSKLearnClassifier",
    "ManagedSKLearnRegressor",
    "ManagedSKLearnTransformer",
    "ManagedTuner",
    "TunerStatistics",
    "managed_tuner",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
