"""What a request carries besides its body: admin credentials, and its sticky routing key.

Every call that changes the server's state — the admin API, KServe's repository
load and unload over REST or gRPC, TensorFlow Serving's
``HandleReloadConfigRequest`` — passes the one check of :func:`authorize`,
whatever its transport: HTTP routes call :func:`authorize_http` with the
request's ``Authorization`` header; the gRPC server runs
:class:`AdminInterceptor` over every method of :data:`ADMIN_METHODS`, with the
``authorization`` metadata. Both carry ``Bearer <token>``.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc
from starlette.requests import Request

from ._config import ServerConfig
from ._errors import AdminDisabledError, UnauthorizedError, error_status, wire_message

__all__ = [
    "ADMIN_METHODS",
    "AdminInterceptor",
    "authorize",
    "authorize_http",
    "grpc_sticky_key",
    "http_sticky_key",
]

#: The gRPC methods that change what the server serves: admin calls.
ADMIN_METHODS = frozenset(
    {
        "/tensorflow.serving.ModelService/HandleReloadConfigRequest",
        "/inference.GRPCInferenceService/RepositoryModelLoad",
        "/inference.GRPCInferenceService/RepositoryModelUnload",
    }
)


def authorize(config: ServerConfig, authorization: str | None, action: str) -> None:
    """Let an admin call through, or raise: the one check of every transport.

    Args:
        config: The server's configuration (``admin_api``, ``admin_token``).
        authorization: The call's credentials, ``"Bearer <token>"`` (the HTTP
            ``Authorization`` header or the gRPC ``authorization`` metadata);
            ``None`` when it has none.
        action: What the call does, for the message (``"POST /v1/admin/..."``).

    Raises:
        AdminDisabledError: The server runs with ``--no_admin_api``.
        UnauthorizedError: The server has a token and the call does not carry it.
    """
    if not config.admin_api:
        raise AdminDisabledError(
            f"The admin API is turned off on this server (--no_admin_api): {action} is refused."
        )
    if config.admin_token is None:
        return  # bound to loopback: ServerConfig refuses anything else without a token
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthorizedError(
            f"{action} is an admin call: it needs 'Authorization: Bearer <token>' (an HTTP "
            "header, or gRPC metadata), with the server's --admin_token."
        )
    if not hmac.compare_digest(token.strip().encode(), config.admin_token.encode()):
        raise UnauthorizedError("The bearer token is not the server's --admin_token.")


def authorize_http(request: Request, config: ServerConfig) -> None:
    """:func:`authorize` an HTTP request by its ``Authorization`` header.

    Raises:
        AdminDisabledError, UnauthorizedError: As :func:`authorize`.
    """
    authorize(config, request.headers.get("authorization"), f"{request.method} {request.url.path}")


def http_sticky_key(request: Request, config: ServerConfig) -> str | None:
    """The request's sticky routing key: its ``sticky_key_header``, if not empty."""
    return request.headers.get(config.sticky_key_header) or None


def grpc_sticky_key(context: grpc.ServicerContext, config: ServerConfig) -> str | None:
    """A gRPC call's sticky routing key: the metadata named as ``sticky_key_header``."""
    wanted = config.sticky_key_header.lower()  # gRPC metadata keys are lower case
    for key, value in context.invocation_metadata() or ():
        if key == wanted and value:
            return value if isinstance(value, str) else None
    return None


class AdminInterceptor(grpc.ServerInterceptor):
    """Runs :func:`authorize` before every gRPC method of :data:`ADMIN_METHODS`.

    A refused call ends with the code of its error's row in the server's one
    error table (``UNAUTHENTICATED``, ``PERMISSION_DENIED``) before the
    method runs or its request is read.

    Args:
        config: The server's configuration.
    """

    def __init__(self, config: ServerConfig) -> None:
        self._config = config

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method  # type: ignore[attr-defined]
        if method not in ADMIN_METHODS:
            return continuation(handler_call_details)
        metadata = handler_call_details.invocation_metadata or ()  # type: ignore[attr-defined]
        authorization = next((value for key, value in metadata if key == "authorization"), None)
        try:
            authorize(self._config, authorization, f"gRPC {method}")
        except PermissionError as error:
            code, message = error_status(error).grpc_code, wire_message(error)

            def refuse(request: Any, context: grpc.ServicerContext) -> Any:
                context.abort(code, message)

            return grpc.unary_unary_rpc_method_handler(refuse)
        return continuation(handler_call_details)
