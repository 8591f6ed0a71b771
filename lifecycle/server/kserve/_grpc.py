"""KServe's v2 gRPC API (the Open Inference Protocol's ``inference.GRPCInferenceService``).

::

    ServerLive, ServerReady, ServerMetadata        the server
    ModelReady, ModelMetadata                      a model, or a version of it
    ModelInfer                                     tensors in and out
    RepositoryIndex                                the model repository extension
    RepositoryModelLoad, RepositoryModelUnload     (admin calls)

What ``tritonclient.grpc`` speaks. The messages come from
``open_inference.proto`` (see ``_open_inference``); each method runs the
protocol's step that the REST face runs too (``_rest``) and answers its fields.
``ModelInfer`` takes inputs as ``raw_input_contents`` (tritonclient's default)
or typed ``contents``, and answers every output in ``raw_output_contents``, as
Triton does: that is what tritonclient's ``InferResult.as_numpy`` reads for
every datatype. A request resolves its version once and decodes against that
version's signature (``_rest.infer``). Errors abort the call with the code of
their row in :data:`~lifecycle.server._errors.ERRORS`; the admin calls'
credentials are checked before a method runs, by the server's interceptor
(``_auth``). Other methods of the service (streaming, statistics, shared
memory, trace and log settings, model configuration) answer ``UNIMPLEMENTED``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import grpc

from .._auth import grpc_sticky_key
from .._errors import BadRequestError, grpc_answered
from .._service import ModelService
from ._open_inference import SERVICE, methods
from ._rest import infer, model_metadata, model_ready, repository_index, server_metadata
from ._tensors import from_contents, from_raw, to_raw

__all__ = ["add_inference_service"]


def add_inference_service(server: grpc.Server, service: ModelService) -> None:
    """Serve ``inference.GRPCInferenceService`` over ``service`` on ``server``.

    Args:
        server: A gRPC server not yet started (``build_grpc_server``'s).
        service: The server's models and configuration, shared with the other adapters.
    """
    servicer = _Servicer(service)
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            grpc_answered(_replying(getattr(servicer, name), response)),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        for name, (request, response) in methods().items()
    }
    # The methods served first; the protocol's others are refused with a message.
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, handlers), _Unimplemented(sorted(handlers)))
    )


def _replying(
    method: Callable[[Any, grpc.ServicerContext], dict[str, Any]], response: type
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """``method``, answering its fields as a ``response`` (named as ``method`` in logs)."""

    @functools.wraps(method)
    def reply(request: Any, context: grpc.ServicerContext) -> Any:
        return response(**method(request, context))

    return reply


class _Unimplemented(grpc.GenericRpcHandler):
    """The protocol's methods not served: ``UNIMPLEMENTED``, naming those that are."""

    def __init__(self, served: list[str]) -> None:
        self._served = ", ".join(served)

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method  # type: ignore[attr-defined]
        if not method.startswith(f"/{SERVICE}/"):
            return None  # not this service's: gRPC answers UNIMPLEMENTED
        message = f"{method[1:]} is not served by this server; it serves {self._served}."

        def unimplemented(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

        if method.endswith("/ModelStreamInfer"):  # a stream both ways: the client waits for one
            return grpc.stream_stream_rpc_method_handler(unimplemented)
        return grpc.unary_unary_rpc_method_handler(unimplemented)


class _Servicer:
    """The methods of ``inference.GRPCInferenceService``, each answering its response's fields."""

    def __init__(self, service: ModelService) -> None:
        self._service = service

    def ServerLive(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        return {"live": True}

    def ServerReady(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        return {"ready": self._service.ready}

    def ServerMetadata(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        return server_metadata()

    def ModelReady(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        version = _version(request.version)
        return {"ready": model_ready(self._service, _name(request.name), version)}

    def ModelMetadata(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        return model_metadata(self._service, _name(request.name), _version(request.version))

    def RepositoryIndex(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        return {"models": repository_index(self._service, request.ready)}

    def RepositoryModelLoad(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        self._service.load(_name(request.model_name))
        return {}

    def RepositoryModelUnload(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        self._service.unload(_name(request.model_name))
        return {}

    def ModelInfer(self, request: Any, context: grpc.ServicerContext) -> dict[str, Any]:
        """Raw or typed contents in, every output in ``raw_output_contents``."""
        name, version = _name(request.model_name), _version(request.model_version)
        raw = list(request.raw_input_contents)
        if raw and len(raw) != len(request.inputs):
            raise BadRequestError(
                f"The request has {len(request.inputs)} inputs but {len(raw)} "
                "raw_input_contents: send one per input, in the order of 'inputs', or none."
            )
        inputs = []
        for index, tensor in enumerate(request.inputs):
            shape = list(tensor.shape)
            if not raw:
                inputs.append((tensor.name, tensor.datatype, shape, from_contents, tensor.contents))
                continue
            if tensor.HasField("contents"):
                raise BadRequestError(
                    f"Input {tensor.name!r} has 'contents' in a request with "
                    "raw_input_contents: send every input one way."
                )
            inputs.append((tensor.name, tensor.datatype, shape, from_raw, raw[index]))
        requested = [output.name for output in request.outputs] or None
        key = grpc_sticky_key(context, self._service.config)
        answer, arrays = infer(self._service, name, version, key, inputs, requested)
        return {
            **answer,
            "id": request.id,
            "raw_output_contents": [to_raw(array) for array in arrays],
        }


def _version(version: str) -> int | None:
    """A request's ``version`` string: empty for the default version."""
    if not version:
        return None
    if not version.isdigit():
        raise BadRequestError(f"A model version must be a number. Received: {version!r}")
    return int(version)


def _name(name: str) -> str:
    if not name:
        raise BadRequestError("The request names no model.")
    return name
