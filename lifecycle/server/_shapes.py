"""The shape a request declares for an input, checked before anything is allocated for it.

A wire format states a tensor's shape apart from its values (a ``TensorProto``'s
``tensor_shape``, a KServe v2 tensor's ``shape``). The shape alone is checked
first, against the signature of the version that serves the request and the
server's row limit; the decoder then takes exactly as many values as it says,
from what the request sent. Nothing is sized by the shape before both checks.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._registry import NamedTensorSpec
from ._errors import BadRequestError

__all__ = ["MAX_ELEMENTS", "MAX_RANK", "check_shape", "element_count"]

MAX_RANK = 64
"""The most dimensions a request's tensor may have: NumPy's limit for an array."""

MAX_ELEMENTS = 2**59
"""The product of a shape's non-zero dimensions must stay below this.

Sixteen bytes (a complex128) times this still fits NumPy's 63-bit sizes, so even
an empty tensor (a zero among its dimensions) has a shape NumPy can make.
"""


def element_count(name: str, shape: Sequence[int]) -> int:
    """The number of values a tensor of ``shape`` holds, checked for sizes no array can have.

    Args:
        name: The input, for messages.
        shape: The declared dimensions.

    Returns:
        The product of the dimensions (0 when one of them is 0).

    Raises:
        BadRequestError: A dimension is negative, there are more than
            :data:`MAX_RANK` of them, or their product (zeros aside) reaches
            :data:`MAX_ELEMENTS`.

    Example:
        >>> element_count("x", [2, 3])
        6
    """
    if len(shape) > MAX_RANK:
        raise BadRequestError(
            f"Input {name!r} declares {len(shape)} dimensions; a tensor has at most {MAX_RANK}."
        )
    count, capacity = 1, 1
    for size in shape:
        if size < 0:
            raise BadRequestError(
                f"Input {name!r} declares shape {_shown(shape)}: a dimension cannot be "
                "negative (-1 is for signatures, not for values). Send the tensor's actual shape."
            )
        count *= size
        capacity *= max(size, 1)
        # Checked at each step: the product of many large sizes is never computed.
        if capacity >= MAX_ELEMENTS:
            raise BadRequestError(
                f"Input {name!r} declares shape {_shown(shape)}, too large for any array (its "
                "non-zero dimensions multiply to 2**59 or more). Send the tensor's actual shape."
            )
    return count


def check_shape(
    name: str,
    shape: Sequence[int],
    spec: NamedTensorSpec | None = None,
    max_rows: int | None = None,
) -> int:
    """Check a declared shape against its input's spec and the row limit; its element count.

    Args:
        name: The input, for messages.
        shape: The declared dimensions.
        spec: The signature's input: the rank and each known dimension must match.
        max_rows: The most rows (the first dimension) a request may hold
            (``--max_request_rows``).

    Returns:
        The number of values the shape holds.

    Raises:
        BadRequestError: The shape is impossible (see :func:`element_count`),
            does not fit ``spec``, or has more than ``max_rows`` rows.
    """
    count = element_count(name, shape)
    if spec is not None:
        fits = len(shape) == len(spec.shape) and all(
            want is None or want == got for want, got in zip(spec.shape, shape, strict=True)
        )
        if not fits:
            wanted = tuple(-1 if d is None else d for d in spec.shape)
            raise BadRequestError(
                f"Input {name!r} has shape {tuple(shape)}, but the model takes {wanted} "
                "(-1: any size)."
            )
    if max_rows is not None and shape and shape[0] > max_rows:
        raise BadRequestError(
            f"Input {name!r} has {shape[0]} rows (its first dimension); a request may hold at "
            f"most {max_rows} (--max_request_rows). Send fewer rows per request, or start the "
            "server with a larger --max_request_rows."
        )
    return count


def _shown(shape: Sequence[int]) -> str:
    """A shape for a message, shortened: a hostile one may have many dimensions."""
    listed = list(shape)
    if len(listed) <= 8:
        return str(listed)
    return f"[{', '.join(map(str, listed[:8]))}, ...] ({len(listed)} dimensions)"
