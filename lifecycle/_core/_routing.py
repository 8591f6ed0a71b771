"""Weighted, optionally sticky choice among routing targets. Pure Python.

Stickiness uses BLAKE2b of the key, so the same key picks the same target in
every process and after restarts; Python's ``hash()`` is salted per process and
does not qualify.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

__all__ = ["check_key", "check_weights", "key_fraction", "pick"]


def key_fraction(key: str | bytes | int) -> float:
    """A stable number in [0, 1) for a routing key.

    Raises:
        TypeError: The key is not a str, bytes or int.
    """
    check_key(key)
    if isinstance(key, str):
        data = key.encode("utf-8")
    elif isinstance(key, bytes):
        data = key
    else:
        data = str(key).encode("ascii")
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def check_key(key: object) -> None:
    """Raise TypeError unless ``key`` is a str, bytes or int (not bool)."""
    if not isinstance(key, (str, bytes, int)) or isinstance(key, bool):
        raise TypeError(
            f"A routing `key` must be a str, bytes or int. Received: key={key!r} "
            f"of type {type(key).__name__}"
        )


def check_weights(weights: Mapping[Hashable, Any]) -> list[tuple[Hashable, float]]:
    """Validate route weights; returns ``(target, weight)`` pairs in the given order.

    Raises:
        TypeError: ``weights`` is not a mapping, or a weight is not a number.
        ValueError: A weight is negative or not finite, or the total is not positive.
    """
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"Route weights must be a mapping {{label_or_version: weight}}. Received: {weights!r}"
        )
    pairs = []
    for target, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise TypeError(f"Route weights must be numbers. Received: {target!r}: {weight!r}")
        if not weight >= 0 or weight == float("inf"):
            raise ValueError(
                f"Route weights must be finite and >= 0. Received: {target!r}: {weight!r}"
            )
        pairs.append((target, float(weight)))
    if not sum(weight for _, weight in pairs) > 0:
        raise ValueError(f"Route weights must add up to a positive total. Received: {weights!r}")
    return pairs


def pick(pairs: Sequence[tuple[Hashable, float]], key: str | bytes | int | None = None) -> Any:
    """Choose a target by weight; the same ``key`` always chooses the same target."""
    total = sum(weight for _, weight in pairs)
    point = (key_fraction(key) if key is not None else random.random()) * total
    for target, weight in pairs:
        if point < weight:
            return target
        point -= weight
    return next(target for target, weight in reversed(pairs) if weight > 0)
