"""The argument checks of lifecycle/_core/_checks.py: messages that name and show."""

from __future__ import annotations

import math

import pytest

from lifecycle._core._checks import (
    check_int,
    check_label,
    check_number,
    check_optional_int,
    invalid,
)


def test_an_argument_is_named_in_backticks_and_a_flag_as_typed():
    assert str(invalid("max_loaded", "an int", 1.5)) == (
        "`max_loaded` must be an int. Received: max_loaded=1.5"
    )
    assert str(invalid("--max_loaded", "an int", 1.5)) == (
        "--max_loaded must be an int. Received: 1.5"
    )
    assert str(invalid("--port", "a port", -1, field="grpc_port")) == (
        "--port must be a port. Received: grpc_port=-1"
    )


def test_the_int_checks_keep_their_messages():
    with pytest.raises(ValueError, match=r"^`n` must be a positive int\. Received: n=0$"):
        check_int(0, "n", minimum=1)
    with pytest.raises(ValueError, match=r"^`n` must be an int >= 0 or None\. Received: n=-1$"):
        check_optional_int(-1, "n")
    assert check_optional_int(None, "n") is None


@pytest.mark.parametrize(
    ("value", "rule", "expected"),
    [
        (1.5, {"integer": True, "minimum": 1}, "an integer >= 1"),
        (True, {"integer": True}, "an integer >= 0"),
        (0, {"above": True}, "a number > 0"),
        (math.nan, {}, "a number >= 0"),
        ("3", {}, "a number >= 0"),
        (70000, {"integer": True, "maximum": 65535, "what": "a port"}, "a port"),
        (None, {"minimum": 1}, "a number >= 1"),
        (-1, {"minimum": 1, "optional": True}, "a number >= 1 or None"),
        (11, {"maximum": 10}, "a number >= 0 and <= 10"),
    ],
)
def test_check_number_refuses_naming_the_range(value, rule, expected):
    with pytest.raises(ValueError) as caught:
        check_number(value, "--x", **rule)
    assert str(caught.value) == f"--x must be {expected}. Received: {value!r}"


def test_check_number_returns_what_it_accepts():
    assert check_number(0, "--x") == 0
    assert check_number(2.5, "--x", above=True) == 2.5
    assert check_number(None, "--x", optional=True) is None
    assert check_number(65535, "--x", integer=True, maximum=65535) == 65535


@pytest.mark.parametrize("label", ["stable", "canary_2", "A", "2", "_"])
def test_a_label_of_letters_digits_and_underscores_is_accepted(label):
    assert check_label(label) == label


@pytest.mark.parametrize("label", ["", "canary-1", "a b", "a/b", "é", "stable\n", 3, None])
def test_any_other_label_is_refused_with_tensorflow_servings_syntax(label):
    with pytest.raises(ValueError) as caught:
        check_label(label)
    message = str(caught.value)
    assert message.startswith("A version label must match [a-zA-Z0-9_]+ ")
    assert "non-empty string" in message
    assert message.endswith(f"Received: label={label!r}")
