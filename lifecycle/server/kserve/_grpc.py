"""KServe's v2 gRPC API (the Open Inference Protocol's ``inference.GRPCInferenceService``).

::

    ServerLive, ServerReady, ServerMetadata        the server
    ModelReady, ModelMetadata                      a model, or a version of it
    ModelInfer                                     tensors in and out
    RepositoryIndex                                the model repository extension
    RepositoryModelLoad, RepositoryModelUnload     (admin calls)

What ``tritonclient.grpc`` speaks. The messages come from
``open_inference.proto`` (see ``_open_inference``). ``ModelInfer`` takes inputs
as ``raw_input_contents`` (tritonclient's default) or typed ``contents``, and
answers every output in ``raw_output_contents``, as Triton does: that is what
tritonclient's ``InferResult.as_numpy`` reads for every datatype. A request
resolves its version once (:meth:`ModelRegistry.serving`) and decodes against
that version's signature: each input's name, datatype and declared shape (rank,
known dimensions, ``--max_request_rows``) are checked before its values are
read, and the values must then be exactly those the shape holds. Errors abort
the call with the code of their row in :data:`~lifecycle.server._errors.ERRORS`;
the admin calls' credentials are checked before a method runs, by the server's
interceptor (``_auth``). Other methods of the service (streaming, statistics,
shared memory, trace and log settings, model configuration) answer
``UNIMPLEMENTED``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from .._auth import grpc_sticky_key
from .._errors import BadRequestError, grpc_answer
from .._service import ModelService
from .._shapes import check_shape
from ._open_inference import SERVICE, message, methods
from ._rest import model_metadata, model_ready, repository_index, server_metadata
from ._tensors import check_input, from_contents, from_raw, output_names, to_raw

__all__ = ["add_inference_service"]

_InferResponse = message("ModelInferResponse")


def add_inference_service(server: grpc.Server, service: ModelService) -> None:
    """Serve ``inference.GRPCInferenceService`` over ``service`` on ``server``.

    Args:
        server: A gRPC server not yet started (``build_grpc_server``'s).
        service: The server's models and configuration, shared with the other adapters.
    """
    server.add_generic_rpc_handlers((_Handler(_InferenceService(service)),))


class _Handler(grpc.GenericRpcHandler):
    """The service's methods by name; ``UNIMPLEMENTED`` for the others of the protocol."""

    def __init__(self, servicer: _InferenceService) -> None:
        self._handlers = {
            f"/{SERVICE}/{name}": grpc.unary_unary_rpc_method_handler(
                getattr(servicer, name),
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )
            for name, (request, response) in methods().items()
        }

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method  # type: ignore[attr-defined]
        handler = self._handlers.get(method)
        if handler is not None or not method.startswith(f"/{SERVICE}/"):
            return handler  # None: not this service's (gRPC answers UNIMPLEMENTED)
        name = method.rsplit("/", 1)[-1]
        served = ", ".join(sorted(m.rsplit("/", 1)[-1] for m in self._handlers))

        def unimplemented(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{SERVICE}/{name} is not served by this server; it serves {served}.",
            )

        if name == "ModelStreamInfer":  # a stream both ways: the client waits for a stream
            return grpc.stream_stream_rpc_method_handler(unimplemented)
        return grpc.unary_unary_rpc_method_handler(unimplemented)


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


class _InferenceService:
    """The methods of ``inference.GRPCInferenceService``, each as its generated servicer's."""

    def __init__(self, service: ModelService) -> None:
        self._service = service
        self._messages = methods()

    def _response(self, method: str, **fields: Any) -> Any:
        return self._messages[method][1](**fields)

    def ServerLive(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._response("ServerLive", live=True)

    def ServerReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._response("ServerReady", ready=self._service.ready)

    def ServerMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._response("ServerMetadata", **server_metadata())

    def ModelReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        return grpc_answer(
            context,
            "ModelReady",
            lambda: self._response(
                "ModelReady",
                ready=model_ready(self._service, _name(request.name), _version(request.version)),
            ),
        )

    def ModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        return grpc_answer(
            context,
            "ModelMetadata",
            lambda: self._response(
                "ModelMetadata",
                **model_metadata(self._service, _name(request.name), _version(request.version)),
            ),
        )

    def ModelInfer(self, request: Any, context: grpc.ServicerContext) -> Any:
        key = grpc_sticky_key(context, self._service.config)
        return grpc_answer(context, "ModelInfer", lambda: self._infer(request, key))

    def _infer(self, request: Any, key: str | None) -> Any:
        name, version = _name(request.model_name), _version(request.model_version)
        raw = list(request.raw_input_contents)
        if raw and len(raw) != len(request.inputs):
            raise BadRequestError(
                f"The request has {len(request.inputs)} inputs but {len(raw)} "
                "raw_input_contents: send one per input, in the order of 'inputs', or none."
            )
        requested = [output.name for output in request.outputs] or None
        max_rows = self._service.config.max_request_rows
        with self._service.registry.serving(name, version=version, key=key) as lease:
            inputs: dict[str, Any] = {}
            for index, tensor in enumerate(request.inputs):
                spec = check_input(lease.signature, tensor.name, tensor.datatype, inputs)
                # The declared shape alone, before any value is read.
                check_shape(spec.name, tensor.shape, spec, max_rows)
                shape = list(tensor.shape)
                if raw:
                    if tensor.HasField("contents"):
                        raise BadRequestError(
                            f"Input {spec.name!r} has 'contents' in a request with "
                            "raw_input_contents: send every input one way."
                        )
                    inputs[spec.name] = from_raw(spec.name, tensor.datatype, shape, raw[index])
                else:
                    inputs[spec.name] = from_contents(
                        spec.name, tensor.datatype, shape, tensor.contents
                    )
            names = output_names(requested, [spec.name for spec in lease.signature.outputs])
            result = lease.infer(inputs)
        response = _InferResponse(model_name=name, model_version=str(result.version), id=request.id)
        for output in names:
            array = result.outputs[output]
            datatype, data = to_raw(array)
            response.outputs.add(name=output, datatype=datatype, shape=list(array.shape))
            response.raw_output_contents.append(data)
        return response

    def RepositoryIndex(self, request: Any, context: grpc.ServicerContext) -> Any:
        return grpc_answer(
            context,
            "RepositoryIndex",
            lambda: self._response(
                "RepositoryIndex", models=repository_index(self._service, request.ready)
            ),
        )

    def RepositoryModelLoad(self, request: Any, context: grpc.ServicerContext) -> Any:
        return grpc_answer(
            context,
            "RepositoryModelLoad",
            lambda: self._repository(self._service.load, "RepositoryModelLoad", request),
        )

    def RepositoryModelUnload(self, request: Any, context: grpc.ServicerContext) -> Any:
        return grpc_answer(
            context,
            "RepositoryModelUnload",
            lambda: self._repository(self._service.unload, "RepositoryModelUnload", request),
        )

    def _repository(self, call: Callable[[str], None], method: str, request: Any) -> Any:
        call(_name(request.model_name))
        return self._response(method)
