"""Keras class plumbing: functional construction, class swapping, pickling, compiled state.

``keras.Model.__init__`` rewrites ``cls.__bases__`` of any subclass constructed
with ``(inputs, outputs)`` to inject ``Functional``. Done to ``ManagedModel``, that
would break every later subclassed ``ManagedModel`` ("Functional.__init__()
missing 2 required positional arguments"). Instead, a functional construction
gets an instance of a cached variant class ``(cls, Functional)`` and the bases of
user classes are never touched. ``manage()`` swaps an existing model's class for
a variant ``(ManagedModel, cls)`` the same way.

A variant has the name, module and registered name of the class the user
declared, so saved configs load back as that class. Pickle, though, finds a
class by module and name and refuses one that is not the object found there:
:func:`reduce_as_declared` makes a variant's instances unpickle through the
declared class instead.
"""

from __future__ import annotations

import threading
from typing import Any

import keras
from keras.src.backend.common import global_state
from keras.src.models import model as keras_model_module
from keras.src.models.functional import Functional
from keras.src.saving import object_registration

from ..errors import DisposedError
from ._internal import incompatible, internal

__all__ = [
    "COMPILED_STATE",
    "ENTRY_POINTS",
    "Functional",
    "caller_names",
    "clear_session_preserving_caller_state",
    "declared_class",
    "detach_compiled_state",
    "drop_compiled_state",
    "functional_variant",
    "hide_from_module_walks",
    "is_functional_call",
    "model_method",
    "reduce_as_declared",
    "registered_names",
    "restore_caller_names",
    "seal",
    "set_class",
    "subclass_variant",
]

#: The ``keras.Model`` methods that read or write a model's variables, which
#: ``ManagedModel`` guards. Resolved when called, so that a method Keras renamed
#: fails the self-check, not ``import lifecycle``.
ENTRY_POINTS = (
    "__call__",
    "compile",
    "evaluate",
    "export",
    "fit",
    "get_weights",
    "load_weights",
    "predict",
    "predict_on_batch",
    "quantize",
    "save",
    "save_weights",
    "set_weights",
    "test_on_batch",
    "train_on_batch",
)

#: Private attributes in which a compiled Keras model keeps its compiled loss,
#: metrics, loss tracker and compile arguments.
COMPILED_STATE = ("_compile_loss", "_compile_metrics", "_loss_tracker", "_compile_config")
# Public attributes holding traced step functions, and the optimizer.
STEP_FUNCTIONS = ("train_function", "test_function", "predict_function")
_TRAINING_STATE = (*STEP_FUNCTIONS, "optimizer")

# Keys of Keras's per-thread state (keras.src.backend.common.global_state) that
# keras.backend.clear_session() discards: the layer-name counters and the
# name-scope stack.
_NAME_COUNTERS = "object_name_uids"
_NAME_SCOPES = "name_scope_stack"

_variants_lock = threading.Lock()
_variants: dict[tuple[tuple[type, ...], type], type] = {}
# Variant class -> the class the user declared (the one it stands for).
_declared: dict[type, type] = {}


