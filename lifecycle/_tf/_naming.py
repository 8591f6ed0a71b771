"""Mechanism C: per-entry names without ``clear_session``.

Keras names layers from per-thread counters (``global_state.object_name_uids``)
and prefixes variable paths with the active ``keras.name_scope``s. Swapping in
fresh counters and opening ``name/v<version>`` scopes while a model builds its
variables gives every version identical relative paths under its own prefix,
and leaves the caller's counters untouched.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import keras
from keras.src.backend.common import global_state

_COUNTERS = "object_name_uids"


@contextlib.contextmanager
def isolated_names(*scopes: str) -> Iterator[None]:
    """Build under fresh layer-name counters and nested name scopes.

    Args:
        scopes: Scope names, outermost first; none may contain ``/``.
    """
    saved = global_state.get_global_attribute(_COUNTERS)
    global_state.set_global_attribute(_COUNTERS, collections.defaultdict(int))
    try:
        with contextlib.ExitStack() as stack:
            for scope in scopes:
                stack.enter_context(keras.name_scope(scope))
            yield
    finally:
        global_state.set_global_attribute(_COUNTERS, saved)
