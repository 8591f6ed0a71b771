"""TensorFlow Serving's gRPC API over the model service.

::

    tensorflow.serving.PredictionService/Predict           inputs -> outputs
    tensorflow.serving.PredictionService/GetModelMetadata  signature_def (every signature)
    tensorflow.serving.PredictionService/Classify          tf.Examples -> classes, scores
    tensorflow.serving.PredictionService/Regress           tf.Examples -> values
    tensorflow.serving.ModelService/GetModelStatus         version states
    tensorflow.serving.ModelService/HandleReloadConfigRequest
                                                           a new ModelServerConfig

The messages are TensorFlow Serving's own, through the generated code of
``tensorflow-serving-api``. Input tensors are decoded by ``_tensorproto``, inside
the request's lease: the model, the signature and every input's name, rank, known
dimensions and rows are checked first, and the values must be exactly those the
shape holds (``tf.make_ndarray`` would pad them to any shape the request names).
Answers are made by ``tf.make_tensor_proto``. Errors abort the call with the
canonical code of their row in :data:`~lifecycle.server._errors.ERRORS`. Every
signature of a version is served (``model_spec.signature_name``); ``Classify``
and ``Regress`` run signatures of those methods on ``tf.Example`` inputs
(``_examples``), expanded with their context only once the signature is known
to take them and their size is within ``--max_request_bytes``;
``MultiInference`` answers ``UNIMPLEMENTED`` without reading its input.
"""

from __future__ import annotations

import functools
import reprlib
from typing import Any

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from ..._tf import SERVING_SIGNATURE
from .._auth import grpc_sticky_key
from .._config import served_models
from .._errors import BadRequestError, grpc_answered
from .._service import ModelService
from ._examples import (
    CLASSIFY,
    REGRESS,
    classifications,
    examples_from_input,
    regressions,
    serve_examples,
)
from ._rest import metadata, status_response
from ._tensorproto import decode_tensor_proto

__all__ = ["add_tfserving_services"]


def add_tfserving_services(server: grpc.Server, service: ModelService) -> None:
    """Serve ``tensorflow.serving.PredictionService`` and ``ModelService`` on ``server``.

    Args:
        server: A gRPC server not yet started (``build_grpc_server``'s).
        service: The server's models and configuration, shared with the other adapters.
    """
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        _PredictionService(service), server
    )
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelService(service), server)


def _model(spec: model_pb2.ModelSpec) -> tuple[str, int | None, str | None]:
    """``(name, version, label)`` of a request's ``model_spec``."""
    if not spec.name:
        raise BadRequestError("The request's model_spec has no name.")
    which = spec.WhichOneof("version_choice")
    version = spec.version.value if which == "version" else None
    label = spec.version_label if which == "version_label" else None
    return spec.name, version, label


class _Servicer:
    """What both services hold: the server's models and configuration."""

    def __init__(self, service: ModelService) -> None:
        self._service = service


