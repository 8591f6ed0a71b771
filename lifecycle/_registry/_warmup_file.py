"""TensorFlow Serving's warm-up file: recorded requests replayed before a version serves.

A SavedModel may carry ``assets.extra/tf_serving_warmup_requests``, a TFRecord
file of ``tensorflow.serving.PredictionLog`` protos. TensorFlow Serving replays
them at load; so does the registry, as the version's warm-up, in place of
zeros. Parsing the protos needs the ``tensorflow-serving-api`` package (the
``serve`` extra); it is imported only when such a file exists.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import tensorflow as tf

__all__ = ["WARMUP_FILE", "WarmupRequests", "read_warmup_requests"]

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


@attrs.frozen
class WarmupRequests:
    """The inputs of a warm-up file's predict requests, in file order.

    Attributes:
        path: The warm-up file.
        samples: One dict of input name -> array per request.
    """

    path: str
    samples: tuple[dict[str, Any], ...]


def read_warmup_requests(saved_model: str) -> WarmupRequests | None:
    """The predict requests of a SavedModel's warm-up file; ``None`` without one.

    Args:
        saved_model: A SavedModel directory.

    Raises:
        ModuleNotFoundError: The file exists and ``tensorflow-serving-api`` is
            not installed; the message names the extra to install.
        ValueError: The file holds no predict request, or a record that is not
            a predict request (classify, regress and multi-inference logs have
            no counterpart here), or a record that does not parse.
    """
    path = os.path.join(saved_model, WARMUP_FILE)
    if not os.path.isfile(path):
        return None
    try:
        from tensorflow_serving.apis import prediction_log_pb2
    except ImportError as error:
        raise ModuleNotFoundError(
            f"{path!r} holds TensorFlow Serving warm-up requests, and reading them needs "
            'the tensorflow-serving-api package: pip install "keras-lifecycle[serve]"'
        ) from error
    samples = []
    for index, record in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
        log = prediction_log_pb2.PredictionLog()
        try:
            log.ParseFromString(record)
        except Exception as error:  # protobuf's DecodeError has no stable import path
            raise ValueError(
                f"record {index} of {path!r} is not a PredictionLog: {error}"
            ) from error
        kind = log.WhichOneof("log_type")
        if kind != "predict_log":
            raise ValueError(
                f"record {index} of {path!r} is a {kind or 'empty'} log; only predict "
                "requests can be replayed"
            )
        inputs = log.predict_log.request.inputs
        samples.append({key: tf.make_ndarray(inputs[key]) for key in sorted(inputs)})
    if not samples:
        raise ValueError(f"{path!r} holds no request to replay")
    return WarmupRequests(path=path, samples=tuple(samples))
