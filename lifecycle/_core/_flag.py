"""A command-line flag, declared once: name, type, default, help and check.

:class:`Flag` is what a command's option, a configuration builder's keyword and
a row of the docs' table of flags are made from (``lifecycle/server/_flags.py``
declares the flags of ``lifecycle serve``; ``lifecycle/cli/_serve.py`` makes the
options). Pure Python, like the rest of the core: no command-line framework.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

__all__ = ["Check", "Flag", "docs_table"]

_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
# A parenthesis of links only ("([why](a.md); [benchmark](b.md))"): pointers for the docs.
_LINKS_ONLY = re.compile(r" ?\((?:\[[^\]]+\]\([^)]*\)(?:; )?)+\)")

#: ``check(value, flag, field=None)``: the value, or a ``ValueError`` naming
#: ``flag`` (and ``field``, the attribute it sets, when given) and showing it.
Check = Callable[..., Any]


@attrs.frozen
class Flag:
    """One flag: what its command-line option, its keyword and its row in the docs say.

    Attributes:
        name: Its keyword (``ServerConfig.from_flags(max_loaded=...)``); the
            flag is ``--<name>``.
        type: ``int``, ``float``, ``str``, ``bool``, or ``list`` (of ``str``: the
            flag is repeated).
        default: Its value when not given; ``None``: not set.
        help: What it does, in Markdown: the docs' table shows it as is,
            ``--help`` without the links and backticks.
        check: Checks a value given (:data:`Check`); ``None`` for a flag checked
            only with the others it goes with.
        shown_default: The default in words, when ``default`` does not say it
            (``None`` that means "32", a number better in MiB); Markdown.
        option: The switch, when it is not ``--<name>``: ``--no_admin_api``
            turns ``admin_api`` (``True`` by default) off.
        aliases: Other spellings of the switch (Triton's dashes).
        metavar: How ``--help`` names the value, when not by its type.
    """

    name: str
    type: type
    default: Any
    help: str
    check: Check | None = None
    shown_default: str | None = None
    option: str | None = None
    aliases: tuple[str, ...] = ()
    metavar: str | None = None

    @property
    def flag(self) -> str:
        """The switch on the command line."""
        return self.option or f"--{self.name}"

    @property
    def plain_help(self) -> str:
        """:attr:`help` as ``--help`` shows it: a sentence, without links and backticks."""
        text = _LINK.sub(r"\1", _LINKS_ONLY.sub("", self.help))
        if text[:1].isalpha():  # not code
            text = text[:1].upper() + text[1:]
        return text.replace("`", "") + ("" if text.endswith(".") else ".")

    @property
    def plain_default(self) -> str:
        """:attr:`shown` without backticks."""
        return self.shown.replace("`", "")

    @property
    def shown(self) -> str:
        """The default as the docs show it (Markdown); empty when there is none."""
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None or self.type is list:
            return ""
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, str):
            return f"`{self.default}`"
        return f"{self.default:g}"


def docs_table(flags: Sequence[Flag]) -> str:
    """The Markdown table of ``flags`` that the docs show (docs/serving.md).

    Returns:
        A header row, a rule and a row per flag, each line ending in a newline.
    """
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    for flag in flags:
        names = ", ".join(f"`{name}`" for name in (flag.flag, *flag.aliases))
        lines.append(f"| {names} | {flag.shown} | {flag.help} |".replace("|  |", "| |"))
    return "".join(f"{line}\n" for line in lines)
