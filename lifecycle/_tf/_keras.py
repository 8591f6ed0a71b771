"""Keras class plumbing: functional construction, class swapping, compiled state.

``keras.Model.__init__`` rewrites ``cls.__bases__`` of any subclass constructed
with ``(inputs, outputs)`` to inject ``Functional``. Done to ``ManagedModel``, that
would break every later subclassed ``ManagedModel`` ("Functional.__init__()
missing 2 required positional arguments"). Instead, a functional construction
gets an instance of a cached variant class ``(cls, Functional)`` and the bases of
user classes are never touched.
"""

from __future__ import annotations

import threading
from typing import Any

import keras
from keras.src.backend.common import global_state
from keras.src.models import model as keras_model_module
from keras.src.models.functional import Functional
from keras.src.saving import object_registration

__all__ = [
    "Functional",
    "clear_session_preserving_caller_state",
    "drop_compiled_state",
    "functional_variant",
    "is_functional_call",
    "subclass_variant",
]

_variants_lock = threading.Lock()
_variants: dict[tuple[tuple[type, ...], type], type] = {}


def is_functional_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Model(*args, **kwargs)`` is a functional construction."""
    return bool(keras_model_module.functional_init_arguments(args, kwargs))


def _variant(bases: tuple[type, ...], like: type) -> type:
    """A cached class with the given bases that serializes like ``like``."""
    with _variants_lock:
        variant = _variants.get((bases, like))
        if variant is None:
            variant = type(
                like.__name__,
                bases,
                {"__module__": like.__module__, "__qualname__": like.__qualname__},
            )
            # Saved configs name the class the user knows, so they load back
            # with the same custom objects as without keras-lifecycle.
            registered = object_registration.GLOBAL_CUSTOM_NAMES.get(like)
            if registered is not None:
                object_registration.GLOBAL_CUSTOM_NAMES[variant] = registered
            _variants[bases, like] = variant
        return variant


def functional_variant(cls: type) -> type:
    """``cls`` with ``Functional`` mixed in, for ``cls(inputs, outputs)``."""
    if issubclass(cls, Functional):
        return cls
    return _variant((cls, Functional), like=cls)


def subclass_variant(mixin: type, cls: type) -> type:
    """``cls`` with ``mixin`` in front, for putting an existing instance under management."""
    if issubclass(cls, mixin):
        return cls
    return _variant((mixin, cls), like=cls)


def drop_compiled_state(model: keras.Model) -> None:
    """Drop the references a compiled model holds to traced functions and training state."""
    for name in ("train_function", "test_function", "predict_function"):
        if getattr(model, name, None) is not None:
            object.__setattr__(model, name, None)
    for name in (
        "_compile_loss",
        "_compile_metrics",
        "_loss_tracker",
        "_compile_config",
        "optimizer",
    ):
        if getattr(model, name, None) is not None:
            object.__setattr__(model, name, None)
    if getattr(model, "compiled", False):
        object.__setattr__(model, "compiled", False)


# Per-thread Keras state that keras.backend.clear_session() discards: the name
# counters (layer names) and the name-scope stack. The dtype policy is restored
# through the public keras.config API.
_CALLER_STATE = ("object_name_uids", "name_scope_stack")


def clear_session_preserving_caller_state() -> None:
    """``keras.backend.clear_session()``, keeping the caller's dtype policy and names.

    ``clear_session`` resets the global dtype policy (``mixed_float16`` silently
    becomes ``float32``) and every thread's name counters; it also clears
    TensorFlow's eager kernel cache and default graph, which is what frees
    memory. The calling thread's policy, counters and name scopes are put back.
    """
    policy = keras.config.dtype_policy()
    saved = {name: global_state.get_global_attribute(name) for name in _CALLER_STATE}
    keras.backend.clear_session(free_memory=False)
    keras.config.set_dtype_policy(policy)
    for name, value in saved.items():
        if value is not None:
            global_state.set_global_attribute(name, value)
