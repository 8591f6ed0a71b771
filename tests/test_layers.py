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


# An entry of the map: indented two spaces per level, a file name (with its
# extension) or a folder name ending in "/", then its description.
ENTRY = re.compile(r"( *)(\w[\w.]*\.\w+|\w+/)(?:\s|$)")


def map_entries(tree: str) -> list[str]:
    """The entries of a map, in order, as paths under its root (folders end in ``/``).

    A line is an entry when its first word is a file or folder name indented one
    level deeper than its folder, or at the level of a folder's entries; any
    other line (a description running on, aligned under the descriptions) is not.
    """
    lines = tree.splitlines()
    folders: list[str] = []  # the folders the next entry may be in, outermost first
    entries = []
    for line in lines[1:]:
        found = ENTRY.match(line)
        if found is None or len(found.group(1)) % 2:
            continue
        depth = len(found.group(1)) // 2
        if not 1 <= depth <= len(folders) + 1:
            continue
        del folders[depth - 1 :]
        name = found.group(2)
        entries.append("".join(folders) + name)
        if name.endswith("/"):
            folders.append(name)
    return entries


def package_files() -> set[str]:
    """Every module and package of ``lifecycle/`` at any depth, as paths under it.

    A package stands for its ``__init__.py`` (the map may list one, as it does the
    top-level one, to say what it does). Data files (``py.typed``, ``.proto``)
    need no entry.
    """
    files = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if "__pycache__" in relative.parts:
            continue
        if path.name != "__init__.py":
            files.add(relative.as_posix())
        files.update(f"{folder.as_posix()}/" for folder in relative.parents if folder.parts)
    return files


def test_map_entries_walks_nested_folders_and_skips_running_descriptions():
    tree = (
        "lifecycle/\n"
        "  errors.py            every exception\n"
        "  server/              the server\n"
        "    _app.py              build_app() and serve(): a description\n"
        "                         that runs on, mentioning _flags.py and ray/\n"
        "    protos/              messages\n"
        "      v2.proto             compiled\n"
        "    _grpc.py             gRPC\n"
        "  cli/                 the command\n"
        "      _deep.py           two levels in under cli/: not an entry\n"
        "  testing.py           no_leaks()\n"
    )
    assert map_entries(tree) == [
        "errors.py",
        "server/",
        "server/_app.py",
        "server/protos/",
        "server/protos/v2.proto",
        "server/_grpc.py",
        "cli/",
        "testing.py",
    ]


def test_the_maps_top_level_lists_the_contracts_modules_bottom_up():
    tree = map_blocks()[1]
    assert tree.splitlines()[0] == "lifecycle/"
    top = [entry.removesuffix("/") for entry in map_entries(tree) if "/" not in entry[:-1]]
    modules = [entry.removesuffix(".py") for entry in top if entry != "__init__.py"]
    level = {name: i for i, layer in enumerate(contract_layers()) for name in layer}
    assert sorted(modules) == sorted(level), "the map and the contract name different modules"
    on_disk = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.parent.name for p in PACKAGE.glob("*/__init__.py")
    }
    assert on_disk - {"__init__"} == set(level)
    # Bottom up: a module never comes after one of a higher layer (level 0 is the highest).
    levels = [level[name] for name in modules]
    assert levels == sorted(levels, reverse=True), list(zip(modules, levels, strict=True))


def test_the_map_lists_every_module_at_any_depth_and_nothing_that_is_gone():
    entries = map_entries(map_blocks()[1])
    assert len(entries) == len(set(entries)), "an entry is listed twice"
    unlisted = sorted(package_files() - set(entries))
    assert not unlisted, f"modules missing from the map of docs/internals.md: {unlisted}"
    gone = [
        entry
        for entry in entries
        if not (entry.endswith("/") and (PACKAGE / entry).is_dir())
        and not (PACKAGE / entry).is_file()
    ]
    assert not gone, f"the map of docs/internals.md lists what is not in lifecycle/: {gone}"


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
