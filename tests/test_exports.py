from __future__ import annotations

import ast
import importlib
import json
import types
from pathlib import Path

import pytest

import lifecycle as lc
from lifecycle import introspection, tuning

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


def type_checking_imports(module: types.ModuleType) -> dict[str, str]:
    """What the module's ``if _typing.TYPE_CHECKING:`` block imports: name -> its module."""
    tree = ast.parse(Path(module.__file__).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_typing.TYPE_CHECKING"
    )
    imported = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        source = importlib.util.resolve_name("." + (node.module or ""), module.__package__)
        for alias in node.names:
            assert alias.asname == alias.name, "re-export as `X as X`"
            imported[alias.name] = source if node.module else f"{source}.{alias.name}"
    return imported


def test_all_is_complete_without_duplicates():
    # ruff's RUF022 keeps __all__ sorted; this checks it lists exactly the public names.
    for module in (lc, tuning, introspection):
        assert len(module.__all__) == len(set(module.__all__)), module.__name__
    assert not set(lc.__all__) & SUB_NAMESPACED
    assert not set(tuning.__all__) & set(introspection.__all__)
    for name in lc.__all__:
        getattr(lc, name)  # loads every name
    public = {
        name
        for name, value in vars(lc).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(lc.__all__)


def test_the_type_checking_imports_name_the_same_objects_as_the_lazy_ones():
    # Type checkers and IDEs read the TYPE_CHECKING block; the interpreter, the
    # lazy table. Both must give every name, from the same place.
    for module, expected in (
        (lc, {*lc.__all__, *SUBPACKAGES}),
        (tuning, set(tuning.__all__)),
        (introspection, set(introspection.__all__)),
    ):
        imported = type_checking_imports(module)
        assert set(imported) == expected, module.__name__
        for name, source in imported.items():
            if name in SUBPACKAGES and module is lc:
                assert source == f"lifecycle.{name}"
                continue
            assert getattr(module, name) is getattr(importlib.import_module(source), name), name


def test_every_public_name_is_documented():
    for module in (lc, tuning, introspection):
        assert module.__doc__
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
    for module in (lc, tuning):
        with pytest.raises(AttributeError, match=rf"module '{module.__name__}' has no attribute"):
            module.ManagedModle  # noqa: B018


def test_the_integrations_export_their_modules_names_documented():
    pytest.importorskip("keras_tuner")
    pytest.importorskip("sklearn")
    import lifecycle.integrations as integrations

    assert len(integrations.__all__) == len(set(integrations.__all__))
    modules = [
        importlib.import_module(f"lifecycle.integrations.{name}")
        for name in ("keras_tuner", "sklearn")
    ]
    assert sorted(integrations.__all__) == sorted(n for m in modules for n in m.__all__)
    for name in integrations.__all__:
        value = getattr(integrations, name)
        assert value is next(getattr(m, name) for m in modules if name in m.__all__)
        assert value.__doc__, name
    with pytest.raises(AttributeError, match="has no attribute 'Tuner'"):
        integrations.Tuner  # noqa: B018


def test_the_ray_integration_exports_its_modules_names_documented():
    pytest.importorskip("ray.serve")
    pytest.importorskip("ray.tune")
    import lifecycle.integrations.ray as ray_integration

    modules = [
        importlib.import_module(f"lifecycle.integrations.ray.{name}")
        for name in ("_serve", "_tune")
    ]
    assert ray_integration.__all__ == sorted(n for m in modules for n in m.__all__)
    for name in ray_integration.__all__:
        value = getattr(ray_integration, name)
        assert value is next(getattr(m, name) for m in modules if name in m.__all__)
        assert value.__doc__, name
    with pytest.raises(AttributeError, match="has no attribute 'multiplex'"):
        ray_integration.multiplex  # noqa: B018


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
lifecycle.ManagedModel
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
