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

from .._auth import grpc_sticky_key
from .._config import served_models
from .._errors import BadRequestError, grpc_answer
from .._service import ModelService
from ._examples import (
    CLASSIFY,
    REGRESS,
    classifications,
    examples_from_input,
    regressions,
    run_examples,
)
from ._rest import SIGNATURE, signature_def_map, status_response
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


def _spec(spec: model_pb2.ModelSpec) -> tuple[str, int | None, str | None]:
    """``(name, version, label)`` of a request's ``model_spec``."""
    if not spec.name:
        raise BadRequestError("The request's model_spec has no name.")
    which = spec.WhichOneof("version_choice")
    if which == "version":
        return spec.name, spec.version.value, None
    if which == "version_label":
        return spec.name, None, spec.version_label
    return spec.name, None, None


class _PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``tensorflow.serving.PredictionService``: Predict and GetModelMetadata."""

    def __init__(self, service: ModelService) -> None:
        self._service = service

    def Predict(
        self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext
    ) -> predict_pb2.PredictResponse:
        key = grpc_sticky_key(context, self._service.config)
        return grpc_answer(context, "Predict", lambda: self._predict(request, key))

    def _predict(
        self, request: predict_pb2.PredictRequest, key: str | None
    ) -> predict_pb2.PredictResponse:
        name, version, label = _spec(request.model_spec)
        signature_name = request.model_spec.signature_name or None
        wanted = list(request.output_filter)
        max_rows = self._service.config.max_request_rows
        # The model, signature and input names are resolved before any value is
        # read, and each input's header before its values: a request is refused
        # before it costs more memory than its own bytes.
        with self._service.registry.serving(name, version=version, label=label, key=key) as lease:
            signature = lease.signature_named(signature_name)
            _check_outputs(wanted, [spec.name for spec in signature.outputs])
            _check_inputs(list(request.inputs), [spec.name for spec in signature.inputs])
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

    def GetModelMetadata(
        self,
        request: get_model_metadata_pb2.GetModelMetadataRequest,
        context: grpc.ServicerContext,
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        return grpc_answer(context, "GetModelMetadata", lambda: self._metadata(request))

    def _metadata(
        self, request: get_model_metadata_pb2.GetModelMetadataRequest
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        name, version, label = _spec(request.model_spec)
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
        served, signatures = self._service.registry.peek(name, version=version, label=label)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = name
        response.model_spec.version.value = served
        response.metadata["signature_def"].Pack(signature_def_map(signatures))
        return response

    def Classify(
        self, request: classification_pb2.ClassificationRequest, context: grpc.ServicerContext
    ) -> classification_pb2.ClassificationResponse:
        key = grpc_sticky_key(context, self._service.config)
        return grpc_answer(context, "Classify", lambda: self._classify(request, key))

    def _classify(
        self, request: classification_pb2.ClassificationRequest, key: str | None
    ) -> classification_pb2.ClassificationResponse:
        version, outputs = self._examples(request, CLASSIFY, key)
        response = classification_pb2.ClassificationResponse()
        _answer_spec(response.model_spec, request.model_spec, version)
        for row in classifications(outputs):
            classes = response.result.classifications.add()
            for label, score in row:
                classes.classes.add(label=label, score=score)
        return response

    def Regress(
        self, request: regression_pb2.RegressionRequest, context: grpc.ServicerContext
    ) -> regression_pb2.RegressionResponse:
        key = grpc_sticky_key(context, self._service.config)
        return grpc_answer(context, "Regress", lambda: self._regress(request, key))

    def _regress(
        self, request: regression_pb2.RegressionRequest, key: str | None
    ) -> regression_pb2.RegressionResponse:
        version, outputs = self._examples(request, REGRESS, key)
        response = regression_pb2.RegressionResponse()
        _answer_spec(response.model_spec, request.model_spec, version)
        for value in regressions(outputs):
            response.result.regressions.add(value=value)
        return response

    def _examples(self, request: Any, verb: str, key: str | None) -> tuple[int, dict[str, Any]]:
        """Run a Classify or Regress request's examples: ``(version, outputs)``.

        The examples are expanded with their context only once the signature is
        known to be of ``verb``'s method, and only if they fit ``--max_request_rows``
        and ``--max_request_bytes`` (``run_examples``, ``examples_from_input``).
        """
        name, version, label = _spec(request.model_spec)
        config = self._service.config
        with self._service.registry.serving(name, version=version, label=label, key=key) as lease:
            signature_name = request.model_spec.signature_name or None
            outputs = run_examples(
                lease,
                signature_name,
                verb,
                lambda: examples_from_input(
                    request.input,
                    max_rows=config.max_request_rows,
                    max_bytes=config.max_request_bytes,
                ),
            )
            return lease.version, outputs

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
    spec.signature_name = asked.signature_name or SIGNATURE


def _check_inputs(given: list[str], inputs: list[str]) -> None:
    """Refuse a request whose inputs are not the signature's, before reading any of them."""
    unknown = sorted(set(given) - set(inputs))
    missing = [name for name in inputs if name not in given]
    if unknown or missing:
        raise BadRequestError(
            f"The request's inputs {_listed(sorted(given))} do not match the model's inputs "
            f"{inputs}: missing {missing}, unknown {_listed(unknown)}."
        )


def _listed(names: list[str], most: int = 10) -> str:
    """A request's names for a message: the first few, each cut short (a request may send many)."""
    shown = [name if len(name) <= 64 else f"{name[:61]}..." for name in names[:most]]
    return f"{shown}" + (f" and {len(names) - most} more" if len(names) > most else "")


def _check_outputs(wanted: list[str], outputs: list[str]) -> None:
    unknown = [key for key in wanted if key not in outputs]
    if unknown:
        raise BadRequestError(
            f"output_filter names {_listed(unknown)}, which the signature does not have. "
            f"Outputs: {outputs}"
        )


class _ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """``tensorflow.serving.ModelService``: GetModelStatus and HandleReloadConfigRequest."""

    def __init__(self, service: ModelService) -> None:
        self._service = service

    def GetModelStatus(
        self,
        request: get_model_status_pb2.GetModelStatusRequest,
        context: grpc.ServicerContext,
    ) -> get_model_status_pb2.GetModelStatusResponse:
        return grpc_answer(
            context,
            "GetModelStatus",
            lambda: status_response(self._service.versions(*_spec(request.model_spec))),
        )

    def HandleReloadConfigRequest(
        self,
        request: model_management_pb2.ReloadConfigRequest,
        context: grpc.ServicerContext,
    ) -> model_management_pb2.ReloadConfigResponse:
        return grpc_answer(context, "HandleReloadConfigRequest", lambda: self._reload(request))

    def _reload(
        self, request: model_management_pb2.ReloadConfigRequest
    ) -> model_management_pb2.ReloadConfigResponse:
        try:
            models = served_models(request.config, "ReloadConfigRequest")
        except FileNotFoundError as error:  # the client's mistake, not the server's
            raise BadRequestError(str(error)) from None
        self._service.reload(models)
        return model_management_pb2.ReloadConfigResponse()
