"""KServe v2 tensors, whatever carries them: datatypes, raw bytes, JSON and typed contents.

One codec for the protocol's three tensor forms:

* JSON ``data`` (REST): flat in row-major order, or nested;
* raw bytes (REST's binary tensor data extension, gRPC's ``raw_input_contents``
  and ``raw_output_contents``): the elements little-endian, row-major, with no
  padding; a BYTES element is its length as 4 little-endian bytes, then its bytes;
* gRPC's typed ``contents`` (``fp32_contents``...), one field per datatype family.

FP16 and BF16 have no JSON or typed form of their own in the protocol's clients:
they travel as raw bytes (BF16 as ``ml_dtypes.bfloat16``, TensorFlow's own
NumPy type for it), or as JSON numbers. The decoders (:data:`Decoder`) take a
shape already checked (``_shapes.check_shape``) and never trust the sender: a
byte count or an element's length that does not add up to that shape is a
:class:`~lifecycle.server._errors.BadRequestError` naming the tensor.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from .._errors import BadRequestError
from .._json import as_array
from .._shapes import narrowed

__all__ = [
    "DATATYPES",
    "Decoder",
    "from_contents",
    "from_json",
    "from_raw",
    "tensor_metadata",
    "to_json",
    "to_raw",
]

# Each datatype of the protocol: TensorFlow's dtype name, and the field of gRPC's
# InferTensorContents that holds its values with the type it holds them as (FP16
# and BF16 have no field: raw contents only).
_FORMS: dict[str, tuple[str, str | None, Any]] = {
    "BOOL": ("bool", "bool_contents", bool),
    "UINT8": ("uint8", "uint_contents", np.uint32),
    "UINT16": ("uint16", "uint_contents", np.uint32),
    "UINT32": ("uint32", "uint_contents", np.uint32),
    "UINT64": ("uint64", "uint64_contents", np.uint64),
    "INT8": ("int8", "int_contents", np.int32),
    "INT16": ("int16", "int_contents", np.int32),
    "INT32": ("int32", "int_contents", np.int32),
    "INT64": ("int64", "int64_contents", np.int64),
    "FP16": ("float16", None, None),
    "FP32": ("float32", "fp32_contents", np.float32),
    "FP64": ("float64", "fp64_contents", np.float64),
    "BF16": ("bfloat16", None, None),
    "BYTES": ("string", "bytes_contents", object),
}

#: TensorFlow dtype name -> the protocol's datatype.
DATATYPES = {dtype: datatype for datatype, (dtype, _, _) in _FORMS.items()}

# The protocol's fixed-size datatypes as little-endian NumPy dtypes (BYTES has none).
_NUMPY = {
    datatype: np.dtype(tf.as_dtype(dtype).as_numpy_dtype).newbyteorder("<")
    for datatype, (dtype, _, _) in _FORMS.items()
    if datatype != "BYTES"
}

_LENGTH = struct.Struct("<I")

#: Reads an input's values: ``(name, datatype, checked shape, what the request sent)``.
Decoder = Callable[[str, str, list[int], Any], np.ndarray]


def tensor_metadata(
    name: str, dtype: str | np.dtype, shape: Sequence[int | None]
) -> dict[str, Any]:
    """A tensor as the protocol describes it: name, datatype and shape (-1 for any size).

    Args:
        name: The tensor's name.
        dtype: TensorFlow's dtype name (a signature's), or an array's NumPy dtype.
        shape: Its dimensions, ``None`` where any size goes.
    """
    if isinstance(dtype, np.dtype):
        dtype = "string" if dtype.kind in "OSU" else dtype.name
    return {
        "name": name,
        "datatype": DATATYPES.get(dtype, dtype.upper()),
        "shape": [-1 if d is None else d for d in shape],
    }


def _fits(name: str, values: int, shape: list[int]) -> None:
    if values != math.prod(shape):
        raise BadRequestError(
            f"Input {name!r} has {values} values, but its shape {shape} holds {math.prod(shape)}."
        )


def from_json(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    """A v2 JSON input's ``data`` as an array.

    BYTES values are UTF-8 encoded; numbers are read a block at a time
    (``_json.as_array``) into the datatype's array when they are numbers of
    one kind, else as JSON gave them (the signature then says what is wrong).
    ``data`` may be an array already (``_json.loads`` with ``numbers``).

    Raises:
        BadRequestError: The values do not fill ``shape``.
    """
    count = math.prod(shape)
    if isinstance(data, (list, np.ndarray)) and len(data) > max(count, *shape[:1], 1):
        # More values than the shape holds, flat or nested: refused unconverted.
        raise BadRequestError(
            f"Input {name!r}: 'data' has {len(data)} items, more than its shape {shape} holds "
            f"({count})."
        )
    if datatype == "BYTES":
        flat = np.asarray(data, dtype=object).reshape(-1)
        flat = np.array([v.encode() if isinstance(v, str) else v for v in flat], dtype=object)
    else:
        numbers = as_array(data, _NUMPY.get(datatype))
        flat = (np.asarray(data) if numbers is None else numbers).reshape(-1)
    _fits(name, flat.size, shape)
    return flat.reshape(shape)


def from_raw(name: str, datatype: str, shape: list[int], raw: bytes | memoryview) -> np.ndarray:
    """Raw tensor bytes (binary data extension, gRPC raw contents) as an array.

    Fixed-size datatypes are read in place (no copy); BYTES as an object array
    of ``bytes``; BF16 as float32 (the signature rounds it back to bfloat16).

    Raises:
        BadRequestError: The bytes do not hold exactly ``shape``'s elements.
    """
    if datatype == "BYTES":
        flat = _unpack_bytes(name, memoryview(raw))
        _fits(name, flat.size, shape)
        return flat.reshape(shape)
    dtype = _NUMPY.get(datatype)
    if dtype is None:
        raise BadRequestError(
            f"Input {name!r} has datatype {datatype!r}, which is not one of the protocol's: "
            f"{sorted(_FORMS)}."
        )
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise BadRequestError(
            f"Input {name!r} has {len(raw)} bytes of {datatype} data, but its shape {shape} "
            f"takes {expected} ({dtype.itemsize} per element)."
        )
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if datatype == "BF16":
        # NumPy itself has no bfloat16 (ml_dtypes' has kind "V", which the
        # signature's numeric check refuses): float32 holds every bfloat16 exactly.
        return array.astype(np.float32)
    return array


def _unpack_bytes(name: str, raw: memoryview) -> np.ndarray:
    """Length-prefixed BYTES elements (4 bytes little-endian, then the element)."""
    elements = []
    offset, end = 0, len(raw)
    while offset < end:
        if end - offset < _LENGTH.size:
            raise BadRequestError(
                f"Input {name!r}: BYTES data ends within an element's 4-byte length, at byte "
                f"{offset} of {end}."
            )
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        if length > end - offset:
            raise BadRequestError(
                f"Input {name!r}: a BYTES element of {length} bytes at byte {offset} runs past "
                f"the end of its data ({end} bytes)."
            )
        elements.append(bytes(raw[offset : offset + length]))
        offset += length
    flat = np.empty(len(elements), dtype=object)
    flat[:] = elements
    return flat


def from_contents(name: str, datatype: str, shape: list[int], contents: Any) -> np.ndarray:
    """A tensor of gRPC's typed ``InferTensorContents``, as an array.

    Raises:
        BadRequestError: The datatype has no typed field (FP16, BF16), or the
            values do not fill ``shape``.
    """
    _, field, wire = _FORMS.get(datatype, (None, None, None))
    if field is None:
        raise BadRequestError(
            f"Input {name!r} has datatype {datatype!r}, which has no typed contents field: "
            "send it as raw_input_contents."
        )
    values = getattr(contents, field)
    _fits(name, len(values), shape)
    # Filled as it is read (no list of Python objects in between); numbers as
    # their field's own type, then a narrower datatype's values range-checked.
    flat = np.fromiter(values, dtype=wire, count=len(values))
    if datatype == "BYTES":
        return flat.reshape(shape)
    target = _NUMPY[datatype]
    if target.itemsize < flat.itemsize:
        refusal = (
            f"{datatype} values run from {{low}} to {{high}}; {field} sends {{least}} to {{most}}."
        )
        return narrowed(name, flat, target, refusal).reshape(shape)
    return flat.astype(target, copy=False).reshape(shape)


def to_json(array: np.ndarray) -> Any:
    """An output's v2 JSON ``data``: flat in row-major order, strings decoded as UTF-8."""
    if array.dtype.kind in "OSU":
        return [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
            for v in array.reshape(-1).tolist()
        ]
    if array.dtype.name == "bfloat16":
        return array.reshape(-1).astype(np.float32)  # JSON numbers; orjson has no bfloat16
    return array.reshape(-1)


def to_raw(array: np.ndarray) -> bytes:
    """An output's raw bytes (little-endian, row-major; BYTES length-prefixed)."""
    if array.dtype.kind in "OSU":
        parts = []
        for value in array.reshape(-1).tolist():
            element = value.encode() if isinstance(value, str) else bytes(value)
            parts += (_LENGTH.pack(len(element)), element)
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
