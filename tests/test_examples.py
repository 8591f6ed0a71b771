"""Every example runs to completion and prints what it promises."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "training_loop.py": "fold 2: val loss",
    "serving.py": "clients were refused after dispose",
    "manage_existing.py": "calling it now raises DisposedError",
    "sessions.py": "units=64: loss",
    "hot_swap_serving.py": "failed: 0",
    "ab_loading.py": "user-7 sticks to v",
    "parameter_server_lifecycle.py": "PS growth per generation",
}


def test_every_example_is_covered():
    assert {path.name for path in (ROOT / "examples").glob("*.py")} == set(EXPECTED)


@pytest.mark.subprocess
@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_runs(example, run_child):
    code = (
        f"import runpy; runpy.run_path({str(ROOT / 'examples' / example)!r}, run_name='__main__')"
    )
    assert EXPECTED[example] in run_child(code, timeout=180)
