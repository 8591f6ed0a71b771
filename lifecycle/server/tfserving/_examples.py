"""TensorFlow Serving's Classify and Regress: ``tf.Example`` inputs in, classes or values out.

A signature whose method is ``tensorflow/serving/classify`` or
``.../regress`` takes one input: a batch of serialized ``tf.Example`` protos.
Requests carry the examples as JSON objects (REST ``:classify`` /
``:regress``, ``{"examples": [...], "context": {...}}``) or as ``Input``
messages (gRPC ``Classify`` / ``Regress``); both become the serialized batch
here, with the context's features in every example (an example's own feature
wins over the context's, as in TensorFlow Serving, which concatenates the two
serializations). The answers are read from the outputs TensorFlow Serving
reads: ``classes`` and ``scores`` for a classification, ``outputs`` for a
regression.

A context is copied into every example, so a small request can ask for a large
batch: 1,000 empty examples with a 100 KB context are 100 MB. The copies cannot
be avoided (the signature parses each serialized example on its own, as in
TensorFlow Serving), so they are bounded instead: the examples are read only
once the signature is known to be of the request's method
(:func:`run_examples`), then counted against ``--max_request_rows`` and their
expanded size (examples x context + the examples' own bytes) computed against
``--max_request_bytes`` before a single copy is made.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow_serving.apis import input_pb2

from ..._registry import ServingLease, ServingSignature
from ..._tf import CLASSIFY_METHOD, REGRESS_METHOD
from .._errors import BadRequestError, PayloadTooLargeError

__all__ = [
    "CLASSIFY",
    "REGRESS",
    "classifications",
    "examples_from_input",
    "examples_from_json",
    "regressions",
    "run_examples",
]

CLASSIFY = "classify"
REGRESS = "regress"
_METHODS = {CLASSIFY: CLASSIFY_METHOD, REGRESS: REGRESS_METHOD}


def examples_from_json(
    examples: Any, context: Any = None, *, max_rows: int, max_bytes: int
) -> list[bytes]:
    """Serialized ``tf.Example``s of a REST body's ``examples`` (and ``context``).

    A feature's value is a number, a string, ``{"b64": ...}``, or a list of one
    kind: integers go to ``int64_list``, numbers with a fraction to
    ``float_list``, strings and ``b64`` to ``bytes_list``.

    Args:
        examples: The body's ``examples``: a list of objects of features.
        context: The body's ``context``: an object of features, or ``None``.
        max_rows: The most examples a request may hold (``--max_request_rows``).
        max_bytes: The most bytes the examples may take once each carries the
            context (``--max_request_bytes``).

    Raises:
        BadRequestError: Not a non-empty list of objects, a value of no kind,
            or more than ``max_rows`` examples.
        PayloadTooLargeError: The expanded examples would take more than ``max_bytes``.
    """
    if not isinstance(examples, list) or not examples:
        raise BadRequestError("'examples' must be a non-empty list of objects of features.")
    _check_rows(len(examples), max_rows)
    prefix = _example(context, "'context'").SerializeToString() if context is not None else b""
    own = [_example(item, f"example {i}").SerializeToString() for i, item in enumerate(examples)]
    return _expanded(prefix, own, max_bytes)


def examples_from_input(
    given: input_pb2.Input | bytes, *, max_rows: int, max_bytes: int
) -> list[bytes]:
    """Serialized ``tf.Example``s of a gRPC request's ``Input`` message (or its bytes).

    Args:
        given: The request's ``input``, or its serialized bytes.
        max_rows: The most examples a request may hold (``--max_request_rows``).
        max_bytes: The most bytes the examples may take once each carries the
            context (``--max_request_bytes``).

    Raises:
        BadRequestError: The bytes do not parse, the input holds no examples,
            or more than ``max_rows``.
        PayloadTooLargeError: The expanded examples would take more than ``max_bytes``.

    Example:
        >>> from tensorflow_serving.apis import input_pb2
        >>> given = input_pb2.Input()
        >>> listed = given.example_list_with_context
        >>> listed.context.features.feature["c"].int64_list.value.append(1)
        >>> _ = listed.examples.add(), listed.examples.add()
        >>> serialized = examples_from_input(given, max_rows=10, max_bytes=1000)
        >>> serialized == [listed.context.SerializeToString()] * 2
        True
    """
    given = _parse_input(given)
    kind = given.WhichOneof("kind")
    if kind == "example_list":
        examples, context = given.example_list.examples, None
    elif kind == "example_list_with_context":
        listed = given.example_list_with_context
        examples, context = listed.examples, listed.context
    else:
        raise BadRequestError(
            "The request's input must be an example_list or an example_list_with_context."
        )
    if not examples:
        raise BadRequestError("The request's input holds no examples.")
    _check_rows(len(examples), max_rows)
    prefix = context.SerializeToString() if context is not None else b""
    own = [example.SerializeToString() for example in examples]
    return _expanded(prefix, own, max_bytes)


def run_examples(
    lease: ServingLease,
    signature_name: str | None,
    verb: str,
    read: Callable[[], Sequence[bytes]],
) -> dict[str, np.ndarray]:
    """Run a classify or regress signature of the held version on serialized examples.

    Args:
        lease: The version serving the request.
        signature_name: The signature; ``None`` for ``serving_default``.
        verb: :data:`CLASSIFY` or :data:`REGRESS`.
        read: Reads the request's serialized examples
            (:func:`examples_from_json`, :func:`examples_from_input`): called
            only once the signature is known to take them, so that nothing is
            expanded for a request that is refused anyway.

    Raises:
        ValueError: No such signature, or its method is not ``verb``'s.
        BadRequestError, PayloadTooLargeError: ``read``'s.
    """
    signature = lease.signature_named(signature_name)
    _check_method(signature, signature_name, verb)
    if len(signature.inputs) != 1 or signature.inputs[0].dtype != "string":
        raise BadRequestError(
            f"The {verb} signature must take one string input of serialized tf.Examples; "
            f"it takes {[(s.name, s.dtype) for s in signature.inputs]}."
        )
    serialized = read()
    batch = np.empty(len(serialized), dtype=object)
    batch[:] = list(serialized)
    shape = signature.inputs[0].shape
    if len(shape) == 2:  # [batch, 1]
        batch = batch.reshape(-1, 1)
    return lease.infer({signature.inputs[0].name: batch}, signature_name or None).outputs


def classifications(outputs: Mapping[str, np.ndarray]) -> list[list[tuple[str, float]]]:
    """``[(label, score), ...]`` per example, from ``classes`` and/or ``scores``.

    Raises:
        BadRequestError: The signature has neither output.
    """
    classes, scores = outputs.get("classes"), outputs.get("scores")
    if classes is None and scores is None:
        raise BadRequestError(
            f"A classify signature answers 'classes' and/or 'scores'; this one answers "
            f"{sorted(outputs)}."
        )
    rows = len(classes if classes is not None else scores)  # type: ignore[arg-type]
    table = []
    for row in range(rows):
        labels = _row(classes, row) if classes is not None else None
        values = _row(scores, row) if scores is not None else None
        count = len(labels if labels is not None else values)  # type: ignore[arg-type]
        table.append(
            [
                (
                    _text(labels[k]) if labels is not None else "",
                    float(values[k]) if values is not None else 0.0,
                )
                for k in range(count)
            ]
        )
    return table


def regressions(outputs: Mapping[str, np.ndarray]) -> list[float]:
    """One value per example, from ``outputs`` (``[batch]`` or ``[batch, 1]``).

    Raises:
        BadRequestError: The signature has no ``outputs``, or more than one value per example.
    """
    values = outputs.get("outputs")
    if values is None:
        raise BadRequestError(
            f"A regress signature answers 'outputs'; this one answers {sorted(outputs)}."
        )
    if values.ndim > 2 or (values.ndim == 2 and values.shape[1] != 1):
        raise BadRequestError(
            f"A regress signature answers one value per example; 'outputs' has shape "
            f"{values.shape}."
        )
    return [float(v) for v in values.reshape(-1)]


def _parse_input(given: input_pb2.Input | bytes) -> input_pb2.Input:
    if isinstance(given, input_pb2.Input):
        return given
    if not isinstance(given, (bytes, bytearray, memoryview)):
        raise TypeError(f"Expected an Input message or its bytes. Received: {type(given)!r}")
    try:
        return input_pb2.Input.FromString(bytes(given))
    except DecodeError as error:
        raise BadRequestError(
            f"The request's input is not a valid Input message: {error}"
        ) from None


def _check_rows(count: int, max_rows: int) -> None:
    if count > max_rows:
        raise BadRequestError(
            f"The request holds {count} examples; a request may hold at most {max_rows} "
            "(--max_request_rows). Send fewer examples per request, or start the server with "
            "a larger --max_request_rows."
        )


def _expanded(prefix: bytes, own: list[bytes], max_bytes: int) -> list[bytes]:
    """Each example after the context's serialization, once their total size is known to fit.

    An example's own features win over the context's: a later value of a
    feature in a serialization replaces an earlier one, as in TensorFlow Serving.
    """
    total = len(prefix) * len(own) + sum(map(len, own))
    if total > max_bytes:
        raise PayloadTooLargeError(
            f"The request's {len(own)} examples, each with the context's {len(prefix)} bytes, "
            f"take {total} bytes once serialized: over the server's limit of {max_bytes} "
            "(--max_request_bytes). The context is copied into every example: send fewer "
            "examples per request, or a smaller context."
        )
    if not prefix:
        return own
    return [prefix + example for example in own]


def _check_method(signature: ServingSignature, name: str | None, verb: str) -> None:
    if signature.method_name != _METHODS[verb]:
        raise BadRequestError(
            f"Expected {verb} signature method_name to be {_METHODS[verb]}. Was: "
            f"{signature.method_name} (signature {name or 'serving_default'!r})."
        )


def _row(values: np.ndarray, row: int) -> np.ndarray:
    return np.asarray(values[row]).reshape(-1)


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _example(features: Any, where: str) -> example_pb2.Example:
    if not isinstance(features, dict):
        raise BadRequestError(f"{where} must be an object of features. Received: {features!r}")
    example = example_pb2.Example()
    for name, value in features.items():
        if not isinstance(name, str):
            raise BadRequestError(f"{where}: feature names are strings. Received: {name!r}")
        _fill(example.features.feature[name], value, f"{where}, feature {name!r}")
    return example


def _fill(feature: feature_pb2.Feature, value: Any, where: str) -> None:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise BadRequestError(f"{where} is an empty list: its kind cannot be told.")
    kinds = {_kind(v, where) for v in values}
    if kinds == {"bytes"}:
        feature.bytes_list.value.extend(_bytes(v, where) for v in values)
        return
    if not kinds <= {"int", "float"}:
        raise BadRequestError(f"{where} mixes numbers and strings: {value!r}")
    try:
        if kinds == {"int"}:
            feature.int64_list.value.extend(values)
        else:
            feature.float_list.value.extend(float(v) for v in values)
    except (ValueError, OverflowError) as error:  # an integer beyond int64 or float
        raise BadRequestError(f"{where} cannot be stored in a tf.Example: {error}") from None


def _kind(value: Any, where: str) -> str:
    if isinstance(value, bool):
        raise BadRequestError(f"{where}: a tf.Example has no booleans. Received: {value!r}")
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str) or (isinstance(value, dict) and set(value) == {"b64"}):
        return "bytes"
    raise BadRequestError(
        f'{where}: values are numbers, strings or {{"b64": ...}}. Received: {value!r}'
    )


def _bytes(value: Any, where: str) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as error:  # a lone surrogate
            raise BadRequestError(f"{where}: a string is not valid text: {error}") from None
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (ValueError, TypeError) as error:
        raise BadRequestError(f"{where}: a 'b64' value is not valid base64: {error}") from None
