"""Entry point of the ``lifecycle`` command, outside the package.

Importing ``lifecycle.cli`` the usual way first runs ``lifecycle/__init__.py``,
which imports TensorFlow: seconds of start-up and a screen of native notices
that ``--help`` and ``version`` do not need. So this module loads the
``lifecycle.cli`` subpackage on its own, without running its parent's
``__init__``; the commands that use the library import it themselves
(``lifecycle/cli/_quiet.py``, which also filters those notices). Nothing in
``lifecycle/cli/`` imports its parent package at module level.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["main"]


def _load_cli() -> ModuleType:
    """``lifecycle.cli``, without running ``lifecycle/__init__.py`` if it has not run yet."""
    if "lifecycle" in sys.modules or "lifecycle.cli" in sys.modules:
        return importlib.import_module("lifecycle.cli")
    package = importlib.util.find_spec("lifecycle")  # a top-level name: found, not run
    spec = None
    if package is not None and package.submodule_search_locations is not None:
        spec = importlib.machinery.PathFinder.find_spec(
            "lifecycle.cli", package.submodule_search_locations
        )
    if spec is None or spec.loader is None:  # not an ordinary package on disk
        return importlib.import_module("lifecycle.cli")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lifecycle.cli"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["lifecycle.cli"]
        raise
    return module


def main() -> None:
    """Run the ``lifecycle`` command."""
    _load_cli().main()
