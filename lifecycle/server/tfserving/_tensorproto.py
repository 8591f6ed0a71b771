"""A ``TensorProto`` as a NumPy array, made from the values the request sent and nothing else.

``tf.make_ndarray`` trusts ``tensor_shape``: a proto with no values becomes an
array of zeros of that shape, one value is repeated to fill it, and one string
becomes a list of that many copies. Seventeen bytes on the wire could ask for
gigabytes. :func:`decode_tensor_proto` reads the header first (dtype, shape,
checked against the signature and ``--max_request_rows``), then requires the
values to be exactly what the shape says:

* ``tensor_content`` holds exactly ``count x itemsize`` bytes, little-endian
  (what ``tf.make_tensor_proto`` writes on every host), read in place;
* or the dtype's typed field (``float_val``, ``int_val``, ``string_val``...)
  holds exactly ``count`` values (two per complex value);
* never both, never another dtype's field; a tensor of no values is one whose
  shape holds none (``[0, 4]``). A single value fills only a scalar: nothing is
  padded or broadcast, unlike TensorFlow's own ``Tensor::FromProto``.

``half_val`` holds float16 and bfloat16 values as their 16-bit patterns in
int32s. bfloat16 comes out as float32 (every bfloat16 is one exactly; NumPy has
no bfloat16 of its own that the signature's numeric check takes), and the
signature rounds it back. Every refusal is a
:class:`~lifecycle.server._errors.BadRequestError` naming the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import attrs
import numpy as np
from google.protobuf.message import DecodeError, Message
from tensorflow.core.framework import tensor_pb2, types_pb2

from ..._registry import NamedTensorSpec
from .._errors import BadRequestError
from .._shapes import MAX_RANK, check_shape, narrowed

__all__ = ["DTYPES", "decode_tensor_proto", "parse_message"]

M = TypeVar("M", bound=Message)


@attrs.frozen
class _Kind:
    """How one dtype's values travel in a ``TensorProto``.

    Attributes:
        name: The dtype as TensorFlow names it, for messages.
        field: The typed repeated field that holds its values.
        typed: The NumPy dtype the typed field's values are read as.
        content: The dtype of ``tensor_content``'s elements (little-endian);
            ``None`` where ``tensor_content`` cannot hold them (strings).
        per_value: Typed values per element: 2 for complex numbers.
        narrow: Where ``int_val`` or ``half_val`` carries narrower integers
            (``half_val``: 16-bit patterns): their type (the values are
            range-checked, then converted and read as ``content``).
    """

    name: str
    field: str
    typed: np.dtype
    content: np.dtype | None
    per_value: int = 1
    narrow: np.dtype | None = None


_DT = types_pb2.DataType
_KINDS: dict[int, _Kind] = {
    _DT.DT_FLOAT: _Kind("float32", "float_val", np.dtype("f4"), np.dtype("<f4")),
    _DT.DT_DOUBLE: _Kind("float64", "double_val", np.dtype("f8"), np.dtype("<f8")),
    _DT.DT_HALF: _Kind(
        "float16", "half_val", np.dtype("i4"), np.dtype("<f2"), narrow=np.dtype("u2")
    ),
    _DT.DT_BFLOAT16: _Kind(
        "bfloat16", "half_val", np.dtype("i4"), np.dtype("<u2"), narrow=np.dtype("u2")
    ),
    _DT.DT_INT8: _Kind("int8", "int_val", np.dtype("i4"), np.dtype("i1"), narrow=np.dtype("i1")),
    _DT.DT_INT16: _Kind("int16", "int_val", np.dtype("i4"), np.dtype("<i2"), narrow=np.dtype("i2")),
    _DT.DT_INT32: _Kind("int32", "int_val", np.dtype("i4"), np.dtype("<i4")),
    _DT.DT_INT64: _Kind("int64", "int64_val", np.dtype("i8"), np.dtype("<i8")),
    _DT.DT_UINT8: _Kind("uint8", "int_val", np.dtype("i4"), np.dtype("u1"), narrow=np.dtype("u1")),
    _DT.DT_UINT16: _Kind(
        "uint16", "int_val", np.dtype("i4"), np.dtype("<u2"), narrow=np.dtype("u2")
    ),
    _DT.DT_UINT32: _Kind("uint32", "uint32_val", np.dtype("u4"), np.dtype("<u4")),
    _DT.DT_UINT64: _Kind("uint64", "uint64_val", np.dtype("u8"), np.dtype("<u8")),
    _DT.DT_BOOL: _Kind("bool", "bool_val", np.dtype("?"), np.dtype("u1")),
    _DT.DT_COMPLEX64: _Kind("complex64", "scomplex_val", np.dtype("f4"), np.dtype("<c8"), 2),
    _DT.DT_COMPLEX128: _Kind("complex128", "dcomplex_val", np.dtype("f8"), np.dtype("<c16"), 2),
    _DT.DT_STRING: _Kind("string", "string_val", np.dtype(object), None),
}

#: The dtypes decoded, by TensorFlow's names (``DT_FLOAT``...).
DTYPES: tuple[str, ...] = tuple(_DT.Name(value) for value in _KINDS)


def decode_tensor_proto(
    name: str,
    proto: tensor_pb2.TensorProto | bytes,
    *,
    spec: NamedTensorSpec | None = None,
    max_rows: int | None = None,
) -> np.ndarray:
    """The array a ``TensorProto`` holds, checked before anything is sized by its shape.

    The header is checked first: a dtype this server decodes, a known rank,
    dimensions >= 0 whose product an array can have, then ``spec``'s rank and
    known dimensions and ``max_rows``. Only then are the values read, and they
    must be exactly as many as the shape holds. The array's memory is that of
    the values sent: ``tensor_content`` is read in place, a typed value takes
    at most 8 bytes (16 for a complex one), a string a Python ``bytes`` object.

    Args:
        name: The input the tensor is for, named in every message.
        proto: The tensor, or its serialized bytes.
        spec: The signature's input: the shape must have its rank and known
            dimensions. ``None``: no such check.
        max_rows: The most rows (first dimension) a request may hold
            (``--max_request_rows``). ``None``: no limit.

    Returns:
        The array, of the proto's dtype (bfloat16 as float32, strings as an
        object array of ``bytes``), shaped as ``tensor_shape`` says.

    Raises:
        BadRequestError: The bytes do not parse; the dtype is not decoded; the
            shape is unknown, impossible, does not fit ``spec`` or has more than
            ``max_rows`` rows; or the values are not exactly the shape's.
        TypeError: ``proto`` is neither a ``TensorProto`` nor bytes.

    Example:
        >>> import tensorflow as tf
        >>> decode_tensor_proto("x", tf.make_tensor_proto([[1.0, 2.0]])).tolist()
        [[1.0, 2.0]]
    """
    tensor = parse_message(tensor_pb2.TensorProto, proto, f"Input {name!r}", "decode_tensor_proto")
    kind = _kind(name, tensor.dtype)
    shape = _shape(name, tensor)
    count = check_shape(name, shape, spec, max_rows)
    content, values = _sent(name, tensor, kind)
    if content:
        flat = _from_content(name, tensor.tensor_content, kind, shape, count)
    else:  # the typed values, or none: then the shape must hold none
        flat = _from_values(name, values, kind, shape, count)
    return flat.reshape(shape)


def parse_message(message_type: type[M], given: M | bytes, what: str, caller: str) -> M:
    """``given`` if it is a ``message_type``, else the message its bytes hold.

    Args:
        message_type: The protobuf message class.
        given: The message, or its serialized bytes.
        what: What the message is, for the error (``"Input 'x'"``).
        caller: The function that takes it, for the ``TypeError``.

    Raises:
        BadRequestError: The bytes do not parse.
        TypeError: ``given`` is neither a ``message_type`` nor bytes.
    """
    if isinstance(given, message_type):
        return given
    kind = message_type.__name__
    if not isinstance(given, (bytes, bytearray, memoryview)):
        article = "an" if kind[0] in "AEIOU" else "a"
        raise TypeError(f"{caller} takes {article} {kind} or its bytes. Received: {type(given)!r}")
    try:
        return message_type.FromString(bytes(given))
    except DecodeError as error:
        raise BadRequestError(f"{what} is not a valid {kind} message: {error}") from None


def _kind(name: str, dtype: int) -> _Kind:
    kind = _KINDS.get(dtype)
    if kind is not None:
        return kind
    if dtype == _DT.DT_INVALID:
        raise BadRequestError(
            f"Input {name!r} has no dtype (DT_INVALID): set the TensorProto's dtype."
        )
    # Protobuf keeps enum values of no name.
    shown = _DT.Name(dtype) if dtype in _DT.values() else f"dtype {dtype}"
    raise BadRequestError(
        f"Input {name!r} has {shown}, which this server does not decode. Send one of: "
        f"{', '.join(DTYPES)}."
    )


def _shape(name: str, tensor: tensor_pb2.TensorProto) -> list[int]:
    header = tensor.tensor_shape
    if header.unknown_rank:
        raise BadRequestError(
            f"Input {name!r} has a tensor_shape of unknown rank: send the tensor's dimensions."
        )
    # Counted before the dimensions are listed: a hostile header may have millions.
    if len(header.dim) > MAX_RANK:
        raise BadRequestError(
            f"Input {name!r} declares {len(header.dim)} dimensions; a tensor has at most "
            f"{MAX_RANK}."
        )
    return [dim.size for dim in header.dim]


def _sent(name: str, tensor: tensor_pb2.TensorProto, kind: _Kind) -> tuple[bool, Sequence[Any]]:
    """``(whether tensor_content is set, the typed values)``; other fields are refused."""
    # Set fields only (empty repeated ones are left out), but those of the header.
    header = ("dtype", "tensor_shape", "version_number")
    sent = [field.name for field, _ in tensor.ListFields() if field.name not in header]
    allowed = [kind.field] if kind.content is None else ["tensor_content", kind.field]
    for field in sent:
        if field not in allowed:
            raise BadRequestError(
                f"Input {name!r} is {kind.name}: its values go in {' or '.join(allowed)}, but "
                f"the request sends {field}."
            )
    if len(sent) == 2:
        raise BadRequestError(
            f"Input {name!r} sends both tensor_content and {kind.field}: send the values one way."
        )
    return "tensor_content" in sent, getattr(tensor, kind.field)


def _from_content(
    name: str, content: bytes, kind: _Kind, shape: list[int], count: int
) -> np.ndarray:
    assert kind.content is not None
    expected = count * kind.content.itemsize
    if len(content) != expected:
        raise BadRequestError(
            f"Input {name!r}: tensor_shape {shape} of {kind.name} takes {expected} bytes of "
            f"tensor_content ({kind.content.itemsize} a value), but the request sends "
            f"{len(content)}. Send every value, and the shape they have."
        )
    return _widened(np.frombuffer(content, dtype=kind.content), kind)


def _from_values(
    name: str, values: Sequence[Any], kind: _Kind, shape: list[int], count: int
) -> np.ndarray:
    sent, expected = len(values), count * kind.per_value
    if sent != expected:
        per = " (two per complex value: real, imaginary)" if kind.per_value == 2 else ""
        raise BadRequestError(
            f"Input {name!r}: tensor_shape {shape} holds {count} values, but the request sends "
            f"{f'{sent} in {kind.field}{per}' if sent else 'none'}; send every value "
            "(tf.make_tensor_proto does). Values are never repeated to fill a shape, nor filled "
            "in: a tensor of no values has a 0 in its shape."
        )
    # fromiter fills the array as it reads: no list of Python objects in between.
    flat = np.fromiter(values, dtype=kind.typed, count=sent)
    if kind.content is None:  # strings: a bytes object each
        return flat
    if kind.per_value == 2:  # (real, imaginary) pairs
        return flat.view(kind.content.newbyteorder("="))
    if kind.narrow is not None:
        patterns = "the 16-bit patterns of " if kind.field == "half_val" else ""
        refusal = (
            f"{kind.field} holds {patterns}{kind.name} values, from {{low}} to {{high}}; the "
            "request sends values from {least} to {most}."
        )
        flat = narrowed(name, flat, kind.narrow, refusal).view(kind.content.newbyteorder("="))
    return _widened(flat, kind)


def _widened(flat: np.ndarray, kind: _Kind) -> np.ndarray:
    """Booleans from any byte but 0 (as TensorFlow reads them), bfloat16 as float32.

    bfloat16 bit patterns are a float32's upper 16 bits.
    """
    if kind.name == "bool":
        return flat != 0
    if kind.name == "bfloat16":
        return (flat.astype(np.uint32) << 16).view(np.float32)
    return flat
