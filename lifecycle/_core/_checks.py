"""Argument checks shared by the public API, with messages that show the value.

Every check names the argument as the caller spells it and shows what it
received, in Keras's form: "`max_loaded` must be an int >= 1 or None.
Received: max_loaded=0".
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "check_int",
    "check_label",
    "check_model_name",
    "check_optional_int",
    "check_timeout",
    "check_version",
    "is_int",
]


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int and not a bool (``True`` is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(
    value: Any, name: str, *, minimum: int = 0, maximum: int | None = None, what: str = "an int"
) -> int:
    """Validate an int in ``minimum..maximum`` (bools refused).

    Args:
        value: What the caller passed.
        name: The argument's name, as the caller spells it.
        minimum: The smallest value allowed.
        maximum: The largest value allowed, or ``None`` for no bound.
        what: How the message names the expected value ("a number of bytes").

    Raises:
        ValueError: Naming the argument and showing the received value.
    """
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
        expected = _expected(what, minimum, maximum)
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")
    return value


def check_optional_int(
    value: Any, name: str, *, minimum: int = 0, maximum: int | None = None, what: str = "an int"
) -> int | None:
    """:func:`check_int`, or ``None`` for "no limit".

    Raises:
        ValueError: Naming the argument and showing the received value.
    """
    if value is None:
        return None
    try:
        return check_int(value, name, minimum=minimum, maximum=maximum, what=what)
    except ValueError:
        expected = _expected(what, minimum, maximum)
        raise ValueError(
            f"`{name}` must be {expected} or None. Received: {name}={value!r}"
        ) from None


def _expected(what: str, minimum: int, maximum: int | None) -> str:
    """The expected value in words: "an int >= 0", "a positive int", "an int from 1 to 19"."""
    if maximum is not None:
        return f"{what} from {minimum} to {maximum}"
    if minimum == 1:
        return "a positive " + what.split(" ", 1)[1]
    return f"{what} >= {minimum}"


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


def check_model_name(name: Any) -> str:
    """``name`` if it is a non-empty string without ``/``; otherwise a clear error."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(
            f"A model name must be a non-empty string without `/`. Received: name={name!r}"
        )
    return name


def check_version(version: Any) -> int:
    """``version`` if it is an int >= 0; otherwise a clear error."""
    if not is_int(version) or version < 0:
        raise ValueError(f"A version must be an int >= 0. Received: version={version!r}")
    return version


def check_label(label: Any) -> str:
    """``label`` if it is a non-empty string; otherwise a clear error."""
    if not isinstance(label, str) or not label:
        raise ValueError(f"A label must be a non-empty string. Received: label={label!r}")
    return label
