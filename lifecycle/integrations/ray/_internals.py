"""Every private name of Ray this integration relies on, and their self-check.

Ray Serve's multiplexing has no public hook for eviction, so :func:`multiplexed`
reads Ray's multiplexer: the ``_ModelMultiplexWrapper`` that Ray keeps on the
loader's owner under ``__serve_multiplex_wrapper``, its cache ``models`` (least
recently used first) and its ``unload_model_lru()``. Ray Tune's
``FunctionTrainable`` (an internal module's class) tells function trainables
from class ones. Nothing else in the package touches Ray's internals; when Ray
moves one, :func:`check_ray_internals` fails naming the Ray version and what moved.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import ray

__all__ = [
    "RAY_MULTIPLEXER_ATTRIBUTE",
    "check_ray_internals",
    "function_trainable_class",
    "is_ray_multiplexer",
    "multiplex_wrapper_class",
]

# Where Ray Serve keeps its multiplexer on the object that owns the loader (the
# deployment instance, or the function); created on the loader's first call.
RAY_MULTIPLEXER_ATTRIBUTE = "__serve_multiplex_wrapper"


def _moved(what: str) -> RuntimeError:
    return RuntimeError(
        f"lifecycle.integrations.ray relies on a Ray internal that moved in ray {ray.__version__}: "
        f"{what}. keras-lifecycle[ray] is tested with the Ray releases it pins; install one "
        "of those, or a keras-lifecycle release that supports this Ray"
    )


@functools.cache
def multiplex_wrapper_class() -> type:
    """Ray Serve's multiplexer class (imported on first use: Serve and Tune are separate extras)."""
    try:
        from ray.serve.multiplex import _ModelMultiplexWrapper
    except ImportError as error:
        raise _moved("ray.serve.multiplex._ModelMultiplexWrapper cannot be imported") from error
    return _ModelMultiplexWrapper


def is_ray_multiplexer(found: Any) -> bool:
    """Whether ``found`` is Ray's multiplexer, with the cache and eviction read here."""
    return (
        isinstance(found, multiplex_wrapper_class())
        and isinstance(getattr(found, "models", None), dict)
        and inspect.iscoroutinefunction(getattr(found, "unload_model_lru", None))
    )


@functools.cache
def function_trainable_class() -> type:
    """Ray Tune's class of function trainables (imported on first use: Ray Tune is heavy)."""
    try:
        from ray.tune.trainable.function_trainable import FunctionTrainable
    except ImportError as error:
        raise _moved(
            "ray.tune.trainable.function_trainable.FunctionTrainable cannot be imported"
        ) from error
    return FunctionTrainable


def check_ray_internals(*, serve: bool = True, tune: bool = True) -> None:
    """Check every Ray internal above is where this integration reads it.

    Args:
        serve: Check Ray Serve's internals (imports Ray Serve).
        tune: Check Ray Tune's internal (imports Ray Tune).

    Raises:
        RuntimeError: One moved; the message names the Ray version and the internal.
    """
    if serve:
        _check_serve()
    if tune:
        from ray import tune as ray_tune

        if not issubclass(function_trainable_class(), ray_tune.Trainable):
            raise _moved("FunctionTrainable is no longer a ray.tune.Trainable")


def _check_serve() -> None:
    from ray.serve import api as serve_api

    wrapper = multiplex_wrapper_class()
    if not inspect.iscoroutinefunction(getattr(wrapper, "unload_model_lru", None)):
        raise _moved("ray.serve.multiplex._ModelMultiplexWrapper.unload_model_lru() is gone")
    if "self.models" not in inspect.getsource(wrapper.__init__):
        raise _moved("ray.serve.multiplex._ModelMultiplexWrapper no longer keeps `models`")
    if RAY_MULTIPLEXER_ATTRIBUTE not in inspect.getsource(serve_api.multiplexed):
        raise _moved(
            f"ray.serve.multiplexed no longer keeps its multiplexer at "
            f"{RAY_MULTIPLEXER_ATTRIBUTE!r}"
        )
