"""The ``lifecycle`` command line: ``soak``, ``inspect`` and ``version``.

Needs the ``cli`` extra (typer and rich); ``soak --plot`` needs ``plot``
(matplotlib). A missing extra is reported with the ``pip install`` that fixes it.

One module per command (``_soak``, ``_inspect``, ``_version``) behind a thin
application (``_app``) that registers them.
"""

from ._app import build_app as build_app
from ._app import main as main

__all__ = ["build_app", "main"]
