"""The Makefile keeps large files out of the repository."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("make") is None, reason="needs git and make"
)


def _repository(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for args in (["init", "-q"], ["add", "Makefile"]):
        subprocess.run(["git", *args], cwd=tmp_path, check=True)
    return tmp_path


def _check_size(repository: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "check-size"],
        cwd=repository,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_tracked_file_over_1_mb_fails_the_check_and_is_named(tmp_path):
    repository = _repository(tmp_path)
    (repository / "docs" / "images").mkdir(parents=True)
    (repository / "docs" / "images" / "chart.png").write_bytes(b"\0" * 1_500_000)
    (repository / "small.txt").write_bytes(b"\0" * 1_000_000)
    subprocess.run(["git", "add", "."], cwd=repository, check=True)
    assert _check_size(repository).returncode == 0  # images for the docs may be large

    (repository / "tool-1.0-py3-none-any.whl").write_bytes(b"\0" * 1_000_001)
    subprocess.run(["git", "add", "."], cwd=repository, check=True)
    result = _check_size(repository)
    assert result.returncode != 0
    assert "Tracked files over 1 MB outside docs/images/" in result.stdout
    assert "tool-1.0-py3-none-any.whl (1000001 bytes)" in result.stdout
    assert "chart.png" not in result.stdout and "small.txt" not in result.stdout


def test_the_repository_itself_passes_the_check():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    result = _check_size(ROOT)
    assert result.returncode == 0, result.stdout


def registered_markers() -> set[str]:
    """The markers pyproject.toml registers for pytest (its ``"name: description"`` lines)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("\nmarkers = [", 1)[1].split("\n]", 1)[0]
    return set(re.findall(r'^\s*"(\w+):', block, re.MULTILINE))


@pytest.mark.parametrize(
    "target, selection",
    [
        ("test", ["-m", "not benchmark"]),
        ("test-fast", ["-m", "not slow and not benchmark"]),
        ("test-all", []),
    ],
)
@pytest.mark.parametrize(
    "workers, parallel",
    [
        # Two test processes by default, each taking whole modules (pytest-xdist).
        ([], ["-n", "2", "--dist", "loadfile"]),
        (["TEST_WORKERS=3"], ["-n", "3", "--dist", "loadfile"]),
        (["TEST_WORKERS=1"], ["-p", "no:xdist"]),
    ],
)
def test_each_test_target_selects_by_registered_markers_then_passes_pytest_args(
    tmp_path, target, selection, workers, parallel
):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").touch()
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", target, "PYTEST_ARGS=-k x", *workers],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    commands = [shlex.split(line) for line in result.stdout.splitlines() if " -m pytest" in line]
    # A -m in PYTEST_ARGS comes after the target's and so replaces it (the last -m wins).
    expected = [".venv/bin/python", "-m", "pytest", *parallel, *selection, "-k", "x"]
    assert commands == [expected], result.stdout
    # pytest takes a -m naming an unknown marker silently: each named one is registered.
    named = set(" ".join(selection[1:]).replace("not ", "").split(" and ")) - {""}
    assert named <= registered_markers(), named
