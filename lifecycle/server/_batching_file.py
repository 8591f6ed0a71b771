"""TensorFlow Serving's ``--batching_parameters_file``, and the protobuf text files' reader.

:func:`read_batching_parameters` reads TensorFlow Serving's ``BatchingParameters``
text format into a :class:`~lifecycle.BatchingPolicy`, from a message class built
here from its fields (TensorFlow Serving's Python package does not ship it).
:func:`parse_text` reads a protobuf text file with errors that name the flag; the
model config file (``_config``) is read with it too. This module imports the
library's pure-Python core only, and protobuf when a file is read: ``lifecycle
serve`` builds its config before it imports TensorFlow.
"""

from __future__ import annotations

import functools
from typing import Any

from .._core._batcher import BatchingPolicy


def parse_text(path: str, flag: str, message: Any, hint: str = "") -> Any:
    """``message`` filled from the protobuf text file at ``path``; errors name ``flag``."""
    from google.protobuf import text_format

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag} does not exist.") from None
    except IsADirectoryError:
        raise FileNotFoundError(f"{flag} is a directory, not a file.") from None
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as error:
        raise ValueError(f"{flag} does not parse: {error}{hint}") from None


# TensorFlow Serving's BatchingParameters (servables/tensorflow/session_bundle_config.proto),
# which its Python package does not ship: (number, name, type, wrapper, repeated).
_BATCHING_FIELDS = (
    (1, "max_batch_size", "TYPE_MESSAGE", "Int64Value", False),
    (2, "batch_timeout_micros", "TYPE_MESSAGE", "Int64Value", False),
    (3, "max_enqueued_batches", "TYPE_MESSAGE", "Int64Value", False),
    (4, "num_batch_threads", "TYPE_MESSAGE", "Int64Value", False),
    (5, "thread_pool_name", "TYPE_MESSAGE", "StringValue", False),
    (6, "allowed_batch_sizes", "TYPE_INT64", None, True),
    (7, "pad_variable_length_inputs", "TYPE_BOOL", None, False),
)
# TensorFlow Serving's defaults for the fields a file leaves out (BasicBatchScheduler::Options).
_BATCHING_DEFAULTS = {"max_batch_size": 1000, "batch_timeout_micros": 0, "max_enqueued_batches": 10}


@functools.cache
def _batching_parameters_class() -> Any:
    """The message class of ``tensorflow.serving.BatchingParameters``, built from its fields."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="lifecycle/batching_parameters.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    message = proto.message_type.add(name="BatchingParameters")
    field = descriptor_pb2.FieldDescriptorProto
    for number, name, kind, wrapper, repeated in _BATCHING_FIELDS:
        message.field.add(
            name=name,
            number=number,
            type=getattr(field, kind),
            label=field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL,
            type_name=f".google.protobuf.{wrapper}" if wrapper else None,
        )
    pool.Add(proto)
    descriptor = pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    return message_factory.GetMessageClass(descriptor)


def read_batching_parameters(path: str) -> BatchingPolicy:
    """The batching policy of a TensorFlow Serving ``--batching_parameters_file``.

    The file is TensorFlow Serving's ``BatchingParameters`` message in protobuf
    text format, parsed by protobuf itself (from a message class built here from
    its fields, so without TensorFlow), so a file written for TensorFlow
    Serving works as is::

        max_batch_size { value: 32 }
        batch_timeout_micros { value: 1000 }
        max_enqueued_batches { value: 100 }
        num_batch_threads { value: 2 }
        allowed_batch_sizes: [8, 16, 32]

    Fields left out take TensorFlow Serving's defaults: ``max_batch_size``
    1000, ``batch_timeout_micros`` 0, ``max_enqueued_batches`` 10 and
    ``num_batch_threads`` :class:`~lifecycle.BatchingPolicy`'s default.
    ``thread_pool_name`` is accepted and has no effect (the callers run the
    batches; there is no pool to name).

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file does not parse, a value is out of range, or it
            asks for ``pad_variable_length_inputs`` (requests of different
            shapes are batched apart, never padded to each other).
    """
    flag = f"--batching_parameters_file {path!r}"
    known = ", ".join(name for _, name, *_ in _BATCHING_FIELDS)
    parameters = parse_text(path, flag, _batching_parameters_class()(), f" (fields read: {known})")
    if parameters.pad_variable_length_inputs:
        raise ValueError(
            f"{flag} asks for pad_variable_length_inputs, which lifecycle serve does not "
            "do: requests whose inputs differ in shape beyond the batch dimension go in "
            "separate batches. Leave it out or set it to false."
        )
    values: dict[str, Any] = dict(_BATCHING_DEFAULTS)
    for _, name, _, wrapper, _ in _BATCHING_FIELDS:
        if wrapper == "Int64Value" and parameters.HasField(name):
            values[name] = getattr(parameters, name).value
    values["allowed_batch_sizes"] = tuple(parameters.allowed_batch_sizes)
    try:
        return BatchingPolicy(**values)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}".replace("`", "")) from None