class _PredictionService(_Servicer, prediction_service_pb2_grpc.PredictionServiceServicer):
    """``tensorflow.serving.PredictionService``: Predict, GetModelMetadata, Classify, Regress."""

    @grpc_answered
    def Predict(
        self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext
    ) -> predict_pb2.PredictResponse:
        name, version, label = _model(request.model_spec)
        signature_name = request.model_spec.signature_name or None
        wanted = list(request.output_filter)
        max_rows = self._service.config.max_request_rows
        key = grpc_sticky_key(context, self._service.config)
        # The model, signature and input names are resolved before any value is
        # read, and each input's header before its values: a request is refused
        # before it costs more memory than its own bytes.
        with self._service.registry.serving(name, version=version, label=label, key=key) as lease:
            signature = lease.signature_named(signature_name)
            outputs = [spec.name for spec in signature.outputs]
            unknown = [output for output in wanted if output not in outputs]
            if unknown:
                raise BadRequestError(
                    f"output_filter names {reprlib.repr(unknown)}, which the signature does "
                    f"not have. Outputs: {outputs}"
                )
            signature.check_names(request.inputs)
            inputs = {
                key: decode_tensor_proto(key, proto, spec=signature.input(key), max_rows=max_rows)
                for key, proto in request.inputs.items()
            }
            result = lease.infer(inputs, signature_name)
        response = predict_pb2.PredictResponse()
        _answer_spec(response.model_spec, request.model_spec, result.version)
        for key in wanted or result.outputs:
            response.outputs[key].CopyFrom(tf.make_tensor_proto(result.outputs[key]))
        return response

    @grpc_answered
    def GetModelMetadata(
        self,
        request: get_model_metadata_pb2.GetModelMetadataRequest,
        context: grpc.ServicerContext,
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        model = _model(request.model_spec)
        fields = list(request.metadata_field)
        if not fields:
            raise BadRequestError(
                "GetModelMetadataRequest must name at least one metadata_field: 'signature_def'."
            )
        other = sorted(set(fields) - {"signature_def"})
        if other:
            raise BadRequestError(
                f"Metadata fields {other} are not supported; the only one is 'signature_def'."
            )
        spec, signatures = metadata(self._service, *model)
        response = get_model_metadata_pb2.GetModelMetadataResponse(model_spec=spec)
        response.metadata["signature_def"].Pack(signatures)
        return response

    @grpc_answered
    def Classify(
        self, request: classification_pb2.ClassificationRequest, context: grpc.ServicerContext
    ) -> classification_pb2.ClassificationResponse:
        response = classification_pb2.ClassificationResponse()
        for row in classifications(self._examples(request, context, CLASSIFY, response)):
            classes = response.result.classifications.add()
            for label, score in row:
                classes.classes.add(label=label, score=score)
        return response

    @grpc_answered
    def Regress(
        self, request: regression_pb2.RegressionRequest, context: grpc.ServicerContext
    ) -> regression_pb2.RegressionResponse:
        response = regression_pb2.RegressionResponse()
        for value in regressions(self._examples(request, context, REGRESS, response)):
            response.result.regressions.add(value=value)
        return response

    def _examples(
        self, request: Any, context: grpc.ServicerContext, verb: str, response: Any
    ) -> dict[str, Any]:
        """Run a Classify or Regress request's examples; its ``response``'s ``model_spec`` set.

        The examples are expanded with their context only once the signature is
        known to be of ``verb``'s method, and only if they fit ``--max_request_rows``
        and ``--max_request_bytes`` (``serve_examples``, ``examples_from_input``).
        """
        version, outputs = serve_examples(
            self._service,
            _model(request.model_spec),
            request.model_spec.signature_name or None,
            verb,
            grpc_sticky_key(context, self._service.config),
            functools.partial(examples_from_input, request.input),
        )
        _answer_spec(response.model_spec, request.model_spec, version)
        return outputs

    def MultiInference(self, request: Any, context: grpc.ServicerContext) -> Any:
        # Its input is never read: no example is expanded for a call that is refused.
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "MultiInference is not served: send each task as its own Classify or Regress.",
        )


def _answer_spec(spec: model_pb2.ModelSpec, asked: model_pb2.ModelSpec, version: int) -> None:
    """Fill an answer's ``model_spec``: the model, the version that served, the signature."""
    spec.name = asked.name
    spec.version.value = version
    spec.signature_name = asked.signature_name or SERVING_SIGNATURE


class _ModelService(_Servicer, model_service_pb2_grpc.ModelServiceServicer):
    """``tensorflow.serving.ModelService``: GetModelStatus and HandleReloadConfigRequest."""

    @grpc_answered
    def GetModelStatus(
        self,
        request: get_model_status_pb2.GetModelStatusRequest,
        context: grpc.ServicerContext,
    ) -> get_model_status_pb2.GetModelStatusResponse:
        return status_response(self._service.versions(*_model(request.model_spec)))

    @grpc_answered
    def HandleReloadConfigRequest(
        self,
        request: model_management_pb2.ReloadConfigRequest,
        context: grpc.ServicerContext,
    ) -> model_management_pb2.ReloadConfigResponse:
        try:
            models = served_models(request.config, "ReloadConfigRequest")
        except FileNotFoundError as error:  # the client's mistake, not the server's
            raise BadRequestError(str(error)) from None
        self._service.reload(models)
        return model_management_pb2.ReloadConfigResponse()
