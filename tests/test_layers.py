"""docs/internals.md states the layers that the import contract checks.

``lint-imports`` (``make lint``) checks the code against the contract in
pyproject.toml; these tests check the page against the contract.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lifecycle"


def contract_layers() -> list[list[str]]:
    """The layers of the ``layers`` contract, highest first, each a sorted list of modules."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    assert contract["containers"] == ["lifecycle"]
    return [sorted(name.strip() for name in layer.split("|")) for layer in contract["layers"]]


def map_blocks() -> list[str]:
    """The code blocks of the map section of docs/internals.md."""
    page = (ROOT / "docs" / "internals.md").read_text()
    section = page.split("## A map of the package\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.*?)```", section, flags=re.DOTALL)


def test_the_page_states_the_contracts_layers():
    layers = [
        sorted(name.strip() for name in line.split("|"))
        for line in map_blocks()[0].split("\n")
        if line
    ]
    assert layers == contract_layers()


def test_the_map_lists_every_module_of_the_package_bottom_up():
    tree = map_blocks()[1].splitlines()
    assert tree[0] == "lifecycle/"
    # Entries of the package itself: two spaces in, then a file or folder name.
    entries = [m.group(1) for line in tree if (m := re.match(r"  (\w+)(?:\.py|/)\s", line + " "))]
    modules = [entry for entry in entries if entry != "__init__"]
    level = {name: i for i, layer in enumerate(contract_layers()) for name in layer}
    assert sorted(modules) == sorted(level), "the map and the contract name different modules"
    on_disk = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.parent.name for p in PACKAGE.glob("*/__init__.py")
    }
    assert on_disk - {"__init__"} == set(level)
    # Bottom up: a module never comes after one of a higher layer (level 0 is the highest).
    levels = [level[name] for name in modules]
    assert levels == sorted(levels, reverse=True), list(zip(modules, levels, strict=True))


def test_only_lifecycle_tf_imports_tensorflow_and_keras_internals():
    internal = ("tensorflow.python", "keras.src", "tensorflow.compiler", "tensorflow.lite")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "_tf" and path.parent.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith(internal)]
    assert not found
