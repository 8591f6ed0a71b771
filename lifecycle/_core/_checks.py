"""Argument checks shared by the public API, with messages that show the value.

Every check names the argument as the caller spells it and shows what it
received, in Keras's form: "`max_loaded` must be an int >= 1 or None.
Received: max_loaded=0". A name that starts with ``--`` is a command-line flag,
named as typed: "--max_loaded must be an integer >= 1 or None. Received: 0";
with ``field``, the message also names the attribute the flag sets
("Received: max_loaded=1.5"), for a value set in code rather than on a command
line.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "LABEL_SYNTAX",
    "check_int",
    "check_label",
    "check_model_name",
    "check_number",
    "check_optional_int",
    "check_timeout",
    "check_version",
    "invalid",
    "is_int",
    "is_number",
]

#: TensorFlow Serving's version labels: what a REST path ``/labels/<label>`` addresses.
LABEL_SYNTAX = "[a-zA-Z0-9_]+"
_LABEL = re.compile(LABEL_SYNTAX)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int and not a bool (``True`` is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def invalid(name: str, expected: str, value: Any, *, field: str | None = None) -> ValueError:
    """The error for an argument (or a ``--flag``) whose value is not what it must be.

    Args:
        name: The argument's name as the caller spells it, or a flag (``--port``).
        expected: What it must be, in words ("an int >= 0").
        value: What it received.
        field: The attribute a flag sets, when the value was set in code.

    Returns:
        A ``ValueError`` to raise.
    """
    if name.startswith("--"):
        received = repr(value) if field is None else f"{field}={value!r}"
        return ValueError(f"{name} must be {expected}. Received: {received}")
    return ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


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
        raise invalid(name, _expected(what, minimum, maximum), value)
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
        raise invalid(name, f"{_expected(what, minimum, maximum)} or None", value) from None


def _expected(what: str, minimum: int, maximum: int | None) -> str:
    """The expected value in words: "an int >= 0", "a positive int", "an int from 1 to 19"."""
    if maximum is not None:
        return f"{what} from {minimum} to {maximum}"
    if minimum == 1:
        return "a positive " + what.split(" ", 1)[1]
    return f"{what} >= {minimum}"


def check_number(
    value: Any,
    name: str,
    *,
    minimum: float = 0,
    above: bool = False,
    maximum: float | None = None,
    integer: bool = False,
    optional: bool = False,
    what: str | None = None,
    field: str | None = None,
) -> Any:
    """Validate a number from ``minimum`` (excluded with ``above``) to ``maximum``.

    The check of a server flag or setting: ``name`` is usually the flag
    (``--drain_seconds``). NaN and bools are refused.

    Args:
        value: What the caller passed.
        name: The argument's name, or the flag.
        minimum: The smallest value allowed (or the bound above which values are,
            with ``above``).
        above: ``minimum`` itself is refused.
        maximum: The largest value allowed, or ``None`` for no bound.
        integer: Only ints.
        optional: ``None`` is allowed ("not set").
        what: How the message names the expected value, instead of the range
            in words ("a port number, 0-65535").
        field: The attribute a flag sets, named in the message as well.

    Returns:
        ``value``.

    Raises:
        ValueError: Naming the argument and showing the received value.
    """
    if value is None and optional:
        return None
    ok = is_int(value) if integer else is_number(value)
    if ok:  # NaN fails the comparisons
        ok = (value > minimum if above else value >= minimum) and (
            maximum is None or value <= maximum
        )
    if not ok:
        if what is None:
            what = f"{'an integer' if integer else 'a number'} {'>' if above else '>='} {minimum:g}"
            if maximum is not None:
                what += f" and <= {maximum:g}"
        raise invalid(name, f"{what} or None" if optional else what, value, field=field)
    return value


def check_timeout(value: Any, name: str = "timeout") -> float | None:
    """Validate a timeout in seconds: a number >= 0, or None for no limit.

    Raises:
        ValueError: Naming the argument and showing the received value.
    """
    if value is None:
        return None
    if not is_number(value) or value < 0:
        raise invalid(name, "a number of seconds >= 0 or None", value)
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
    """``label`` if it is a version label in TensorFlow Serving's syntax; otherwise a clear error.

    One rule for the registry, the server's admin API and a model config file's
    ``version_labels``: ``[a-zA-Z0-9_]+``, the labels a TensorFlow Serving REST
    path (``/v1/models/<model>/labels/<label>``) can name.

    Example:
        >>> check_label("canary")
        'canary'
    """
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        raise ValueError(
            f"A version label must match {LABEL_SYNTAX} (TensorFlow Serving's labels: a "
            f"non-empty string of ASCII letters, digits and underscores). Received: label={label!r}"
        )
    return label
