"""The Makefile keeps large files out of the repository."""

from __future__ import annotations

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
