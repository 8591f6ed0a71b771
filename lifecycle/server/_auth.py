"""What a request carries besides its body: admin credentials, and its sticky routing key.

Every call that changes the server's state — the admin API, KServe's repository
load and unload over REST or gRPC, TensorFlow Serving's
``HandleReloadConfigRequest`` — passes the one check of :func:`authorize`,
whatever its transport: HTTP routes call :func:`authorize_http` with the
request's headers; the gRPC server runs :class:`AdminInterceptor` over every
method of :data:`ADMIN_METHODS`, with the call's metadata.

With a token (``--admin_token``), the token is the authority: a call carries
``Bearer <token>`` (the ``Authorization`` header, or ``authorization``
metadata), and a web page cannot, since it does not know it. Without one, the
server is on loopback and takes admin calls only from programs on the machine
(curl, tritonclient, gRPC stubs), never from a web page, which can reach a
loopback port too. A browser marks what it sends: an ``Origin`` header on every
``POST``, ``PUT`` and ``DELETE`` (``origin`` metadata from gRPC-web), and a
``Host`` of the page's own name when that name was made to resolve to this
machine (DNS rebinding); and the bodies it may send across sites without asking
the server first are forms and ``text/plain``. So a call without a token is
refused (:class:`~._errors.AdminDisabledError`, 403) when it has an ``Origin``, a ``Host``
other than the address served, or a ``Content-Type`` other than JSON. A call
with no ``Content-Type`` passes: tritonclient sends its JSON bodies without one.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from starlette.requests import Request

from ._config import ServerConfig, is_loopback
from ._errors import AdminDisabledError, UnauthorizedError, error_status, wire_message
from ._flags import ADMIN_TOKEN_ENV

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


def authorize(
    config: ServerConfig, headers: Mapping[str, str], action: str, port: int | None = None
) -> None:
    """Let an admin call through, or raise: the one check of every transport.

    Args:
        config: The server's configuration (``admin_api``, ``admin_token``, ``host``).
        headers: What the call carries, by lower-case name: the HTTP headers,
            or the gRPC metadata. ``authorization``: its credentials,
            ``"Bearer <token>"``; ``origin``: only browsers (and gRPC-web
            clients in one) send it; ``host`` and ``content-type``: HTTP's.
        action: What the call does, for the message (``"POST /v1/admin/..."``).
        port: The port the call came in on, which the ``host`` header may name.

    Raises:
        AdminDisabledError: The server runs with ``--no_admin_api``, or has no
            token and the call looks like a web page's: an ``Origin``, a
            foreign ``Host``, a body not JSON.
        UnauthorizedError: The server has a token and the call does not carry it.
    """
    if not config.admin_api:
        raise AdminDisabledError(
            f"The admin API is turned off on this server (--no_admin_api): {action} is refused."
        )
    if config.admin_token is not None:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthorizedError(
                f"{action} is an admin call: it needs 'Authorization: Bearer <token>' (an HTTP "
                "header, or gRPC metadata), with the server's --admin_token."
            )
        if not hmac.compare_digest(token.strip().encode(), config.admin_token.encode()):
            raise UnauthorizedError("The bearer token is not the server's --admin_token.")
        return
    # Bound to loopback (ServerConfig refuses anything else without a token):
    # only a program on this machine may call, not a web page.
    tail = (
        "Without --admin_token this server takes admin calls only from programs on this "
        "machine (curl, tritonclient, gRPC stubs), never from a web page: call it from the "
        f"command line, or set --admin_token (or the {ADMIN_TOKEN_ENV} environment variable) "
        "and send 'Authorization: Bearer <token>'."
    )
    origin, host, content_type = (headers.get(h) for h in ("origin", "host", "content-type"))
    if origin is not None:
        raise AdminDisabledError(
            f"{action} is an admin call and carries an Origin ({origin!r}), which browsers "
            f"send: refused. {tail}"
        )
    served = {_bracketed(config.host).lower()}
    if is_loopback(config.host):  # a loopback server's names (with or without its port)
        served |= {"127.0.0.1", "localhost", "[::1]"}
    if host is not None and not _is_served(host, served, port):
        raise AdminDisabledError(
            f"{action} is an admin call to 'Host: {host}', which is not this server's address "
            f"(one of {sorted(served)}, with or without the port {port}), as a web page "
            "whose name was made to resolve to this machine sends it: refused. Call "
            f"http://{_bracketed(config.host)}:{port}/... instead. {tail}"
        )
    media = (content_type or "").partition(";")[0].strip().lower()  # charset and such aside
    if content_type is not None and media != "application/json":
        raise AdminDisabledError(
            f"{action} is an admin call with a body of Content-Type {content_type!r}, as a web "
            "page's form or fetch() sends across sites: refused. Admin bodies are JSON: send "
            "'Content-Type: application/json' (curl --json, or -H 'Content-Type: "
            f"application/json'). {tail}"
        )


def authorize_http(request: Request, config: ServerConfig) -> None:
    """:func:`authorize` an HTTP request by its headers.

    Raises:
        AdminDisabledError, UnauthorizedError: As :func:`authorize`.
    """
    # (address, port) of the socket it came in on; no port on a Unix socket.
    port = (request.scope.get("server") or (None, None))[1] or config.rest_api_port
    authorize(config, request.headers, f"{request.method} {request.url.path}", port)


def _bracketed(address: str) -> str:
    """``address`` as a URL or ``Host`` header names it: an IPv6 address in brackets."""
    return f"[{address}]" if ":" in address else address


def _is_served(host: str, served: set[str], port: int | None) -> bool:
    """Whether the ``Host`` header ``host`` names one of ``served``, and ``port`` if any."""
    host = host.strip().lower()
    bracket = host.rfind("]")
    name, colon, given = host.rpartition(":") if ":" in host[bracket + 1 :] else (host, "", "")
    if name not in served:
        return False
    return not colon or (given.isascii() and given.isdigit() and int(given) == port)


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
    method runs or its request is read. The ``origin`` metadata counts as an
    HTTP ``Origin``: gRPC-web clients in a browser send it through their proxy.

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
        # Only what a gRPC call may carry: no Host or Content-Type of a web page's.
        carried = {key: value for key, value in metadata if key in ("authorization", "origin")}
        try:
            authorize(self._config, carried, f"gRPC {method}")
        except PermissionError as error:
            code, message = error_status(error).grpc_code, wire_message(error)

            def refuse(request: Any, context: grpc.ServicerContext) -> Any:
                context.abort(code, message)

            return grpc.unary_unary_rpc_method_handler(refuse)
        return continuation(handler_call_details)
