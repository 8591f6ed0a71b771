"""The shape a request declares for an input, checked before anything is allocated for it.

A wire format states a tensor's shape apart from its values (a ``TensorProto``'s
``tensor_shape``, a KServe v2 tensor's ``shape``). The shape alone is checked
first, against the signature of the version that serves the request and the
server's row limit; the decoder then takes exactly as many values as it says,
from what the request sent. Nothing is sized by the shape before both checks.

Both protocols carry narrow integers (int8, uint16...) in wider typed fields
(``int_val``, ``int_contents``): :func:`narrowed` range-checks them, once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._registry import NamedTensorSpec
from ._errors import BadRequestError

__all__ = ["MAX_ELEMENTS", "MAX_RANK", "check_shape", "narrowed"]

#: The most dimensions a request's tensor may have: NumPy's limit for an array.
MAX_RANK = 64

#: The product of a shape's non-zero dimensions must stay below this. Sixteen
#: bytes (a complex128) times this still fits NumPy's 63-bit sizes, so even an
#: empty tensor (a zero among its dimensions) has a shape NumPy can make.
MAX_ELEMENTS = 2**59


def check_shape(
    name: str,
    shape: Sequence[int],
    spec: NamedTensorSpec | None = None,
    max_rows: int | None = None,
) -> int:
    """The number of values a declared shape holds, once checked: possible, fitting, in rows.

    A shape is possible if an array can have it; it fits ``spec`` if it has
    its rank and each known dimension; it is in rows if its first dimension
    is at most ``max_rows``.

    Args:
        name: The input, for messages.
        shape: The declared dimensions.
        spec: The signature's input: the rank and each known dimension must match
            (:meth:`NamedTensorSpec.check_shape`).
        max_rows: The most rows (the first dimension) a request may hold
            (``--max_request_rows``).

    Returns:
        The product of the dimensions (0 when one of them is 0).

    Raises:
        BadRequestError: A dimension is negative, there are more than
            :data:`MAX_RANK` of them, or their product (zeros aside) reaches
            :data:`MAX_ELEMENTS`; or the shape does not fit ``spec``, or has
            more than ``max_rows`` rows.

    Example:
        >>> check_shape("x", [2, 3])
        6
    """
    if len(shape) > MAX_RANK:
        raise BadRequestError(
            f"Input {name!r} declares {len(shape)} dimensions; a tensor has at most {MAX_RANK}."
        )
    if any(size < 0 for size in shape):
        raise BadRequestError(
            f"Input {name!r} declares shape {_shown(shape)}: a dimension cannot be "
            "negative (-1 is for signatures, not for values). Send the tensor's actual shape."
        )
    # At most MAX_RANK factors: the product is cheap to compute exactly.
    if math.prod(max(size, 1) for size in shape) >= MAX_ELEMENTS:
        raise BadRequestError(
            f"Input {name!r} declares shape {_shown(shape)}, too large for any array (its "
            "non-zero dimensions multiply to 2**59 or more). Send the tensor's actual shape."
        )
    if spec is not None:
        try:
            spec.check_shape(shape, name)
        except ValueError as error:  # the client's: a refused request, as the others above
            raise BadRequestError(*error.args) from None
    if max_rows is not None and shape and shape[0] > max_rows:
        raise BadRequestError(
            f"Input {name!r} has {shape[0]} rows (its first dimension); a request may hold at "
            f"most {max_rows} (--max_request_rows). Send fewer rows per request, or start the "
            "server with a larger --max_request_rows."
        )
    return math.prod(shape)


def narrowed(name: str, values: np.ndarray, dtype: np.dtype, refusal: str) -> np.ndarray:
    """Integers read from a wider field (an ``int32`` one, say) as ``dtype``, once they all fit it.

    Args:
        name: The input, for the message.
        values: The integers, as the field holds them.
        dtype: The narrower integer type they are for.
        refusal: What the message says after the input's name if one does not
            fit, formatted with ``low`` and ``high`` (``dtype``'s range) and
            ``least`` and ``most`` (the values').

    Raises:
        BadRequestError: A value is outside ``dtype``'s range.

    Example:
        >>> narrowed("x", np.array([1, 2], np.int32), np.dtype("i1"), "{least}..{most}").dtype
        dtype('int8')
    """
    info = np.iinfo(dtype)
    if values.size and (values.min() < info.min or values.max() > info.max):
        least, most = int(values.min()), int(values.max())
        raise BadRequestError(
            f"Input {name!r}: "
            + refusal.format(low=info.min, high=info.max, least=least, most=most)
        )
    return values.astype(dtype, copy=False)


def _shown(shape: Sequence[int]) -> str:
    """A shape for a message, shortened: a hostile one may have many dimensions."""
    listed = list(shape)
    if len(listed) <= 8:
        return str(listed)
    return f"[{', '.join(map(str, listed[:8]))}, ...] ({len(listed)} dimensions)"
