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
    "daily_incremental_training.py": "RSS growth per generation",
    "monitoring.py": "module app.debug → .LAST_MODELS → list[0]",
    "serve_checkpointed_versions.py": "still serving v2: 2.0",
}
# Arguments that keep an example short; the defaults show the full effect.
ARGS = {
    "daily_incremental_training.py": ["--days", "5"],
    "parameter_server_lifecycle.py": ["--generations", "2"],
    "monitoring.py": ["--cycles", "5"],
}


def test_every_example_is_covered():
    assert {path.name for path in (ROOT / "examples").glob("*.py")} == set(EXPECTED)


# The fast lane (-m "not slow") runs this one; the others take up to 70 s each.
FAST_EXAMPLE = "manage_existing.py"


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "example",
    [
        name if name == FAST_EXAMPLE else pytest.param(name, marks=pytest.mark.slow)
        for name in sorted(EXPECTED)
    ],
)
def test_example_runs(example, run_child):
    code = (
        f"import runpy, sys; sys.argv = [{example!r}, *{ARGS.get(example, [])!r}]; "
        f"runpy.run_path({str(ROOT / 'examples' / example)!r}, run_name='__main__')"
    )
    assert EXPECTED[example] in run_child(code, timeout=180)


@pytest.mark.subprocess
@pytest.mark.slow
def test_daily_training_memory_is_flat_over_twenty_generations(run_child):
    # The target: RSS growth <= 2 MiB per generation across 20 daily generations.
    code = (
        "import runpy, sys; sys.argv = ['daily', '--days', '20']; "
        f"runpy.run_path({str(ROOT / 'examples' / 'daily_incremental_training.py')!r}, "
        "run_name='__main__')"
    )
    out = run_child(code, timeout=400)
    line = next(ln for ln in out.splitlines() if ln.startswith("RSS growth per generation"))
    growth = float(line.split(":")[1].split()[0])
    assert growth <= 2.0, out
