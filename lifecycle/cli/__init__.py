"""The ``lifecycle`` command line: ``soak``, ``inspect``, ``serve`` and ``version``.

Needs the ``cli`` extra (typer and rich); ``soak --plot`` needs ``plot``
(matplotlib). A missing extra is reported with the ``pip install`` that fixes it.

One module per command (``_soak``, ``_inspect``, ``_serve``, ``_version``), each a
plain function, and a thin application (``_app``) that registers them; the
commands import ``_console`` (the console they share), never ``_app``.

The ``lifecycle`` entry point is :func:`main` (``python -m lifecycle.cli`` too).
``--help`` and ``version`` answer at once: ``import lifecycle`` imports no
TensorFlow, nothing in this package imports it at module level, and the
commands that use the library import it as they run, through
``_quiet.import_library``.
"""

from typing import TYPE_CHECKING

from .._core._lazy import attach

if TYPE_CHECKING:
    from ._app import build_app as build_app
    from ._app import main as main

__getattr__, __dir__, __all__ = attach(__name__)
