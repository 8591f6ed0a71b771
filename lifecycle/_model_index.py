"""Weak references to every managed model, and to what ``dispose()`` released.

Leak reports and the test helpers look here. Nothing here keeps anything
alive: an object that is garbage-collected simply drops out.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import keras

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


class _Entry(weakref.ref):  # type: ignore[type-arg]
    """A weak reference that knows its table and key, so that one callback serves all."""

    __slots__ = ("key", "table")
    key: int
    table: dict[int, weakref.ref[Any]]


def _forget(entry: _Entry) -> None:
    with _lock:
        if entry.table.get(entry.key) is entry:
            del entry.table[entry.key]


def _remember(table: dict[int, weakref.ref[Any]], obj: Any) -> None:
    # One weakref per object and no closure: dispose() remembers every
    # variable and handle of a model, hundreds for a ResNet.
    entry = _Entry(obj, _forget)
    entry.key = key = id(obj)
    entry.table = table
    table[key] = entry


def note_managed(model: keras.Model) -> None:
    """Remember ``model`` as managed (called when it comes under management)."""
    with _lock:
        _remember(_managed, model)


def note_disposed(model: keras.Model, variables: Iterable[Any], handles: Iterable[Any]) -> None:
    """Remember a model being disposed, its variables and its buffers' handles.

    Args:
        model: The model (called by ``dispose()``).
        variables: Its Keras variables (``_tf.keras_variables(model)``).
        handles: The handle tensors of their leaves (every replica and shard).
    """
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
