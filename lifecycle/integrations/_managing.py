"""What the integrations share: managing a model without changing random sequences."""

from __future__ import annotations

import random
from typing import TypeVar

import keras

from .._model import manage

__all__ = ["manage_keeping_seeds"]

_Model = TypeVar("_Model", bound=keras.Model)


def manage_keeping_seeds(model: _Model) -> _Model:
    """``lc.manage(model)``, leaving Python's random generator as it found it.

    The first management in a process runs the compatibility self-check, which
    builds a small Keras model; its initializers draw their seeds from Python's
    ``random``. A sweep seeded with ``keras.utils.set_random_seed`` would then
    initialise its next models differently from the same sweep without
    management. Restoring the generator's state keeps the two identical.
    """
    state = random.getstate()
    try:
        return manage(model)
    finally:
        random.setstate(state)
