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


class SessionState(enum.Enum):
    """Where a lifecycle session is in its life: ``OPEN -> CLOSING -> CLOSED``.

    A close that cannot finish (a model's calls in flight did not drain in time)
    returns the session from ``CLOSING`` to ``OPEN``; ``close()`` may be retried.
    """

    #: Owns models and child sessions; its cleaner runs.
    OPEN = "open"
    #: Disposing children and models; adopts nothing new.
    CLOSING = "closing"
    #: Everything it owned is disposed and its cleaner is stopped.
    CLOSED = "closed"
