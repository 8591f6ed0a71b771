"""The admin API: swaps, labels and weighted routes at run time, over the registry.

::

    GET    /v1/admin/models/{m}                  versions, default, labels, weights, batching
    POST   /v1/admin/models/{m}/promote          {"version": 2}
    PUT    /v1/admin/models/{m}/labels/{label}   {"version": 2}
    DELETE /v1/admin/models/{m}/labels/{label}
    PUT    /v1/admin/models/{m}/route            {"labels": {"stable": 9, "canary": 1}}
    DELETE /v1/admin/models/{m}/route

Each route makes its change on the registry (``promote``, ``set_label``,
``remove_label``, ``route``), and every answer is the model's versions as
``GET`` gives them (the registry's ``status()``, each field as it is named
there). Every admin call passes the one check of ``_auth`` (as KServe's
repository load and unload and TensorFlow Serving's gRPC reload do): it needs
``Authorization: Bearer <token>`` when the server has an admin token; without
one, the configuration admits admin calls only on a loopback address, and only
as a program sends them, not a web page: no ``Origin``, the served address as
``Host``, a JSON body (``Content-Type: application/json``) or none.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._registry import ModelRegistry, VersionState, VersionStatus
from ._auth import authorize_http
from ._config import ServerConfig
from ._errors import BadRequestError
from ._http import blocking, json_response, read_json

__all__ = ["ADMIN_PATH", "routes"]

ADMIN_PATH = "/v1/admin/models"


def routes(registry: ModelRegistry, config: ServerConfig) -> list[Route]:
    """The admin API's routes over ``registry``."""

    def admin(
        change: Callable[..., None] | None = None, parse: Callable[[Any], Any] | None = None
    ) -> Callable[[Request], Awaitable[Response]]:
        """A route that calls ``change(name, [label,] parse(body))``, then answers the versions.

        Without ``parse`` the request has no body; without ``change`` it only reads.
        """

        async def endpoint(request: Request) -> Response:
            authorize_http(request, config)
            params = request.path_params
            args = [params[key] for key in ("name", "label") if key in params]
            if parse is not None:
                args.append(parse(await read_json(request, config.max_request_bytes)))
            statuses = await blocking(change_and_read, change, args)
            return json_response(_versions_body(args[0], statuses))

        return endpoint

    def change_and_read(
        change: Callable[..., None] | None, args: list[Any]
    ) -> tuple[VersionStatus, ...]:
        if change is not None:
            change(*args)
        return registry.status(args[0])

    model = ADMIN_PATH + "/{name}"
    label = model + "/labels/{label}"
    clear_route = functools.partial(registry.route, weights=None)
    return [
        Route(model, admin(), methods=["GET"]),
        Route(f"{model}/promote", admin(registry.promote, _version), methods=["POST"]),
        Route(label, admin(registry.set_label, _version), methods=["PUT"]),
        Route(label, admin(registry.remove_label), methods=["DELETE"]),
        Route(f"{model}/route", admin(registry.route, _weights), methods=["PUT"]),
        Route(f"{model}/route", admin(clear_route), methods=["DELETE"]),
    ]


def _versions_body(name: str, statuses: tuple[VersionStatus, ...]) -> dict[str, Any]:
    """``statuses`` as JSON: the registry's fields but the name, which is given once."""
    without_name = attrs.filters.exclude(attrs.fields(VersionStatus).name)
    return {
        "name": name,
        "versions": [
            attrs.asdict(s, filter=without_name, value_serializer=_plain) for s in statuses
        ],
    }


def _plain(instance: Any, field: attrs.Attribute[Any] | None, value: Any) -> Any:
    """A status field as JSON writes it: a state by its name, batch sizes under string keys."""
    if isinstance(value, VersionState):
        return value.name
    if field is not None and field.name == "sizes":
        return {str(size): count for size, count in value.items()}
    return value


def _version(body: Any) -> int:
    """``body["version"]``: an int, or a string of digits as TensorFlow Serving writes them."""
    version = body.get("version") if isinstance(body, dict) else None
    if isinstance(version, str) and version.isdigit():
        return int(version)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise BadRequestError(
            f'The request body must be {{"version": <int >= 0>}}. Received: {body!r}'
        )
    return version


def _weights(body: Any) -> dict[str | int, float]:
    """Route weights from ``{"labels": {label: w}, "versions": {"3": w}}``."""
    if not isinstance(body, dict) or not body or not set(body) <= {"labels", "versions"}:
        raise BadRequestError(
            'The request body must be {"labels": {label: weight}, "versions": '
            f"{{version: weight}}}}, with one or both. Received: {body!r}"
        )
    weights: dict[str | int, float] = {}
    for part in ("labels", "versions"):
        given = body.get(part, {})
        if not isinstance(given, dict):
            raise BadRequestError(f"{part!r} must be an object of weights. Received: {given!r}")
        for target, weight in given.items():
            if part == "versions" and not target.isdigit():
                raise BadRequestError(
                    f"'versions' keys must be version numbers. Received: {target!r}"
                )
            weights[int(target) if part == "versions" else target] = weight
    return weights
