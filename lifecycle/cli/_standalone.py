"""Loading a pure-Python module of the library without importing the library."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["PACKAGE", "standalone"]

PACKAGE = Path(__file__).resolve().parent.parent  # lifecycle/


def standalone(name: str, path: Path) -> ModuleType:
    """The module ``name`` at ``path``, loaded on its own.

    ``import lifecycle.<anything>`` runs ``lifecycle/__init__.py``, which imports
    TensorFlow: seconds. A module that imports nothing of the library (or only
    modules loaded so before it) is loaded from its file, as ``lifecycle_cli``
    loads this package, under its own name: the library imports the same
    module object later.
    """
    if name in sys.modules:
        return sys.modules[name]
    if "lifecycle" in sys.modules:  # TensorFlow is imported already: the usual way
        try:
            return importlib.import_module(name)
        except ImportError:  # the serve extra is missing: said once the command runs
            pass
    package = [str(path.parent)] if path.name == "__init__.py" else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=package)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
