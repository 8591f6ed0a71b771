"""``lifecycle serve``: the model registry behind TensorFlow Serving's and KServe's APIs.

The command's options are made from the flags' declarations
(``lifecycle/server/_flags.py``, and ``--allocator`` of ``_allocator``): one
typer option per flag, with its type, default and help. The flags are
TensorFlow Serving's model server's where they mean the same, and Triton's for
its model repository. The command builds its config from them
(``ServerConfig.from_flags``, which imports no TensorFlow) before TensorFlow is
imported, so a bad one is refused at once; the library, TensorFlow and the
server are imported only when the command runs, so ``--help`` answers at once
too.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.markup import escape

from .._core._flag import Flag
from ._allocator import ALLOCATOR, choose_allocator
from ._console import console
from ._quiet import filtered_stderr, import_library

try:
    from ..server import _flags
except ImportError as error:  # the serve extra is missing: the command says so when run
    _flags = None  # type: ignore[assignment]
    _MISSING: ImportError | None = error
else:
    _MISSING = None

SERVE_INSTALL = 'pip install "keras-lifecycle[serve]"'
SERVE_HELP = """Serve models over TensorFlow Serving's REST and gRPC APIs and KServe's v2 protocol.

The ports open once the models are loaded and warmed up. SIGTERM or SIGINT
stops accepting, drains requests in flight, unloads every version and exits 0.
"""
# Arguments of a command that only says that the serve extra is missing.
_ANY_ARGUMENTS = {"allow_extra_args": True, "ignore_unknown_options": True}


def serve_flags() -> tuple[Flag, ...]:
    """The flags of ``lifecycle serve``: the server's, then the process's ``--allocator``."""
    return (*(() if _flags is None else _flags.FLAGS), ALLOCATOR)


def refuse(error: Exception) -> typer.Exit:
    """Print ``error`` on one line of stderr, as a usage error; the exit (status 2) to raise."""
    message = " ".join(str(error).split())
    typer.echo(f"lifecycle serve: {message}", err=True)
    return typer.Exit(2)


def option(flag: Flag) -> inspect.Parameter:
    """The typer parameter of ``flag``: its option's switch, type, default and help."""
    annotation: Any
    text, shown = flag.plain_help, False
    if flag.type is bool:
        # A switch sets the value that is not the default (--no_admin_api: admin_api off).
        annotation, default = bool, False if flag.option else flag.default
    elif flag.type is list:
        annotation, default = list[str] | None, None
    else:
        annotation, default = flag.type | None, flag.default
        if flag.shown_default is None:
            shown = default is not None  # typer shows the value
        elif flag.plain_default:  # a default in words
            text += f" Default: {flag.plain_default}."
    info = typer.Option(
        default,
        flag.flag,
        *flag.aliases,
        help=escape(text),
        metavar=flag.metavar,
        show_default=shown,
    )
    kind = inspect.Parameter.KEYWORD_ONLY
    return inspect.Parameter(flag.name, kind, default=info, annotation=annotation)


def server_flags(given: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``ServerConfig.from_flags`` of the options' values."""
    assert _flags is not None
    flags = {}
    for flag in _flags.FLAGS:
        value = given[flag.name]
        if flag.type is bool and flag.option:
            value = not value
        elif flag.type is list:
            value = tuple(value or ())
        flags[flag.name] = value
    return flags


def serve_command() -> tuple[Callable[..., None], dict[str, Any]]:
    """The ``serve`` command, its options made from :func:`serve_flags`.

    Returns:
        The command function and its context settings (for ``app.command``).
    """
    if _flags is None:
        return missing_extra, _ANY_ARGUMENTS
    parameters = [option(flag) for flag in serve_flags()]

    def serve(**given: Any) -> None:
        run(given)

    serve.__doc__ = SERVE_HELP
    serve.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    # typer reads the annotations too (typing.get_type_hints).
    serve.__annotations__ = {p.name: p.annotation for p in parameters}
    return serve, {}


def run(given: dict[str, Any]) -> None:
    """Build the config of the flags, then start the server (what ``lifecycle serve`` does)."""
    from ..server._config import ServerConfig  # no TensorFlow

    flags = server_flags(given)
    # Read once, by `import lifecycle` before TensorFlow starts (a --model_factory
    # module may start it): a serving process gives an unloaded version's memory
    # back (docs/allocator.md).
    choose_allocator(given[ALLOCATOR.name])
    if flags["model_factory"] and os.getcwd() not in sys.path:
        # Factories of the project are importable, but last: a file in the
        # directory the server starts in cannot shadow the standard library or
        # an installed package (a `json.py` there would run at the next import).
        sys.path.append(os.getcwd())
    # Before TensorFlow is imported (seconds), so that a bad flag is refused at once.
    try:
        with filtered_stderr():  # TensorFlow's start-up noise, if a factory's module starts it
            config = ServerConfig.from_flags(**flags)
    except (ValueError, FileNotFoundError) as error:
        raise refuse(error) from None
    import_library()
    try:
        from ..server import serve as serve_config
    except ImportError as error:
        missing(error)
    serve_config(config)


def missing(error: ImportError) -> None:
    """Say that the serve extra is missing, and exit 2."""
    console().print(
        f"lifecycle serve needs the serve extra: {SERVE_INSTALL} ({error})", markup=False
    )
    raise typer.Exit(2)


def missing_extra() -> None:
    """Serve models over TensorFlow Serving's and KServe's APIs (needs the serve extra)."""
    assert _MISSING is not None
    missing(_MISSING)
