from __future__ import annotations

import ast
import importlib
import json
import pickle
import pydoc
import re
import sys
import types
import warnings
from pathlib import Path

import pytest

import lifecycle as lc
from lifecycle import introspection, tuning
from lifecycle._core import _lazy

PACKAGE = Path(lc.__file__).parent
SUBPACKAGES = {
    "distribute",
    "errors",
    "integrations",
    "introspection",
    "monitoring",
    "server",  # reachable, not in dir(): it needs the serve extra
    "testing",
    "tuning",
}
# The sub-namespaces' own names: reached through them only, never from the top.
SUB_NAMESPACED = {*tuning.__all__, *introspection.__all__}
# Public modules whose names are declared once and resolved on first use, with the
# extra each needs (None: none).
LAZY_MODULES = {
    "lifecycle": None,
    "lifecycle.tuning": None,
    "lifecycle.introspection": None,
    "lifecycle.monitoring": None,
    "lifecycle.distribute": None,
    "lifecycle.cli": "typer",
    "lifecycle.integrations": None,
    "lifecycle.integrations.ray": "ray.serve",
    "lifecycle.server": "starlette",
}
# Keras's serialization records a registered class's module in saved files.
KEEP_THEIR_MODULE = {("lifecycle", "ManagedModel")}


def lazy_modules() -> list[types.ModuleType]:
    modules = []
    for name, extra in LAZY_MODULES.items():
        if extra is not None and importlib.util.find_spec(extra.split(".")[0]) is None:
            continue
        module = importlib.import_module(name)
        if name == "lifecycle.integrations.ray":
            # Ray Serve's import warns about its own use of pydantic (not ours).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                for exported in module.__all__:
                    getattr(module, exported)
        modules.append(module)
    return modules


