"""KServe v2 tensors, whatever carries them: datatypes, raw bytes, JSON and typed contents.

One codec for the protocol's three tensor forms:

* JSON ``data`` (REST): flat in row-major order, or nested;
* raw bytes (REST's binary tensor data extension, gRPC's ``raw_input_contents``
  and ``raw_output_contents``): the elements little-endian, row-major, with no
  padding; a BYTES element is its length as 4 little-endian bytes, then its bytes;
* gRPC's typed ``contents`` (``fp32_contents``...), one field per datatype family.

FP16 and BF16 have no JSON or typed form of their own in the protocol's clients:
they travel as raw bytes (BF16 as ``ml_dtypes.bfloat16``, TensorFlow's own
NumPy type for it), or as JSON numbers. Decoding never trusts the sender: a
shape, a byte count or an element's length that does not add up is a
:class:`~lifecycle.server._errors.BadRequestError` naming the tensor.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from ..._registry import NamedTensorSpec, ServingSignature
from .._errors import BadRequestError
from .._json import as_array

__all__ = [
    "CONTENTS_FIELDS",
    "DATATYPES",
    "check_input",
    "declared_shape",
    "from_contents",
    "from_json",
    "from_raw",
    "output_names",
    "tensor_metadata",
    "to_json",
    "to_raw",
]

# TensorFlow dtype name <-> the protocol's datatype.
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
    "string": "BYTES",
}

# The protocol's fixed-size datatypes as little-endian NumPy dtypes (BYTES has none).
_NUMPY = {
    datatype: np.dtype(tf.as_dtype(name).as_numpy_dtype).newbyteorder("<")
    for name, datatype in DATATYPES.items()
    if datatype != "BYTES"
}

#: The field of gRPC's ``InferTensorContents`` that holds each datatype's values;
#: FP16 and BF16 have none (raw contents only).
CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

_LENGTH = struct.Struct("<I")

# The type each typed contents field holds on the wire.
_CONTENTS_TYPES = {
    "bool_contents": np.dtype(bool),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}


def tensor_metadata(spec: NamedTensorSpec) -> dict[str, Any]:
    """A signature's tensor as the protocol's metadata shows it (-1 for any size)."""
    return {
        "name": spec.name,
        "datatype": DATATYPES.get(spec.dtype, spec.dtype.upper()),
        "shape": [-1 if d is None else d for d in spec.shape],
    }


def check_input(
    signature: ServingSignature, name: str, datatype: str, taken: Collection[str] = ()
) -> NamedTensorSpec:
    """The signature's input called ``name``, if ``datatype`` is the one it takes.

    Args:
        signature: The signature of the version serving the request.
        name: The request's name of the input.
        datatype: The request's datatype of it.
        taken: The inputs the request gave before this one.

    Raises:
        ValueError: The model has no such input.
        BadRequestError: The datatype is not the input's, or the request gave
            the input before.
    """
    spec = signature.input(name)
    if spec.name in taken:
        raise BadRequestError(f"Input {spec.name!r} appears twice in the request.")
    expected = DATATYPES.get(spec.dtype)
    if datatype != expected:
        raise BadRequestError(
            f"Input {spec.name!r} has datatype {datatype!r}; the model takes {expected!r}."
        )
    return spec


def output_names(requested: Sequence[str] | None, outputs: Sequence[str]) -> list[str]:
    """The outputs to answer: those ``requested`` (all ``outputs`` when ``None``), in order.

    Raises:
        BadRequestError: A requested output is not one of the model's ``outputs``.
    """
    if requested is None:
        return list(outputs)
    unknown = [n for n in requested if n not in outputs]
    if unknown:
        raise BadRequestError(f"The model has no outputs {unknown}. Outputs: {list(outputs)}")
    return list(requested)


def declared_shape(name: str, shape: Any) -> list[int]:
    """A v2 input's ``shape`` as the request gives it, if it is a list of sizes.

    Raises:
        BadRequestError: ``shape`` is not a list of ints >= 0.
    """
    return _shape(name, shape)


def _shape(name: str, shape: Any) -> list[int]:
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadRequestError(f"Input {name!r}: 'shape' must be a list of ints >= 0.")
    return list(shape)


def _count(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _fits(name: str, values: int, shape: list[int]) -> None:
    if values != _count(shape):
        raise BadRequestError(
            f"Input {name!r} has {values} values, but its shape {shape} holds {_count(shape)}."
        )


def from_json(item: Mapping[str, Any]) -> np.ndarray:
    """A v2 JSON input (``name``, ``shape``, ``datatype``, ``data``) as an array.

    BYTES values are UTF-8 encoded; numbers are read a block at a time
    (``_json.as_array``) into the datatype's array when they are numbers of
    one kind, else as JSON gave them (the signature then says what is wrong).
    ``data`` may be an array already (``_json.loads`` with ``numbers``).

    Raises:
        BadRequestError: The shape is not a list of sizes, or the values do not fill it.
    """
    name = item["name"]
    shape = _shape(name, item["shape"])
    data = item["data"]
    if isinstance(data, (list, np.ndarray)) and len(data) > max(_count(shape), *shape[:1], 1):
        # More values than the shape holds, flat or nested: refused unconverted.
        raise BadRequestError(
            f"Input {name!r}: 'data' has {len(data)} items, more than its shape {shape} holds "
            f"({_count(shape)})."
        )
    if item["datatype"] == "BYTES":
        flat = np.asarray(data, dtype=object).reshape(-1)
        flat = np.array([v.encode() if isinstance(v, str) else v for v in flat], dtype=object)
    else:
        numbers = as_array(data, _NUMPY.get(item["datatype"]))
        flat = (np.asarray(data) if numbers is None else numbers).reshape(-1)
    _fits(name, flat.size, shape)
    return flat.reshape(shape)


def from_raw(name: str, datatype: str, shape: Any, raw: bytes | memoryview) -> np.ndarray:
    """Raw tensor bytes (binary data extension, gRPC raw contents) as an array.

    Fixed-size datatypes are read in place (no copy); BYTES as an object array
    of ``bytes``; BF16 as float32 (the signature rounds it back to bfloat16).

    Raises:
        BadRequestError: The bytes do not hold exactly ``shape``'s elements.
    """
    shape = _shape(name, shape)
    if datatype == "BYTES":
        flat = _unpack_bytes(name, memoryview(raw))
        _fits(name, flat.size, shape)
        return flat.reshape(shape)
    dtype = _NUMPY.get(datatype)
    if dtype is None:
        raise BadRequestError(
            f"Input {name!r} has datatype {datatype!r}, which is not one of the protocol's: "
            f"{sorted(CONTENTS_FIELDS.keys() | {'FP16', 'BF16'})}."
        )
    expected = _count(shape) * dtype.itemsize
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


def from_contents(name: str, datatype: str, shape: Any, contents: Any) -> np.ndarray:
    """A tensor of gRPC's typed ``InferTensorContents``, as an array.

    Raises:
        BadRequestError: The datatype has no typed field (FP16, BF16), or the
            values do not fill ``shape``.
    """
    shape = _shape(name, shape)
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise BadRequestError(
            f"Input {name!r} has datatype {datatype!r}, which has no typed contents field: "
            "send it as raw_input_contents."
        )
    values = getattr(contents, field)
    _fits(name, len(values), shape)
    # Filled as it is read (no list of Python objects in between); numbers as
    # their field's own type, then a narrower datatype's values range-checked.
    if datatype == "BYTES":
        return np.fromiter(values, dtype=object, count=len(values)).reshape(shape)
    wire = _CONTENTS_TYPES[field]
    flat = np.fromiter(values, dtype=wire, count=len(values))
    target = _NUMPY[datatype]
    if target.itemsize < wire.itemsize and flat.size:
        info = np.iinfo(target)
        if flat.min() < info.min or flat.max() > info.max:
            raise BadRequestError(
                f"Input {name!r}: {datatype} values run from {info.min} to {info.max}; "
                f"{field} sends {int(flat.min())} to {int(flat.max())}."
            )
    return flat.astype(target, copy=False).reshape(shape)


def _datatype(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    return DATATYPES.get(array.dtype.name, array.dtype.name.upper())


def to_json(name: str, array: np.ndarray) -> dict[str, Any]:
    """An output as v2 JSON: ``data`` flat in row-major order, strings decoded as UTF-8."""
    datatype = _datatype(array)
    data: Any
    if datatype == "BYTES":
        data = [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
            for v in array.reshape(-1).tolist()
        ]
    elif datatype == "BF16":
        data = array.reshape(-1).astype(np.float32)  # JSON numbers; orjson has no bfloat16
    else:
        data = array.reshape(-1)
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": data}


def to_raw(array: np.ndarray) -> tuple[str, bytes]:
    """An output's datatype and raw bytes (little-endian, row-major; BYTES length-prefixed)."""
    datatype = _datatype(array)
    if datatype == "BYTES":
        parts = []
        for value in array.reshape(-1).tolist():
            element = value.encode() if isinstance(value, str) else bytes(value)
            parts += (_LENGTH.pack(len(element)), element)
        return datatype, b"".join(parts)
    dtype = _NUMPY.get(datatype, array.dtype.newbyteorder("<"))
    return datatype, np.ascontiguousarray(array, dtype=dtype).tobytes()
