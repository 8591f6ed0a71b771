"""The admin API: swaps, labels and weighted routes at run time, over the model service.

::

    GET    /v1/admin/models/{m}                  versions, default, labels, weights, batching
    POST   /v1/admin/models/{m}/promote          {"version": 2}
    PUT    /v1/admin/models/{m}/labels/{label}   {"version": 2}
    DELETE /v1/admin/models/{m}/labels/{label}
    PUT    /v1/admin/models/{m}/route            {"labels": {"stable": 9, "canary": 1}}
    DELETE /v1/admin/models/{m}/route

Every answer is the model's versions as ``GET`` gives them (the registry's
``status()``). Every admin call passes the one check of ``_auth`` (as KServe's
repository load and unload and TensorFlow Serving's gRPC reload do): it needs
``Authorization: Bearer <token>`` when the server has an admin token; without
one, the configuration admits admin calls only on a loopback address, and only
as a program sends them, not a web page: no ``Origin``, the served address as
``Host``, a JSON body (``Content-Type: application/json``) or none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._registry import VersionStatus
from ._auth import authorize_http
from ._config import ServerConfig
from ._errors import BadRequestError
from ._http import blocking, json_response, read_json
from ._service import ModelService

__all__ = ["ADMIN_PATH", "routes"]

ADMIN_PATH = "/v1/admin/models"


def routes(service: ModelService, config: ServerConfig) -> list[Route]:
    """The admin API's routes."""
    limit = config.max_request_bytes

    def admin(
        call: Callable[[Request, Any], tuple[VersionStatus, ...]], *, body: bool = False
    ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            authorize_http(request, config)
            content = await read_json(request, limit) if body else None
            statuses = await blocking(call, request, content)
            return json_response(_versions_body(request.path_params["name"], statuses))

        return endpoint

    def status(request: Request, _: Any) -> tuple[VersionStatus, ...]:
        return service.versions(request.path_params["name"])

    def promote(request: Request, body: Any) -> tuple[VersionStatus, ...]:
        return service.promote(request.path_params["name"], _version(body))

    def set_label(request: Request, body: Any) -> tuple[VersionStatus, ...]:
        params = request.path_params
        return service.set_label(params["name"], params["label"], _version(body))

    def remove_label(request: Request, _: Any) -> tuple[VersionStatus, ...]:
        return service.remove_label(request.path_params["name"], request.path_params["label"])

    def set_route(request: Request, body: Any) -> tuple[VersionStatus, ...]:
        return service.route(request.path_params["name"], _weights(body))

    def clear_route(request: Request, _: Any) -> tuple[VersionStatus, ...]:
        return service.route(request.path_params["name"], None)

    model = ADMIN_PATH + "/{name}"
    return [
        Route(model, admin(status), methods=["GET"]),
        Route(f"{model}/promote", admin(promote, body=True), methods=["POST"]),
        Route(f"{model}/labels/{{label}}", admin(set_label, body=True), methods=["PUT"]),
        Route(f"{model}/labels/{{label}}", admin(remove_label), methods=["DELETE"]),
        Route(f"{model}/route", admin(set_route, body=True), methods=["PUT"]),
        Route(f"{model}/route", admin(clear_route), methods=["DELETE"]),
    ]


def _versions_body(name: str, statuses: tuple[VersionStatus, ...]) -> dict[str, Any]:
    return {
        "name": name,
        "versions": [
            {
                "version": s.version,
                "state": s.state.name,
                "default": s.default,
                "labels": list(s.labels),
                "weight": s.weight,
                "leases": s.leases,
                "requests": s.requests,
                "bytes": s.bytes,
                "load_seconds": s.load_seconds,
                "batching": None
                if s.batching is None
                else {
                    "batches": s.batching.batches,
                    "requests": s.batching.requests,
                    "rows": s.batching.rows,
                    "padded_rows": s.batching.padded_rows,
                    "queue_seconds": s.batching.queue_seconds,
                    "retried": s.batching.retried,
                    "rejected": s.batching.rejected,
                    "sizes": {str(k): v for k, v in s.batching.sizes.items()},
                },
            }
            for s in statuses
        ],
    }


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
            if part == "versions":
                if not target.isdigit():
                    raise BadRequestError(
                        f"'versions' keys must be version numbers. Received: {target!r}"
                    )
                weights[int(target)] = weight
            else:
                weights[target] = weight
    return weights
