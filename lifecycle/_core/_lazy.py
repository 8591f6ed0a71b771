"""Public names declared once, imported on first use (PEP 562), shown at their public path.

A public module declares each name once, in its ``if TYPE_CHECKING:`` block
(``from ._model import manage as manage``, ``from . import server as server``)
or by defining it there. Type checkers and IDEs read that block; :func:`attach`
reads the same block from the module's source (with :mod:`ast`, once, when the
module is imported) and derives what the interpreter needs: ``__all__``, and the
``__getattr__`` and ``__dir__`` that import a name's module on first use and
keep the value as the module's attribute (SciPy's and scikit-image's
``lazy_loader`` do the same), so ``import lifecycle`` stays instant.

Every class and function a public module declares from a private one
(``lifecycle._registry.ModelRegistry``) reports the public module as its
``__module__`` (``lifecycle``), as httpx's re-exports do, so ``help()``, reprs
and tracebacks show the path users write. It is set as soon as the defining
module is imported, however it is imported: an import hook watches the private
modules that public ones declare names from. Classes registered with Keras's
serialization keep their module (Keras records it in saved files).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["attach", "declared_names"]


def attach(
    name: str, *, unlisted: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` of module ``name``, from its declarations.

    Call it at the bottom of a public module:
    ``__getattr__, __dir__, __all__ = attach(__name__)``.

    Args:
        name: The ``__name__`` of the module (or package) that declares the names.
        unlisted: Submodules declared in the block but left out of ``__dir__``:
            those that need an extra, whose import fails without it (``help()``
            reads every name ``dir()`` lists).

    Returns:
        The module-level ``__getattr__``, ``__dir__`` and ``__all__`` (sorted) to
        assign there.

    Raises:
        ValueError: The module's source is unavailable, or a declaration is not
            of the form ``from <module> import <name> as <name>``.
    """
    where, submodules, own = declared_names(name)
    unlisted = frozenset(unlisted)
    missing = unlisted - submodules
    if missing:
        raise ValueError(
            f"{name}: unlisted={sorted(missing)} names no submodule of its TYPE_CHECKING "
            "block; declare it there (`from . import x as x`) or drop it from `unlisted`"
        )
    listed = submodules - unlisted
    _claim(name, where)

    def __getattr__(attribute: str) -> Any:
        this = sys.modules[name]
        module = where.get(attribute)
        if module is not None:
            value = getattr(importlib.import_module(module), attribute)
        elif attribute in submodules:
            value = importlib.import_module(f"{name}.{attribute}")
        else:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        # Kept: later uses of the name do not come back here.
        setattr(this, attribute, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[name]), *where, *listed})

    return __getattr__, __dir__, sorted({*where, *own})


def declared_names(name: str) -> tuple[dict[str, str], frozenset[str], frozenset[str]]:
    """What module ``name`` declares public, read from its source.

    Args:
        name: The ``__name__`` of an imported module.

    Returns:
        The names of its ``TYPE_CHECKING`` block mapped to the (absolute) module
        each comes from, the submodules that block declares, and the public
        names the module defines itself (functions, classes, assignments).

    Raises:
        ValueError: The source is unavailable or a declaration is malformed.
    """
    module = sys.modules[name]
    spec = module.__spec__
    source = _source(module)
    if source is None:
        raise ValueError(
            f"{name}: its public names are declared in its source, which is not installed "
            "(a bytecode-only install?); install keras-lifecycle with its .py files"
        )
    package = name if spec.submodule_search_locations is not None else name.rpartition(".")[0]
    where: dict[str, str] = {}
    submodules: set[str] = set()
    own: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for declaration in node.body:
                _read_declaration(name, package, declaration, where, submodules)
        else:
            own.update(n for n in _defined(node) if not n.startswith("_"))
    return where, frozenset(submodules), frozenset(own)


def _source(module: types.ModuleType) -> str | None:
    # The file first: pytest's assertion rewriting loads the package (a plugin's)
    # with a loader that has no get_source().
    path = getattr(module, "__file__", None)
    if path and path.endswith(".py"):
        with contextlib.suppress(OSError), open(path, encoding="utf-8") as file:
            return file.read()
    get_source = getattr(getattr(module.__spec__, "loader", None), "get_source", None)
    return get_source(module.__name__) if get_source is not None else None


def _is_type_checking(test: ast.expr) -> bool:
    # `if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:` (any alias of typing).
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _read_declaration(
    name: str, package: str, node: ast.stmt, where: dict[str, str], submodules: set[str]
) -> None:
    if not isinstance(node, ast.ImportFrom):
        raise ValueError(
            f"{name}, line {node.lineno}: the TYPE_CHECKING block holds only public "
            f"declarations (`from <module> import <name> as <name>`); got {ast.unparse(node)!r}"
        )
    source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
    for alias in node.names:
        if alias.asname != alias.name:
            raise ValueError(
                f"{name}, line {node.lineno}: write `import {alias.name} as {alias.name}` "
                f"(the explicit re-export type checkers read); got {ast.unparse(node)!r}"
            )
        if node.module is None and source == name:
            submodules.add(alias.name)  # `from . import server as server`
        else:
            where[alias.name] = source


def _defined(node: ast.stmt) -> Iterable[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return (node.name,)
    targets: Sequence[ast.expr] = ()
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = (node.target,)
    return (n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))


# -- public __module__ ------------------------------------------------------------------

# Private module -> {name declared from it: the public module that declares it}.
_claims: dict[str, dict[str, str]] = {}
_claims_lock = threading.Lock()


def _is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def _claim(public: str, where: dict[str, str]) -> None:
    """Record the public module of each name; publish those already imported."""
    ready = []
    with _claims_lock:
        for attribute, source in where.items():
            if not _is_private(source):
                continue  # re-exported from a public module, which declares it itself
            names = _claims.setdefault(source, {})
            # Two public modules declaring one private name: the shallower path wins,
            # whichever was imported first.
            names[attribute] = min(
                names.get(attribute, public), public, key=lambda m: (m.count("."), m)
            )
            if source in sys.modules:
                ready.append(source)
        if _claims and _HOOK not in sys.meta_path:
            sys.meta_path.insert(0, _HOOK)
    for source in ready:
        _publish(sys.modules[source])


def _publish(module: types.ModuleType) -> None:
    """Set the public ``__module__`` of the names other modules declare from ``module``."""
    keras = sys.modules.get("keras")
    for attribute, public in _claims.get(module.__name__, {}).items():
        value = getattr(module, attribute, None)
        if not isinstance(value, (type, types.FunctionType)):
            continue  # constants and instances have no module of their own
        if value.__module__.partition(".")[0] != public.partition(".")[0]:
            continue  # another library's object: not ours to rename
        if not _is_private(value.__module__):
            continue
        if keras is not None and keras.saving.get_registered_name(value) != value.__name__:
            continue  # Keras saves the module it registered; loading looks it up there
        value.__module__ = public


class _PublishOnImport(importlib.abc.MetaPathFinder):
    """Finds no module itself: wraps the loader of a module public names come from."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _claims:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PublishingLoader(spec.loader)
        return spec


class _PublishingLoader(importlib.abc.Loader):
    """The module's own loader, then :func:`_publish` once the module has run."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        _publish(module)

    def __getattr__(self, attribute: str) -> Any:
        # get_source, get_resource_reader, is_package...: the real loader's.
        return getattr(self._loader, attribute)


_HOOK = _PublishOnImport()
