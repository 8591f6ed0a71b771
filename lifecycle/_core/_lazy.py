"""Public names imported on first use (PEP 562), so ``import lifecycle`` stays instant.

A package lists the modules its names live in; :func:`attach` returns the
``__getattr__`` and ``__dir__`` that import the module on first use of a name
and keep the value as the package's attribute, so later uses are plain
attribute reads (SciPy's and scikit-image's ``lazy_loader`` do the same).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["attach"]


def attach(
    name: str,
    modules: Mapping[str, Iterable[str]],
    submodules: Iterable[str] = (),
    unlisted: Iterable[str] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for module ``name``, importing its names on first use.

    Args:
        name: The ``__name__`` of the module (or package) that exports the names.
        modules: Each module, relative to that one (``"._model"``) or absolute,
            mapped to the names of it that are exported.
        submodules: Submodules of the package ``name`` reachable as its
            attributes, imported on first use too.
        unlisted: Submodules reachable the same way but left out of
            ``__dir__``: those that need an extra, whose import fails without
            it (``help()`` reads every name ``dir()`` lists).

    Returns:
        The module-level ``__getattr__`` and ``__dir__`` to assign there.
    """
    where = {exported: module for module, names in modules.items() for exported in names}
    listed = frozenset(submodules)
    submodules = listed | frozenset(unlisted)

    def __getattr__(attribute: str) -> Any:
        this = sys.modules[name]
        module = where.get(attribute)
        if module is not None:
            value = getattr(importlib.import_module(module, this.__package__), attribute)
        elif attribute in submodules:
            value = importlib.import_module(f"{name}.{attribute}")
        else:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        # Kept: later uses of the name do not come back here.
        setattr(this, attribute, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[name]), *where, *listed})

    return __getattr__, __dir__
