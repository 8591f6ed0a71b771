"""The ``lifecycle`` application: the typer app, with every command registered.

The commands are plain functions in their modules (``_soak``, ``_inspect``,
``_serve``, ``_version``), which never import this one: the application depends
on them, not the other way round. typer and the command modules are imported by
:func:`build_app`, once the ``cli`` extra is known to be installed, so that a
missing extra gives the ``pip install`` that fixes it rather than a traceback.
"""

from __future__ import annotations

import sys
from typing import Any

from ._console import MissingExtraError, require_cli

__all__ = ["build_app", "main"]


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
    from ._serve import serve_command
    from ._soak import soak
    from ._version import version

    app = typer.Typer(
        help="keras-lifecycle: watch Keras models give their memory back.",
        no_args_is_help=True,
        add_completion=False,
    )
    app.command(cls=Command)(soak)
    serve, settings = serve_command()
    app.command("serve", cls=Command, context_settings=settings)(serve)
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
