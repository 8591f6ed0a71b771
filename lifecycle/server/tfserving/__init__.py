"""TensorFlow Serving's protocol: its REST API, its gRPC services and their codecs.

``_rest`` (the ``/v1/models`` routes) and ``_grpc`` (``PredictionService``,
``ModelService``) read requests with ``_tensorproto`` (a ``TensorProto`` as an array)
and ``_examples`` (``tf.Example`` inputs of Classify and Regress). Private: the
server's public names are exported by :mod:`lifecycle.server`.
"""
