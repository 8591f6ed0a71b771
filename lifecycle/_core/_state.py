"""The states a managed model moves through."""

from __future__ import annotations

import enum


class ModelState(enum.Enum):
    """Where a managed model is in its life.

    The only transitions are ``LIVE -> DISPOSING -> DISPOSED`` and, when the wait
    for calls in flight expires, ``DISPOSING -> LIVE``.
    """

    #: Accepting calls; owns its variables.
    LIVE = "live"
    #: Refusing new calls, waiting for calls in flight, then releasing.
    DISPOSING = "disposing"
    #: Buffers released and references dropped; every entry point raises
    #: ``DisposedError``.
    DISPOSED = "disposed"