def test_every_declared_name_resolves_and_all_is_sorted_and_complete():
    for module in lazy_modules():
        assert module.__all__ == sorted(set(module.__all__)), module.__name__
        where, _, own = _lazy.declared_names(module.__name__)
        assert set(module.__all__) == {*where, *own}, module.__name__
        for name in module.__all__:
            value = getattr(module, name)
            source = where.get(name)
            if source is not None:
                assert value is getattr(importlib.import_module(source), name), name
    assert not set(lc.__all__) & SUB_NAMESPACED
    public = {
        name
        for name, value in vars(lc).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(lc.__all__)


def test_a_declaration_not_written_as_an_explicit_re_export_is_refused(tmp_path, monkeypatch):
    (tmp_path / "declares_badly.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from json import dumps\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("declares_badly")
    with pytest.raises(ValueError, match=r"line 3: write `import dumps as dumps`"):
        _lazy.attach(module.__name__)
    with pytest.raises(ValueError, match=r"unlisted=\['nothing'\] names no submodule"):
        _lazy.attach("lifecycle.tuning", unlisted=("nothing",))


def test_public_names_report_their_public_module_in_help_and_pickle():
    for module in lazy_modules():
        for name in module.__all__:
            value = getattr(module, name)
            if not isinstance(value, (type, types.FunctionType)):
                continue
            if (module.__name__, name) in KEEP_THEIR_MODULE:
                assert value.__module__.startswith("lifecycle._"), name
                continue
            # Re-exported from another public module: that one's path (lc.find_leaks).
            assert not re.search(r"\._", value.__module__), f"{module.__name__}.{name}"
            assert getattr(importlib.import_module(value.__module__), name) is value
            text = pydoc.render_doc(value, renderer=pydoc.plaintext)
            assert f"in module {value.__module__}" in text.splitlines()[0], text[:200]
            # Private base classes (implementation mixins) may show in the MRO.
            private_bases = {
                f"{base.__module__}.{base.__qualname__}"
                for base in getattr(value, "__mro__", ())
                if base.__module__.startswith("lifecycle._")
            }
            leaked = set(re.findall(r"lifecycle\._[\w.]*", text)) - private_bases
            assert not leaked, f"{module.__name__}.{name}: {leaked}"
    assert lc.ModelRegistry.__module__ == "lifecycle"
    assert lc.find_leaks.__module__ == "lifecycle.monitoring"
    assert pickle.loads(pickle.dumps(lc.CleanupStrategy.ON_SAFE_POINTS)) is (
        lc.CleanupStrategy.ON_SAFE_POINTS
    )
    assert pickle.loads(pickle.dumps(lc.ModelState)) is lc.ModelState


def test_every_public_name_is_documented():
    for module in lazy_modules():
        assert module.__doc__, module.__name__
        for name in module.__all__:
            value = getattr(module, name)
            if callable(value):
                assert value.__doc__, f"{module.__name__}.{name}"


def test_the_sub_namespaces_names_are_reached_through_them_only():
    # One public path per name: lc.tuning.tune_allocator, never lc.tune_allocator.
    for module in (tuning, introspection):
        assert getattr(lc, module.__name__.rsplit(".", 1)[1]) is module
        for name in module.__all__:
            with pytest.raises(
                AttributeError, match=rf"module 'lifecycle' has no attribute '{name}'"
            ):
                getattr(lc, name)
            assert name not in dir(lc), name
    with pytest.raises(ImportError, match="cannot import name 'tune_allocator'"):
        from lifecycle import tune_allocator  # noqa: F401
    assert tuning.DEFAULT_TRIM_THRESHOLD == 32 * 2**20


def test_dir_lists_the_names_and_subpackages_and_unknown_names_raise_attribute_error():
    for module in (lc, tuning, introspection):
        assert set(module.__all__) <= set(dir(module)), module.__name__
    assert set(dir(lc)) >= SUBPACKAGES - {"server"}
    assert lc.monitoring.find_leaks is lc.find_leaks
    for module in (lc, tuning, lc.distribute):
        with pytest.raises(AttributeError, match=rf"module '{module.__name__}' has no attribute"):
            module.ManagedModle  # noqa: B018


def test_the_test_harness_is_not_public():
    # Local clusters and private networks serve the tests and one example only.
    assert lc.distribute.__all__ == ["train"]
    for name in ("LocalCluster", "run_in_private_network", "free_ports", "PS_ENV"):
        with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
            getattr(lc.distribute, name)


# Modules that may import another library's private names (`_name`), one per library;
# TensorFlow's and Keras's are all under lifecycle/_tf/ (tests/test_compat.py).
QUARANTINES = {"ray": "integrations/ray/_internals.py"}
STANDARD = {"_thread"}  # the standard library's own low-level modules


def test_private_names_of_other_libraries_are_imported_in_their_quarantine_only():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("_tf/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported = [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                imported = [(alias.name, "") for alias in node.names]
            else:
                continue
            for module, name in imported:
                library = module.split(".")[0]
                if library in {"lifecycle", *STANDARD}:
                    continue
                parts = [*module.split("."), name]
                private = any(p.startswith("_") and not p.startswith("__") for p in parts if p)
                if private and QUARANTINES.get(library) != relative:
                    offenders.append(f"{relative}:{node.lineno}: {module} {name}")
    assert not offenders, "\n".join(offenders)


# A fresh interpreter: what `import lifecycle` loads, and what the first use of a name does.
LAZY_CHILD = """
import json, sys, time

started = time.perf_counter()
import lifecycle
seconds = time.perf_counter() - started
heavy = ("tensorflow", "keras", "numpy")
loaded = lambda: sorted(m for m in sys.modules if m.split(".")[0] in heavy)
result = {"seconds": seconds, "import": loaded()}
result["import_lifecycle"] = sorted(m for m in sys.modules if m.startswith("lifecycle"))
result["dir"] = dir(lifecycle)
from lifecycle import tuning
tuning.tune_allocator, tuning.allocator_choice(), tuning.AllocatorSettings
result["tuning"] = loaded()
# Imported past the package: the public module is set all the same.
from lifecycle._registry import ModelRegistry
from lifecycle.monitoring._leaks import find_leaks
result["modules"] = [ModelRegistry.__module__, find_leaks.__module__]
result["first_name"] = "tensorflow" in sys.modules and "lifecycle._tf" in sys.modules
for name in ("distribute", "integrations", "monitoring", "testing", "server", "errors"):
    assert getattr(lifecycle, name) is sys.modules["lifecycle." + name], name
exec("from lifecycle import *", namespace := {})
result["star"] = sorted(n for n in namespace if not n.startswith("__"))
print("RESULT", json.dumps(result))
"""


@pytest.mark.subprocess
def test_import_lifecycle_imports_no_tensorflow_until_a_name_needs_it(run_child):
    pytest.importorskip("starlette")  # lifecycle.server needs the serve extra
    output = run_child(LAZY_CHILD, python_options=("-W", "error"))
    result = json.loads(output.split("RESULT", 1)[1])
    assert result["import"] == [], result["import"]
    assert result["tuning"] == [], result["tuning"]
    # The sub-namespaces (tuning, introspection) wait for their first use too.
    assert set(result["import_lifecycle"]) <= {
        "lifecycle",
        "lifecycle.errors",
        *(m for m in result["import_lifecycle"] if m.startswith("lifecycle._core")),
    }
    assert result["seconds"] < 0.5, result["seconds"]
    assert result["modules"] == ["lifecycle", "lifecycle.monitoring"]
    assert result["first_name"]
    # help(lifecycle) reads every name dir() lists: not lifecycle.server, which needs an extra.
    assert set(result["dir"]) >= set(lc.__all__) | SUBPACKAGES - {"server"}
    assert not set(result["dir"]) & SUB_NAMESPACED
    assert "server" not in result["dir"]
    assert result["star"] == sorted(lc.__all__)


@pytest.mark.subprocess
@pytest.mark.slow  # the fast lane keeps a lazy-import child
def test_after_keras_import_lifecycle_registers_managed_model_for_load_model(run_child, tmp_path):
    import keras

    inputs = keras.Input((3,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name="saved")
    model.save(tmp_path / "saved.keras")
    model.dispose()
    # As isort orders a user's imports: keras before lifecycle.
    code = f"""
import keras
import lifecycle
loaded = keras.models.load_model({str(tmp_path / "saved.keras")!r})
print("RESULT", type(loaded).__name__, loaded.name)
loaded.dispose()
"""
    assert run_child(code).split("RESULT", 1)[1].split() == ["ManagedModel", "saved"]


def test_lazy_modules_list_is_every_public_module_with_a_declaration_block():
    # A new public package that declares names lazily is checked above too.
    declaring = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = [p for p in relative.parts if p != "__init__"]
        if any(p.startswith("_") for p in parts) or "attach(__name__" not in path.read_text():
            continue
        declaring.add(".".join(parts))
    assert declaring == set(LAZY_MODULES)
    assert "lifecycle" in sys.modules