def is_functional_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Model(*args, **kwargs)`` is a functional construction."""
    check = internal(
        keras_model_module, "functional_init_arguments", "keras.Model functional_init_arguments"
    )
    return bool(check(args, kwargs))


def model_method(model: Any, name: str) -> Any:
    """``getattr(model, name)`` for a ``keras.Model`` method the library wraps.

    Args:
        model: A model, or a ``super()`` proxy of one.
        name: One of :data:`ENTRY_POINTS`.

    Raises:
        CompatibilityError: Keras no longer has the method.
    """
    return internal(model, name, f"keras.Model.{name}")


def registered_names() -> dict[type, str]:
    """Keras's class -> registered name table, the one saved configs are written with.

    Raises:
        CompatibilityError: It is no longer ``object_registration.GLOBAL_CUSTOM_NAMES``.
    """
    return internal(
        object_registration, "GLOBAL_CUSTOM_NAMES", "keras object_registration.GLOBAL_CUSTOM_NAMES"
    )


def _variant(bases: tuple[type, ...], like: type) -> type:
    """A cached class with the given bases that serializes like ``like``."""
    with _variants_lock:
        variant = _variants.get((bases, like))
        if variant is None:
            names = registered_names()
            variant = type(
                like.__name__,
                bases,
                {"__module__": like.__module__, "__qualname__": like.__qualname__},
            )
            # Saved configs name the class the user knows, so they load back
            # with the same custom objects as without keras-lifecycle.
            registered = names.get(like)
            if registered is not None:
                names[variant] = registered
            _variants[bases, like] = variant
            _declared[variant] = like
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


def hide_from_module_walks(cls: type, *names: str) -> None:
    """Make ``tf.Module``'s attribute walks (``variables``, ``_flatten``) skip ``names``.

    A managed module's bookkeeping (``_lifecycle``) is no part of the module:
    walked, it would reach the session and every other model.

    Raises:
        CompatibilityError: ``tf.Module._TF_MODULE_IGNORED_PROPERTIES`` has moved.
    """
    ignored = internal(cls, "_TF_MODULE_IGNORED_PROPERTIES", "tf.Module ignored properties")
    cls._TF_MODULE_IGNORED_PROPERTIES = frozenset(ignored) | frozenset(names)  # type: ignore[attr-defined]


def set_class(model: keras.Model, cls: type) -> None:
    """Make ``model`` an instance of ``cls`` (a variant of its class), in place.

    Bypasses ``Layer.__setattr__``: Keras's attribute tracking must not see it.
    """
    object.__setattr__(model, "__class__", cls)


def declared_class(cls: type) -> type:
    """The class the user declared that ``cls`` stands for (``cls`` itself if not a variant)."""
    return _declared.get(cls, cls)


def reduce_as_declared(reduced: Any, cls: type) -> Any:
    """Keras's ``__reduce__`` value for a ``cls`` instance, unpickled through the declared class.

    Keras pickles a model as ``(cls._unpickle_model, (archive,))``: a class
    method that loads the model from a ``.keras`` archive in memory. Pickling a
    method pickles its class by module and name, which for a variant finds the
    declared class, a different object, so pickle refuses it. The same class
    method of the declared class loads the same archive.

    Args:
        reduced: What ``keras.Model.__reduce__`` returned for the instance.
        cls: The instance's class.

    Returns:
        ``reduced`` with its function taken from :func:`declared_class`.

    Raises:
        CompatibilityError: Keras no longer pickles models this way.
    """
    try:
        function, args = reduced
        name = function.__name__
        if getattr(function, "__self__", None) is not cls:
            raise TypeError(f"expected a class method of {cls.__qualname__}, got {function!r}")
    except (TypeError, ValueError, AttributeError) as exc:
        raise incompatible("keras.Model.__reduce__ (KerasSaveable._unpickle_model)", exc) from exc
    return internal(declared_class(cls), name, f"KerasSaveable.{name}"), args


def drop_compiled_state(model: keras.Model) -> None:
    """Drop the references a compiled model holds to traced functions and training state.

    Raises:
        CompatibilityError: A compiled model lacks one of :data:`COMPILED_STATE`:
            Keras keeps it elsewhere now, and dropping the rest would leave it
            pinned.
    """
    detach_compiled_state(model).clear()


def step_functions(model: keras.Model) -> int:
    """How many traced step functions (train, test, predict) ``model`` holds."""
    return sum(getattr(model, name, None) is not None for name in STEP_FUNCTIONS)


def detach_compiled_state(model: keras.Model) -> list[Any]:
    """Take a compiled model's traced functions and training state off it.

    Like :func:`drop_compiled_state`, but the values taken off are returned, so
    that the caller decides where the last references go: destroying a large
    traced step function (its graph and instantiated kernels) takes tens of
    milliseconds inside TensorFlow.

    Returns:
        The values the model no longer references.

    Raises:
        CompatibilityError: As for :func:`drop_compiled_state`.
    """
    compiled = getattr(model, "compiled", False)
    detached = []
    for name in COMPILED_STATE:
        value = (
            internal(model, name, f"keras.Model.{name}") if compiled else getattr(model, name, None)
        )
        if value is not None:
            detached.append(value)
            object.__setattr__(model, name, None)
    for name in _TRAINING_STATE:
        value = getattr(model, name, None)
        if value is not None:
            detached.append(value)
            object.__setattr__(model, name, None)
    if compiled:
        object.__setattr__(model, "compiled", False)
    return detached


def caller_names() -> dict[str, Any]:
    """The calling thread's layer-name counters and name-scope stack, to restore later."""
    return {
        name: global_state.get_global_attribute(name) for name in (_NAME_COUNTERS, _NAME_SCOPES)
    }


def restore_caller_names(saved: dict[str, Any]) -> None:
    """Install counters and a name-scope stack from :func:`caller_names` on the calling thread."""
    for name, value in saved.items():
        if value is not None:
            global_state.set_global_attribute(name, value)


def clear_session_preserving_caller_state() -> None:
    """``keras.backend.clear_session()``, keeping the caller's dtype policy and names.

    ``clear_session`` resets the global dtype policy (``mixed_float16`` silently
    becomes ``float32``) and every thread's name counters; it also clears
    TensorFlow's eager kernel cache and default graph, which is what frees
    memory. The calling thread's policy, counters and name scopes are put back.
    """
    policy = keras.config.dtype_policy()
    saved = caller_names()
    keras.backend.clear_session(free_memory=False)
    keras.config.set_dtype_policy(policy)
    restore_caller_names(saved)


class ClosedModel:
    """In front of the class of a model whose session closed and released its variables.

    Every entry point that would read or write the released variables raises
    :class:`~lifecycle.errors.DisposedError` instead of a TensorFlow shape error.
    """

    # The name of the session that closed, set by seal().
    _lifecycle_closed_by: str


def _refusal(name: str) -> Any:
    def entry_point(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise DisposedError(
            f"{type(self).__name__} {self.name!r} was built in LifecycleSession "
            f"{self._lifecycle_closed_by!r}, which closed and released its variables, so "
            f"`{name}` cannot run. To keep a model past its session, hand it out before the "
            "session closes (`session.hand_out(model)`); or build a new one."
        )

    entry_point.__name__ = name
    entry_point.__qualname__ = f"ClosedModel.{name}"
    return entry_point


for _name in ENTRY_POINTS:
    setattr(ClosedModel, _name, _refusal(_name))
del _name


def seal(model: keras.Model, session: str) -> list[Any]:
    """Make every entry point of ``model`` raise ``DisposedError``; take its compiled state off.

    For a plain (unmanaged) model whose variables the closing ``session``
    releases.

    Returns:
        What :func:`detach_compiled_state` took off, for the caller to drop.
    """
    detached = detach_compiled_state(model)
    object.__setattr__(model, "_lifecycle_closed_by", session)
    set_class(model, subclass_variant(ClosedModel, type(model)))
    return detached
