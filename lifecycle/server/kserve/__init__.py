"""KServe's v2 protocol (the Open Inference Protocol): its REST API, its gRPC service, codecs.

``_rest`` (the ``/v2`` routes, JSON and binary tensors) and ``_grpc``
(``inference.GRPCInferenceService``) read and write tensors with ``_tensors``; the gRPC
messages come from ``_open_inference``, compiled from ``open_inference.proto`` beside it.
Private: the server's public names are exported by :mod:`lifecycle.server`.
"""
