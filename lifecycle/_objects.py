"""``manage()`` for what is not a Keras model: a ``tf.Module`` and a Keras optimizer.

A ``tf.Module`` that holds raw ``tf.Variable`` objects and trains them in a
``tf.function`` step, with an optimizer built outside any model, is where the
variable-lifecycle problem starts: its variables and the optimizer's slots are
pinned by the traced step's graphs like a Keras model's. Managed, such an
object gets a model's guarantees: ``dispose()`` releases every buffer it owns
(slots, a wrapped optimizer's, the Keras objects among its attributes) and
purges the gradient-registry entries that pin them, and every later use raises
:class:`~lifecycle.errors.DisposedError`.

Like :func:`~lifecycle.manage` for a model, managing swaps the object's class
for a variant with a mixin in front, in place. The mixin guards attribute
reads (``__getattribute__``, public names only) once the object is disposed,
and counts the calls in flight of the entry points that touch the variables
(a module's ``__call__``; an optimizer's ``apply_gradients`` and ``apply``),
so that ``dispose()`` waits for them.
"""

from __future__ import annotations

from typing import Any, TypeVar

import keras
import tensorflow as tf

from . import _tf
from ._core import ModelState
from ._disposal import (
    DEFAULT,
    DisposeReport,
    Managed,
    ModelRecord,
    Refresh,
    disposed_error,
    run_guarded,
)
from ._session import LifecycleSession, current_session

__all__ = ["ManagedObject", "is_manageable_object", "manage_object"]

_Object = TypeVar("_Object")

# Readable after dispose besides private names (what Python, TensorFlow and
# Keras read to print, track or collect the object): the mixin's own API.
_ALWAYS = frozenset(
    {
        "dispose",
        "dispose_timeout",
        "name",
        "owned_bytes",
        "owned_variables",
        "session",
        "state",
    }
)


class ManagedObject(Managed):
    """Mixed in front of a managed ``tf.Module``'s or Keras optimizer's class.

    Adds ``dispose()``, ``state``, ``session``, ``owned_bytes``,
    ``owned_variables`` and ``with obj:``; after ``dispose()`` every other
    attribute read raises :class:`~lifecycle.errors.DisposedError`.
    """

    def __getattribute__(self, name: str) -> Any:
        if name[0] != "_" and name not in _ALWAYS:
            record = object.__getattribute__(self, "_lifecycle")
            # DISPOSING still reads: dispose() itself reads the variables.
            if record.state is ModelState.DISPOSED:
                raise disposed_error(self, f"`{name}`")
        return super().__getattribute__(name)

    def dispose(self, *, timeout: Any = DEFAULT, collect: bool | None = None) -> DisposeReport:
        """Release every buffer the object owns and purge what pins them; idempotent.

        Calls in flight of its guarded entry points are waited for (up to
        ``timeout``); then every variable it holds is released (a module's
        raw variables, the Keras layers, models, optimizers and variables
        among its attributes; an optimizer's ``iterations``, learning rate and
        slots), and the gradient-registry entries of traced steps that
        captured them are deleted. Later use raises ``DisposedError``.

        Args:
            timeout: Seconds to wait for calls in flight; ``None`` waits
                forever. Defaults to ``dispose_timeout`` (30 s).
            collect: ``True`` runs the session's collection now; ``False`` or
                ``None`` (default) leave the Python objects to Python.

        Returns:
            A frozen :class:`~lifecycle.DisposeReport`.

        Raises:
            DisposeInProgressError: Called from inside one of its guarded calls.
            DrainTimeoutError: Calls in flight did not finish in time; the
                object is live and unchanged.
        """
        return self._lifecycle.dispose(self, timeout, collect, coordinate=False)


def _gated(mixin: type, name: str) -> Any:
    def entry_point(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Its first call may create variables (a module's lazy weights, an
        # optimizer's slots): they are counted then.
        method = getattr(super(mixin, self), name)
        return run_guarded(self, name, method, Refresh.FIRST, *args, **kwargs)

    entry_point.__name__ = name
    entry_point.__qualname__ = f"{mixin.__name__}.{name}"
    return entry_point


class _CallableModule(ManagedObject):
    """A managed module whose class defines ``__call__``: its calls are counted."""


class _ManagedOptimizer(ManagedObject):
    """A managed Keras optimizer: the steps that update its slots are counted."""


for _mixin, _names in (
    (_CallableModule, ("__call__",)),
    (_ManagedOptimizer, ("apply_gradients", "apply")),
):
    for _name in _names:
        setattr(_mixin, _name, _gated(_mixin, _name))
del _mixin, _names, _name


def is_manageable_object(obj: Any) -> bool:
    """Whether :func:`manage_object` takes ``obj``: a ``tf.Module`` or a Keras optimizer."""
    return isinstance(obj, (tf.Module, keras.optimizers.Optimizer)) and not isinstance(
        obj, keras.Layer
    )


def manage_object(
    obj: _Object, *, dispose_timeout: float | None, session: LifecycleSession | None
) -> _Object:
    """Put a ``tf.Module`` or a Keras optimizer under management, in place.

    ``manage()`` calls it for an object not managed yet, its arguments checked.
    """
    _tf.check_compatibility()
    if isinstance(obj, keras.optimizers.Optimizer):
        mixin: type = _ManagedOptimizer
    elif callable(obj):
        mixin = _CallableModule
    else:
        mixin = ManagedObject
    variant = _tf.keras_internals.subclass_variant(mixin, type(obj))
    if isinstance(obj, tf.Module):
        _tf.keras_internals.hide_from_module_walks(variant, "_lifecycle")
    owner = session if session is not None else current_session()
    owner.cleaner.safe_point()
    ModelRecord.attach(obj, owner, dispose_timeout)
    _tf.keras_internals.set_class(obj, variant)
    obj._lifecycle.refresh(obj)
    return obj
