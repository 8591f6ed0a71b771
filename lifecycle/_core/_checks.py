"""Argument checks shared by the public API, with messages that show the value."""

from __future__ import annotations

from typing import Any


def check_timeout(value: Any, name: str = "timeout") -> float | None:
    """Validate a timeout in seconds: a number >= 0, or None for no limit.

    Raises:
        ValueError: Naming the argument and showing the received value.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(
            f"`{name}` must be a number of seconds >= 0 or None. Received: {name}={value!r}"
        )
    return float(value)
