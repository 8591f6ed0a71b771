"""Which Keras models a set of roots reaches, by a bounded walk of the object graph.

The walk follows what :func:`gc.get_referents` gives (what an object holds in
its attributes, items, closure cells, frames), with exceptions that keep it
small and keep it to the objects the roots own:

* modules are not entered, nor classes (a class defined by the roots' own code
  excepted: its class attributes count): another library's globals and class
  attributes are not the roots';
* a function gives its closure cells, defaults and attributes, not its globals;
* a NumPy array of objects (a pandas column of them) gives its items, which
  :func:`gc.get_referents` does not see;
* TensorFlow's graphs, traced functions, tensors and the specs describing them
  are not entered: they hold ops and captured tensors, not Python objects of the
  roots', and are most of a fitted model's objects. A ``tf.function`` is
  entered: its Python function's closure may hold a model;
* the ``stops`` are not entered.

Weak references are not followed: what holds a model weakly does not keep it.
"""

from __future__ import annotations

import enum
import gc
import inspect
import types
from collections.abc import Collection, Iterable
from typing import Any

import attrs
import keras
import numpy as np
import tensorflow as tf

__all__ = ["Reach", "reach"]


class _Kind(enum.Enum):
    """How the walk treats an object of a given type."""

    SKIP = "skip"  # holds nothing the roots own, or nothing at all (a str, a module)
    CLASS = "class"  # entered only when defined by the roots' own code
    FUNCTION = "function"  # its closure, defaults and attributes; not its globals
    ARRAY = "array"  # a NumPy array: its items if they are objects
    MODEL = "model"  # a keras.Model: noted, then entered like any object
    OBJECT = "object"  # entered through gc.get_referents


# Objects that refer to nothing: skipped before their identity is even looked up.
_ATOMIC = (str, bytes, int, float, complex, bool, type(None), range)
# Objects whose references are not the roots': another library's globals, code,
# signatures, and TensorFlow's graphs, traced functions (a tf.function's Python
# function is entered: its closure may hold a model), tensors and the values
# describing them.
_OPAQUE = (
    types.ModuleType,
    types.CodeType,
    inspect.Signature,  # a function's defaults, entered through the function
    tf.Graph,
    tf.Operation,
    tf.Tensor,
    tf.types.experimental.ConcreteFunction,
    tf.types.experimental.AtomicFunction,
    tf.types.experimental.FunctionType,
    tf.TypeSpec,
    tf.TensorShape,
    tf.DType,
)


def _kind_of(cls: type) -> _Kind:
    if issubclass(cls, _ATOMIC) or issubclass(cls, _OPAQUE):
        return _Kind.SKIP
    if issubclass(cls, type):
        return _Kind.CLASS
    if cls is types.FunctionType:
        return _Kind.FUNCTION
    if issubclass(cls, np.ndarray):
        return _Kind.ARRAY
    if issubclass(cls, keras.Model):
        return _Kind.MODEL
    return _Kind.OBJECT


@attrs.frozen
class Reach:
    """What one walk found.

    Attributes:
        models: The Keras models reached, in the order found; the caller lets
            go of them.
        objects: How many objects the walk entered.
        complete: Whether the walk reached everything it could, or every model
            it was asked about; False when it stopped at its limit.
    """

    models: tuple[keras.Model, ...]
    objects: int
    complete: bool


def reach(
    roots: Iterable[Any],
    *,
    stops: Iterable[Any] = (),
    wanted: Collection[int] = (),
    own_module: str = "__main__",
    limit: int,
) -> Reach:
    """Walk the objects ``roots`` reach, noting the Keras models among them.

    Args:
        roots: Where the walk starts.
        stops: Objects neither entered nor counted as reached.
        wanted: ``id()`` of the models the caller asks about: the walk stops
            once it reached them all.
        own_module: The ``__module__`` of the classes the walk enters (those
            defined by the roots' own code).
        limit: How many objects the walk enters at most.

    Returns:
        A :class:`Reach`.
    """
    kinds: dict[type, _Kind] = {}
    seen: set[int] = {id(stop) for stop in stops}
    pending: list[Any] = []
    models: list[keras.Model] = []
    missing = set(wanted)
    objects = 0

    def admit(candidates: Iterable[Any]) -> None:
        for obj in candidates:
            cls = type(obj)
            kind = kinds.get(cls)
            if kind is None:
                kind = kinds[cls] = _kind_of(cls)
            if kind is _Kind.SKIP or id(obj) in seen:
                continue
            seen.add(id(obj))
            if kind is _Kind.CLASS and getattr(obj, "__module__", None) != own_module:
                continue
            pending.append(obj)

    # No collection during the walk: its garbage is lists without cycles, and a full
    # collection it set off (a pass over a whole TensorFlow heap) would stall the cell.
    collecting = gc.isenabled()
    gc.disable()
    try:
        admit(roots)
        while pending and objects < limit:
            obj = pending.pop()
            objects += 1
            # Not kinds[...]: another thread may have changed its class since (manage()).
            kind = kinds.get(type(obj)) or _kind_of(type(obj))
            if kind is _Kind.FUNCTION:
                admit(
                    (*(obj.__closure__ or ()), obj.__defaults__, obj.__kwdefaults__, obj.__dict__)
                )
                continue
            if kind is _Kind.ARRAY:
                if obj.dtype == object:
                    admit(obj.flat)
                continue
            if kind is _Kind.MODEL:
                models.append(obj)
                missing.discard(id(obj))
                if wanted and not missing:
                    pending.clear()  # every model asked about is reached
                    break
            admit(gc.get_referents(obj))
    finally:
        if collecting:
            gc.enable()
    return Reach(models=tuple(models), objects=objects, complete=not pending)
