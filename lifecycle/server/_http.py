"""What both REST adapters share: JSON bodies (orjson) under a size limit, answers, threads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ._errors import BadRequestError, PayloadTooLargeError

__all__ = ["blocking", "json_response", "read_json"]

T = TypeVar("T")


async def read_json(request: Request, limit: int, *, empty: Any = None) -> Any:
    """The request's JSON body, read no further than ``limit`` bytes.

    Args:
        request: The request.
        limit: The most bytes to read.
        empty: What an empty body means; ``None``: an empty body is not JSON.

    Raises:
        PayloadTooLargeError: The body (declared or read) is over ``limit``.
        BadRequestError: The body is not JSON.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(
            f"The request body has {declared} bytes; this server takes at most {limit}."
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLargeError(
                f"The request body is over {limit} bytes, the most this server takes."
            )
    if not body and empty is not None:
        return empty
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequestError(f"The request body is not valid JSON: {error}") from None


def json_response(content: Any, status: int = 200) -> Response:
    """``content`` as a JSON response; NumPy arrays serialise as nested lists."""
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
    )


async def blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (a model, a load) on a worker thread."""
    return await run_in_threadpool(function, *args, **kwargs)
