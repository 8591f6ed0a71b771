"""Weak references to every managed model, and to what ``dispose()`` released.

Leak reports and the test helpers look here. Nothing here keeps anything
alive: an object that is garbage-collected simply drops out.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import keras

from . import _tf

__all__ = [
    "disposed_handles",
    "disposed_models",
    "disposed_variables",
    "managed_models",
    "note_disposed",
    "note_managed",
]

# Reentrant: a weakref callback may run (in a collection) while this thread holds it.
_lock = threading.RLock()
# By id, because variables are not hashable; each ref removes itself.
_managed: dict[int, weakref.ref[Any]] = {}
_models: dict[int, weakref.ref[Any]] = {}
_variables: dict[int, weakref.ref[Any]] = {}
# Resource handles of disposed variables: traced graphs keep these, not the variables.
_handles: dict[int, weakref.ref[Any]] = {}


def _remember(table: dict[int, weakref.ref[Any]], obj: Any) -> None:
    key = id(obj)

    def forget(_: weakref.ref[Any]) -> None:
        with _lock:
            if table.get(key) is ref:
                del table[key]

    ref = weakref.ref(obj, forget)
    table[key] = ref


def note_managed(model: keras.Model) -> None:
    """Remember ``model`` as managed (called when it comes under management)."""
    with _lock:
        _remember(_managed, model)


def note_disposed(model: keras.Model) -> None:
    """Remember ``model`` and its variables as disposed (called by ``dispose()``)."""
    variables = list(_tf.keras_variables(model))
    handles = [leaf.handle for variable in variables for leaf in _tf.leaves(variable)]
    with _lock:
        _remember(_models, model)
        for variable in variables:
            _remember(_variables, variable)
        for handle in handles:
            _remember(_handles, handle)


def _alive(table: dict[int, weakref.ref[Any]]) -> list[Any]:
    with _lock:
        refs = list(table.values())
    return [obj for ref in refs if (obj := ref()) is not None]


def managed_models() -> list[Any]:
    """Managed models still alive, disposed or not."""
    return _alive(_managed)


def disposed_models() -> list[Any]:
    """Disposed models still alive (somebody holds them)."""
    return _alive(_models)


def disposed_variables() -> list[Any]:
    """Variables of disposed models still alive."""
    return _alive(_variables)


def disposed_handles() -> list[Any]:
    """Resource handles of disposed models' variables still alive."""
    return _alive(_handles)
