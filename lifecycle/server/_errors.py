"""One table from the library's exceptions to each protocol's error status.

Routes never choose a status themselves: they raise, and the app's exception
handler looks the exception up here. The first row whose type matches wins, so
subclasses come before their bases. Both REST protocols answer errors as
``{"error": "<message>"}`` (TensorFlow Serving's ``api_rest.md``, KServe's
Open Inference Protocol), with TensorFlow Serving's statuses for the codes it
has (404 NOT_FOUND, 400 INVALID_ARGUMENT, 503 UNAVAILABLE, 500 INTERNAL); a
request body over the limit is 413, one that does not arrive within the body
read timeout 408, a load that cannot fit the memory budget 507, and a request
refused because the worker queue is full 503; a repository load or unload that
the model control mode refuses is 503, as in Triton; an admin call without the
right bearer token is 401, and one to a server whose admin API is turned off
403. gRPC answers with the canonical code itself, as TensorFlow Serving does
(its ``ToGRPCStatus`` maps TensorFlow's error codes one to one).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import grpc
import tensorflow as tf

from ..errors import (
    BudgetExceededError,
    LifecycleError,
    LoadError,
    QueueFullError,
    UnavailableError,
    UnknownModelError,
)

__all__ = [
    "ERRORS",
    "OVERLOADED",
    "AdminDisabledError",
    "BadRequestError",
    "ModelControlError",
    "PayloadTooLargeError",
    "RequestTimeoutError",
    "ServerBusyError",
    "UnauthorizedError",
    "WireError",
    "error_status",
    "grpc_answered",
    "wire_message",
]


class BadRequestError(ValueError):
    """A request that does not parse or does not fit its protocol (HTTP 400)."""


class PayloadTooLargeError(ValueError):
    """A request body over ``max_request_bytes`` (HTTP 413)."""


class RequestTimeoutError(TimeoutError):
    """A request body that did not arrive within ``body_read_timeout_seconds`` (HTTP 408).

    Also what a body still arriving when the server shuts down gets: its
    connection closes either way.
    """


class ServerBusyError(RuntimeError):
    """A request refused at once: ``max_queued_requests`` wait for a worker already (HTTP 503)."""


class UnauthorizedError(PermissionError):
    """An admin call without the server's bearer token (HTTP 401)."""


class AdminDisabledError(PermissionError):
    """An admin call to a server started with ``--no_admin_api`` (HTTP 403)."""


class ModelControlError(RuntimeError):
    """A repository load or unload that the model control mode refuses (HTTP 503, as Triton)."""


@attrs.frozen
class WireError:
    """How one kind of exception goes on the wire.

    Attributes:
        status: The HTTP status.
        code: TensorFlow's canonical error code (for status bodies), which is
            also the gRPC status code: see :attr:`grpc_code`.
    """

    status: int
    code: str

    @property
    def grpc_code(self) -> grpc.StatusCode:
        """The gRPC status code: the canonical code of the same name."""
        return grpc.StatusCode[self.code]


# Order matters: the first matching row wins.
ERRORS: tuple[tuple[type[BaseException], WireError], ...] = (
    (PayloadTooLargeError, WireError(413, "RESOURCE_EXHAUSTED")),
    (RequestTimeoutError, WireError(408, "DEADLINE_EXCEEDED")),
    (ServerBusyError, WireError(503, "UNAVAILABLE")),
    (UnauthorizedError, WireError(401, "UNAUTHENTICATED")),
    (AdminDisabledError, WireError(403, "PERMISSION_DENIED")),
    (UnknownModelError, WireError(404, "NOT_FOUND")),
    (BudgetExceededError, WireError(507, "RESOURCE_EXHAUSTED")),
    (UnavailableError, WireError(503, "UNAVAILABLE")),
    (QueueFullError, WireError(503, "UNAVAILABLE")),
    # Triton answers UNAVAILABLE when its control mode is not explicit.
    (ModelControlError, WireError(503, "UNAVAILABLE")),
    (LoadError, WireError(500, "INTERNAL")),
    (ValueError, WireError(400, "INVALID_ARGUMENT")),
    # Values the signature cannot check, refused by the model's own ops (an id
    # out of an embedding's range, say).
    (tf.errors.InvalidArgumentError, WireError(400, "INVALID_ARGUMENT")),
    (TypeError, WireError(400, "INVALID_ARGUMENT")),
    # Anything else of the library's once the registry is closed: shutting down.
    (LifecycleError, WireError(503, "UNAVAILABLE")),
)

#: Refusals of load beyond what the server takes: 503 (REST adds ``Retry-After``),
#: not logged as failures, on either transport: a flood of them would fill the log.
OVERLOADED = (ServerBusyError, QueueFullError)

_log = logging.getLogger("lifecycle.server")
T = TypeVar("T")

# Lines of a TensorFlow op error that say where the op was, not what went wrong.
_OP_TRACE_LINES = ("Detected at node", "<stack traces unavailable>", " ", "\t")


def error_status(error: BaseException) -> WireError:
    """The wire status of ``error``: its row of :data:`ERRORS`, else 500 INTERNAL."""
    for kind, wire in ERRORS:
        if isinstance(error, kind):
            return wire
    return WireError(500, "INTERNAL")


def grpc_answered(method: Callable[..., T]) -> Callable[..., T]:
    """A gRPC method (its last argument the call's context) whose errors abort the call.

    The call ends with the code of the error's row of :data:`ERRORS` and its
    :func:`wire_message`. An error of status 500 or more is logged with its
    traceback, naming the method, as the REST app logs it (but an
    :data:`OVERLOADED` refusal).
    """

    @functools.wraps(method)
    def answered(*args: Any) -> T:
        try:
            return method(*args)
        except Exception as error:
            wire = error_status(error)
            if wire.status >= 500 and not isinstance(error, OVERLOADED):
                _log.error("gRPC %s failed", method.__name__, exc_info=error)
            code, message = wire.grpc_code, wire_message(error)
        args[-1].abort(code, message)  # raises: the call ends here
        raise AssertionError("unreachable")  # pragma: no cover

    return answered


def wire_message(error: BaseException) -> str:
    """The message an error answer carries: the error's own words, without traces.

    A TensorFlow op error raised in a traced function ends with its own words,
    after where the op was defined (its first line that is not that); a
    ``LookupError``'s is its argument, not ``str()``'s quoted repr.
    """
    if isinstance(error, tf.errors.OpError):
        # A function restored from a SavedModel has no stack traces: its words
        # follow "<stack traces unavailable>" in the same paragraph.
        lines = error.message.strip().split("\n\n")[-1].splitlines()
        words = [line for line in lines if not line.startswith(_OP_TRACE_LINES)]
        return (words or lines or [error.message])[0]
    if error.args and isinstance(error.args[0], str):
        return error.args[0]
    return str(error) or type(error).__name__
