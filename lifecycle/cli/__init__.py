"""The ``lifecycle`` command line: ``soak``, ``inspect``, ``serve`` and ``version``.

Needs the ``cli`` extra (typer and rich); ``soak --plot`` needs ``plot``
(matplotlib). A missing extra is reported with the ``pip install`` that fixes it.

One module per command (``_soak``, ``_inspect``, ``_serve``, ``_version``) behind a thin
application (``_app``) that registers them.

The ``lifecycle`` entry point (``lifecycle_cli``) loads this package without its
parent, whose ``__init__`` imports TensorFlow, so that ``--help`` and ``version``
answer at once; the commands that use the library import it through
``_quiet.import_library``. Inside this package, import a submodule as
``from ._x import name``: ``from . import _x`` makes the import system load the
parent package too.
"""

from ._app import build_app as build_app
from ._app import main as main

__all__ = ["build_app", "main"]
