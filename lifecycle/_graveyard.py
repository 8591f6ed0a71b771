"""Weak references to what ``dispose()`` released, so leak reports can find it later.

Nothing here keeps anything alive: a disposed model that is garbage-collected
simply drops out.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import keras

from . import _tf

__all__ = ["bury", "disposed_models", "disposed_variables"]

# Reentrant: a weakref callback may run (in a collection) while this thread holds it.
_lock = threading.RLock()
# By id, because variables are not hashable; each ref removes itself.
_models: dict[int, weakref.ref[Any]] = {}
_variables: dict[int, weakref.ref[Any]] = {}


def _remember(table: dict[int, weakref.ref[Any]], obj: Any) -> None:
    key = id(obj)

    def forget(_: weakref.ref[Any]) -> None:
        with _lock:
            if table.get(key) is ref:
                del table[key]

    ref = weakref.ref(obj, forget)
    table[key] = ref


def bury(model: keras.Model) -> None:
    """Remember ``model`` and its variables as disposed (called by ``dispose()``)."""
    variables = list(_tf.keras_variables(model))
    with _lock:
        _remember(_models, model)
        for variable in variables:
            _remember(_variables, variable)


def _alive(table: dict[int, weakref.ref[Any]]) -> list[Any]:
    with _lock:
        refs = list(table.values())
    return [obj for ref in refs if (obj := ref()) is not None]


def disposed_models() -> list[Any]:
    """Disposed models still alive (somebody holds them)."""
    return _alive(_models)


def disposed_variables() -> list[Any]:
    """Variables of disposed models still alive."""
    return _alive(_variables)
