"""An Optuna study, the objective as Optuna's docs write it, inside a session: flat."""

from __future__ import annotations

import re

import pytest
from support import ROOT

HELD = (
    r"(plain|in a session): TensorFlow holds ([\d.]+) MiB after trial 1, "
    r"([\d.]+) MiB after trial (\d+)$"
)


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_study_inside_a_session_is_flat_where_the_plain_study_grows(run_child):
    held = {}
    for flags in (["--trials", "6"], ["--trials", "6", "--plain"]):
        argv = [str(ROOT / "examples/sweep_optuna.py"), *flags]
        out = run_child(
            f"import runpy, sys; sys.argv = {argv!r}; "
            f"runpy.run_path(sys.argv[0], run_name='__main__')",
            timeout=400,
        )
        # The line test_examples.py would read: "in a session: TensorFlow holds ...".
        found = re.search(HELD, out, re.MULTILINE)
        assert found and found[4] == "6", out
        held[found[1]] = float(found[3]) - float(found[2])
    # Each trial's model, 0.3-3 MiB of weights with Adam's slots, is freed as it returns;
    # each plain trial leaks its own.
    assert held["in a session"] < 0.5, held
    assert held["plain"] > 5 * 0.5, held
