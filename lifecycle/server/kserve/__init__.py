"""KServe's v2 protocol (the Open Inference Protocol): its REST API, its gRPC service, codecs.

``_rest`` (the ``/v2`` routes, JSON and binary tensors) holds the protocol's steps
(metadata, readiness, the repository index, ``infer``) once, and ``_grpc``
(``inference.GRPCInferenceService``) calls the same steps; both read and write tensors
with ``_tensors``. The gRPC messages come from ``_open_inference``, compiled from
``open_inference.proto`` beside it. Private: the server's public names are exported by
:mod:`lifecycle.server`.
"""
