"""What the fuzzing suite (``tests/test_server_fuzz.py``) shares: budgets, bounds, inputs.

Each decoder of ``lifecycle serve`` is driven with generated input. Two properties
hold for every input:

* it returns a value or raises the library's error for bad input (a client
  error for a request, ``ValueError`` naming the flag for a file), never
  another exception;
* what it allocates while it runs is bounded by the input's size
  (:func:`bounded_allocation`, read by ``tracemalloc``, which sees Python
  objects and NumPy's buffers).

``make test`` runs :data:`EXAMPLES` inputs per decoder; ``make fuzz`` runs many
more (``LIFECYCLE_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import os
import tracemalloc
from collections.abc import Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("LIFECYCLE_FUZZ_EXAMPLES", "150"))
"""Inputs per decoder: a bounded run in ``make test``, a long one in ``make fuzz``."""

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=EXAMPLES <= 150,  # the bounded run is the same on every machine
)
"""The settings of every fuzzing test."""

# Python objects and arrays made from a byte of input: a JSON "[0]," is 4 bytes
# and becomes a list (56 bytes), a pointer and an array element. A decoder that
# trusts a size the input claims allocates thousands of times its bytes.
ALLOCATION_FACTOR = 96
ALLOCATION_SLACK = 2 * 2**20


@contextlib.contextmanager
def bounded_allocation(size: int, what: str) -> Iterator[None]:
    """Fail if the block's peak allocation exceeds a small multiple of ``size`` bytes."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    limit = ALLOCATION_FACTOR * size + ALLOCATION_SLACK
    assert peak - before <= limit, (
        f"{what}: decoding {size} bytes allocated {peak - before} bytes at its peak, "
        f"over {limit} ({ALLOCATION_FACTOR}x its size + {ALLOCATION_SLACK})"
    )


def tokens(vocabulary: list[str]) -> st.SearchStrategy[str]:
    """Text made of ``vocabulary``'s tokens and some noise: close to a grammar, and off it."""
    token = st.one_of(
        st.sampled_from(vocabulary),
        st.integers(-(2**70), 2**70).map(str),
        st.text(max_size=8).map(lambda t: '"' + t.replace('"', "") + '"'),
        st.text(max_size=4),
    )
    return st.lists(token, max_size=60).map(" ".join)


SIZES = st.one_of(
    st.integers(0, 6),
    st.sampled_from([-1, 2**31, 2**40, 2**62, 2**63 - 1, 2**64, 25_000_000]),
)
"""Dimensions, from small to hostile."""

SHAPES = st.lists(SIZES, max_size=6)
"""Shapes, from scalars to hostile."""

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=40,
)
"""Any JSON value."""


def numbers(shape: tuple[int, ...]) -> st.SearchStrategy[object]:
    """Nested lists of numbers of ``shape`` (small sizes): what a well-formed tensor looks like."""
    if not shape:
        return st.integers(-5, 5) | st.floats(-1e3, 1e3)
    return st.lists(numbers(shape[1:]), min_size=shape[0], max_size=shape[0])


TENSORS = st.lists(st.integers(0, 3), max_size=3).flatmap(lambda s: numbers(tuple(s)))
"""Nested lists of numbers, rectangular."""


def nested(depth: int) -> bytes:
    """JSON nested ``depth`` arrays deep: ``[[[...]]]``."""
    return b"[" * depth + b"0" + b"]" * depth
