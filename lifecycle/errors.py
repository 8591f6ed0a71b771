"""Exceptions raised by keras-lifecycle.

Library-specific failures raise one of the exceptions below. Each derives from
:class:`LifecycleError` and from the built-in that fits the mistake, so
``except RuntimeError`` keeps working for callers who do not know this library.
Arguments of the wrong type or out of range (a negative timeout, a threshold that
is not an int) raise the plain built-in ``ValueError`` or ``TypeError``, as
Python's own functions do, not a :class:`LifecycleError`; only ``manage()`` of
something it cannot manage has its own :class:`NotAModelError`. Every closed
thing — a closed session or registry, a returned lease, a closed checkpoint
keeper, a disposed model or object — raises :class:`ClosedError` when used, so
one ``except ClosedError`` catches them all::

    LifecycleError(Exception)
    ├── ClosedError(RuntimeError)             used after it was closed, disposed or returned
    │   └── DisposedError                     a model (or a closed session's model) after dispose
    ├── DisposeInProgressError(RuntimeError)  dispose() from inside the model's own call
    ├── DrainTimeoutError(TimeoutError)       calls in flight did not finish in time
    ├── NotAModelError(TypeError)             manage() of neither a model, a module nor an optimizer
    ├── CompatibilityError(RuntimeError)      a TensorFlow/Keras internal has moved
    ├── UnknownModelError(LookupError)        a registry name, version or label that is not loaded
    ├── LoadError(RuntimeError)               a registry load failed (factory, file, warm-up)
    ├── BudgetExceededError(MemoryError)      a load cannot fit the registry's budget
    ├── UnavailableError(TimeoutError)        no routable version appeared within the wait
    ├── QueueFullError(RuntimeError)          a batching version's queue is full: retry later
    ├── CheckpointError(RuntimeError)         a checkpoint is missing, corrupt or does not match
    └── CoordinationError(TimeoutError)       workers could not agree to dispose together
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "CheckpointError",
    "ClosedError",
    "CompatibilityError",
    "CoordinationError",
    "DisposeInProgressError",
    "DisposedError",
    "DrainTimeoutError",
    "LifecycleError",
    "LoadError",
    "NotAModelError",
    "QueueFullError",
    "UnavailableError",
    "UnknownModelError",
]


class LifecycleError(Exception):
    """Root of the library-specific exceptions (bad arguments raise plain built-ins)."""


class ClosedError(LifecycleError, RuntimeError):
    """Something was used after it was closed, disposed or returned.

    One error for every closed thing, whatever closed it: a
    :class:`~lifecycle.LifecycleSession` that is closing or closed, a closed
    :class:`~lifecycle.ModelRegistry`, a :class:`~lifecycle.ServingLease` used
    after its ``with`` block, a closed :class:`~lifecycle.CheckpointKeeper`, and
    (as its subclass :class:`DisposedError`) a disposed model or object. The
    message names what was closed and what to use instead; a closed thing is
    never reopened.
    """


class DisposedError(ClosedError):
    """A disposed model was used: its buffers are gone.

    Raised by every entry point (``model(x)``, ``fit``, ``predict``, ``save``, ...)
    of a managed model once ``dispose()`` has started, by a managed object's
    attributes after its dispose, and by a plain model whose session closed.
    """


class DisposeInProgressError(LifecycleError, RuntimeError):
    """``dispose()`` was called from inside a call to the same model.

    Disposing would wait for the calling thread itself; finish the call first.
    """


class DrainTimeoutError(LifecycleError, TimeoutError):
    """Calls in flight did not finish within the drain timeout.

    The model is left live and usable; retry ``dispose()`` later or with a longer
    ``timeout``.

    Attributes:
        in_flight: How many calls were still running when the wait expired.
    """

    def __init__(self, message: str, in_flight: int) -> None:
        super().__init__(message)
        self.in_flight = in_flight


class NotAModelError(LifecycleError, TypeError):
    """``manage()`` received neither a ``keras.Model``, a ``tf.Module`` nor a Keras optimizer."""


class CompatibilityError(LifecycleError, RuntimeError):
    """A TensorFlow or Keras internal that keras-lifecycle relies on has moved.

    The message names the installed versions and the internal that failed.
    """


class UnknownModelError(LifecycleError, LookupError):
    """A registry name, version or label that is not loaded (or not routable)."""


class LoadError(LifecycleError, RuntimeError):
    """A registry load failed; the partial model was disposed.

    Versions evicted to make room for it were brought back (or, if that failed
    too, the message names them). The original exception is the ``__cause__``.
    """


class BudgetExceededError(LifecycleError, MemoryError):
    """A load cannot fit the registry's memory budget or version cap.

    Refused before building: nothing changed. Refused after building (the
    version came out larger than estimated): the new one was not kept and the
    versions evicted for it were brought back, as the message says.
    """


class UnavailableError(LifecycleError, TimeoutError):
    """No routable version of a model appeared within the wait (a swap gap)."""


class QueueFullError(LifecycleError, RuntimeError):
    """A batching version already has ``max_enqueued_batches`` batches waiting.

    Raised at once, before the request is queued (TensorFlow Serving's
    ``max_enqueued_batches``): the load is more than the version can serve, and
    the caller should retry later or elsewhere. ``lifecycle serve`` answers it
    with 503 UNAVAILABLE, as TensorFlow Serving does.
    """


class CheckpointError(LifecycleError, RuntimeError):
    """A checkpoint is missing, truncated or corrupt, or does not match the model.

    Raised before anything is restored: the model (or the registry's serving
    version) is unchanged.

    Attributes:
        path: The checkpoint prefix or directory concerned.
        missing: Objects of the model that the checkpoint has no value for.
        unexpected: Checkpoint values that nothing in the model matches.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str,
        missing: tuple[str, ...] = (),
        unexpected: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.path = path
        self.missing = missing
        self.unexpected = unexpected


class CoordinationError(LifecycleError, TimeoutError):
    """The workers of a multi-worker strategy did not all reach ``dispose()`` in time.

    Nothing was released: the model is live. TensorFlow aborts a worker's
    collective operations after a collective timeout, so the strategy cannot
    train any more in this process; ``dispose(coordinate=False)`` releases this
    worker's replicas alone.
    """
