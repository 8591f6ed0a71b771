"""Reading a TensorFlow/Keras internal: loudly, never with a silent default.

Code in ``lifecycle/_tf/`` reads private attributes through :func:`internal`. A
default would hide a rename: the library would then silently leak, or skip the
multi-worker barrier and leave peer workers hanging in their next all-reduce.
Instead the read raises a ``CompatibilityError`` naming the internal and the
installed versions, like the self-check (``_compat.py``) does.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from ..errors import CompatibilityError

__all__ = ["incompatible", "internal"]


def incompatible(what: str, exc: BaseException) -> CompatibilityError:
    """A CompatibilityError naming the installed versions and what failed."""
    return CompatibilityError(
        f"keras-lifecycle cannot work with TensorFlow {tf.__version__} and Keras "
        f"{keras.__version__}: the internal check {what!r} failed "
        f"({type(exc).__name__}: {exc}). Install the versions pinned by "
        "keras-lifecycle (pip install keras-lifecycle) or upgrade keras-lifecycle."
    )


def internal(obj: Any, name: str, what: str) -> Any:
    """``getattr(obj, name)`` for a private TensorFlow/Keras attribute.

    Args:
        obj: The object (or module, or class) that should have the attribute.
        name: The attribute's name.
        what: How messages name the internal, e.g. ``"CachingVariable._v"``.

    Returns:
        The attribute's value.

    Raises:
        CompatibilityError: ``obj`` has no attribute ``name``.
    """
    try:
        return getattr(obj, name)
    except AttributeError as exc:
        raise incompatible(what, exc) from exc
