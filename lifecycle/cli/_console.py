"""What the commands share: the console they print to, and the error of a missing extra."""

from __future__ import annotations

import sys
from typing import Any

CLI_INSTALL = 'pip install "keras-lifecycle[cli]"'


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message is the fix."""


def require_cli() -> None:
    """Check that the ``cli`` extra (typer and rich) is installed.

    Raises:
        MissingExtraError: It is not; the message names the ``pip install``.
    """
    try:
        import rich  # noqa: F401
        import typer  # noqa: F401
    except ImportError as error:
        raise MissingExtraError(
            f"The lifecycle command line needs typer and rich: {CLI_INSTALL}"
        ) from error


def console() -> Any:
    """A rich console; 120 columns when the output is not a terminal (logs, CI)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 120)
