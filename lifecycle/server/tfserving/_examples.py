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
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow_serving.apis import input_pb2

from ..._registry import ServingLease
from ..._tf import CLASSIFY_METHOD, REGRESS_METHOD
from .._errors import BadRequestError, PayloadTooLargeError
from .._service import ModelService
from ._tensorproto import parse_message

__all__ = [
    "CLASSIFY",
    "REGRESS",
    "b64_bytes",
    "classifications",
    "examples_from_input",
    "examples_from_json",
    "is_b64",
    "regressions",
    "run_examples",
    "serve_examples",
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
    given = parse_message(input_pb2.Input, given, "The request's input", "examples_from_input")
    kind = given.WhichOneof("kind")
    if kind is None:
        raise BadRequestError(
            "The request's input must be an example_list or an example_list_with_context."
        )
    listed = getattr(given, kind)
    if not listed.examples:
        raise BadRequestError("The request's input holds no examples.")
    _check_rows(len(listed.examples), max_rows)
    with_context = kind == "example_list_with_context"
    prefix = listed.context.SerializeToString() if with_context else b""
    own = [example.SerializeToString() for example in listed.examples]
    return _expanded(prefix, own, max_bytes)


def serve_examples(
    service: ModelService,
    model: tuple[str, int | None, str | None],
    signature_name: str | None,
    verb: str,
    key: str | None,
    read: Callable[..., list[bytes]],
) -> tuple[int, dict[str, np.ndarray]]:
    """A Classify or Regress request, from either face: ``(the version that ran, its outputs)``.

    Args:
        service: The server's models and configuration.
        model: The model's name, and the version or the label asked for (or neither).
        signature_name: The signature; ``None`` for ``serving_default``.
        verb: :data:`CLASSIFY` or :data:`REGRESS`.
        key: The request's sticky routing key.
        read: :func:`examples_from_json` or :func:`examples_from_input` with
            the request's examples: called with the server's ``max_rows`` and
            ``max_bytes`` once the signature is known to take them.
    """
    name, version, label = model
    config = service.config
    with service.registry.serving(name, version=version, label=label, key=key) as lease:
        outputs = run_examples(
            lease,
            signature_name,
            verb,
            lambda: read(max_rows=config.max_request_rows, max_bytes=config.max_request_bytes),
        )
        return lease.version, outputs


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
    if signature.method_name != _METHODS[verb]:
        raise BadRequestError(
            f"Expected {verb} signature method_name to be {_METHODS[verb]}. Was: "
            f"{signature.method_name} (signature {signature_name or 'serving_default'!r})."
        )
    if len(signature.inputs) != 1 or signature.inputs[0].dtype != "string":
        raise BadRequestError(
            f"The {verb} signature must take one string input of serialized tf.Examples; "
            f"it takes {[(s.name, s.dtype) for s in signature.inputs]}."
        )
    spec = signature.inputs[0]
    serialized = read()
    batch = np.array(serialized, dtype=object)
    if len(spec.shape) == 2:  # [batch, 1]
        batch = batch.reshape(-1, 1)
    return lease.infer({spec.name: batch}, signature_name).outputs


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
    # Each example's row as a flat list; a missing output answers "" or 0.0 for each class.
    labels = None if classes is None else classes.reshape(len(classes), -1).tolist()
    values = None if scores is None else scores.reshape(len(scores), -1).tolist()
    if labels is None:
        labels = [[""] * len(row) for row in values or []]
    if values is None:
        values = [[0.0] * len(row) for row in labels]
    return [
        [(_text(label), float(value)) for label, value in zip(row, scores_row, strict=False)]
        for row, scores_row in zip(labels, values, strict=False)
    ]


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


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def is_b64(value: Any) -> bool:
    """Whether a JSON value is TensorFlow Serving's ``{"b64": "..."}``: bytes, in base64."""
    return isinstance(value, dict) and set(value) == {"b64"}


def b64_bytes(value: dict[str, Any], where: str) -> bytes:
    """The bytes a ``{"b64": "..."}`` value encodes.

    Raises:
        BadRequestError: Not valid base64; the message starts with ``where``.
    """
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (ValueError, TypeError) as error:
        raise BadRequestError(f"{where}: a 'b64' value is not valid base64: {error}") from None


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
    kinds = set(map(type, values))  # JSON gives exact types: no subclasses to mind
    if bool in kinds:
        raise BadRequestError(f"{where}: a tf.Example has no booleans. Received: {value!r}")
    if not kinds <= {int, float, str, dict}:
        raise BadRequestError(
            f'{where}: values are numbers, strings or {{"b64": ...}}. Received: {value!r}'
        )
    if kinds <= {str, dict}:
        feature.bytes_list.value.extend(_bytes(v, where) for v in values)
        return
    if not kinds <= {int, float}:
        raise BadRequestError(f"{where} mixes numbers and strings: {value!r}")
    numbers = feature.int64_list if kinds == {int} else feature.float_list
    try:
        numbers.value.extend(values)
    except (ValueError, OverflowError) as error:  # an integer beyond int64 or float
        raise BadRequestError(f"{where} cannot be stored in a tf.Example: {error}") from None


def _bytes(value: Any, where: str) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as error:  # a lone surrogate
            raise BadRequestError(f"{where}: a string is not valid text: {error}") from None
    if not is_b64(value):
        raise BadRequestError(
            f'{where}: values are numbers, strings or {{"b64": ...}}. Received: {value!r}'
        )
    return b64_bytes(value, where)
