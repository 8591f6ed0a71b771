"""The ``lifecycle`` application: the typer app, its commands, the console they share.

typer and the command modules are imported by :func:`build_app`, once the ``cli``
extra is known to be installed, so that a missing extra gives the ``pip install``
that fixes it rather than a traceback.
"""

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


def build_app() -> Any:
    """The typer application with every command registered.

    Returns:
        A ``typer.Typer``.

    Raises:
        MissingExtraError: typer or rich is not installed.
    """
    require_cli()
    import typer

    from ._command import Command
    from ._inspect import CONTEXT_SETTINGS, inspect
    from ._serve import serve
    from ._soak import soak
    from ._version import version

    app = typer.Typer(
        help="keras-lifecycle: watch Keras models give their memory back.",
        no_args_is_help=True,
        add_completion=False,
    )
    app.command(cls=Command)(soak)
    app.command(cls=Command)(serve)
    app.command(cls=Command, context_settings=CONTEXT_SETTINGS)(inspect)
    app.command(cls=Command)(version)
    return app


def main() -> None:
    """Entry point of the ``lifecycle`` command."""
    try:
        app = build_app()
    except MissingExtraError as error:
        print(error, file=sys.stderr)
        raise SystemExit(2) from None
    app()
