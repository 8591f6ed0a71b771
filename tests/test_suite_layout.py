"""The test suite's own rule: test modules share helpers through ``support/``, not each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Code run in child processes is a string: its imports show only as text.
IN_A_STRING = re.compile(r"^\s*(?:from|import) (?:tests\.)?test_\w+", re.MULTILINE)


def imported(tree: ast.AST) -> set[str]:
    """Every module an ``import`` statement of ``tree`` names, relative ones with their dots."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_no_test_module_imports_another():
    offenders = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text()
        names = {
            name
            for name in imported(ast.parse(text))
            if name.startswith(".") or name.split(".")[-1].startswith("test_")
        }
        names.update(match.strip() for match in IN_A_STRING.findall(text))
        if names:
            offenders[str(path.relative_to(TESTS))] = sorted(names)
    assert offenders == {}, "move what these modules share into tests/support/"
