"""The benchmarks (the loop one is what `make bench` runs) work end to end, on tiny workloads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_benchmark(script: str, *args: str) -> list[str]:
    """Run ``benchmarks/<script>`` with ``args``; assert it succeeds; its stdout lines."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


@pytest.mark.subprocess
@pytest.mark.slow
def test_loop_benchmark_prints_one_row_per_variant():
    lines = run_benchmark(
        "loop_training.py",
        *("--cycles", "3", "--units", "32", "--variants", "a,c,dispose"),
        *("--dispose-mb", "1"),
    )
    rows = {line.split("  ")[0]: line for line in lines}
    assert "(a) del model" in rows and "(c) ManagedModel + dispose()" in rows
    assert "(c) dispose() of a 1 MiB model" in rows
    # The managed row shows the megabytes it released, not a dash.
    assert rows["(c) ManagedModel + dispose()"].split()[-2] != "-"


@pytest.mark.subprocess
@pytest.mark.slow
def test_cleaner_benchmark_prints_latency_rows():
    lines = run_benchmark("cleaner.py", *("--seconds", "3", "--variants", "naive,bg"))
    rows = [line for line in lines if line.startswith(("naive", "bg"))]
    assert [row.split(":")[0] for row in rows[:2]] == ["naive", "bg"]
    assert all("FAILED" not in row for row in rows)


@pytest.mark.subprocess
@pytest.mark.slow
def test_hot_swap_benchmark_swaps_without_failed_requests():
    lines = run_benchmark(
        "hot_swap.py",
        *("--seconds", "3", "--units", "256", "--min-swaps", "3"),
        *("--variants", "direct,registry,swaps,background"),
    )
    rows = {line.split(":")[0]: line for line in lines if ": " in line}
    assert {"direct", "registry", "registry-swaps"} <= set(rows)
    assert all("FAILED" not in row for row in rows.values())
    for row in (rows["registry-swaps"], next(ln for ln in lines if ln.startswith("swaps +"))):
        swaps, failed = row.split()[-4:-2]
        assert int(swaps) > 0 and failed == "0", row


@pytest.mark.subprocess
def test_checkpoint_benchmark_compares_every_operation_with_plain():
    lines = run_benchmark("checkpoints.py", *("--units", "128", "--repeats", "1"))
    rows = {
        line.split("  ")[0]: line.split() for line in lines if line.startswith(("plain", "keeper"))
    }
    assert {"plain save", "keeper save", "plain restore", "keeper restore"} <= set(rows)
    assert rows["plain save"][-2] == "1.00x"
    assert all(row[-2].endswith("x") and float(row[-2][:-1]) > 0 for row in rows.values())


@pytest.mark.subprocess
@pytest.mark.slow
def test_dispose_benchmark_compares_resnet50_with_the_mlp():
    lines = run_benchmark(
        "dispose.py",
        *("--rounds", "1", "--variants", "mlp,resnet50,plain-mlp"),
        *("--input-size", "32", "--mlp-mb", "4"),
    )
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("mlp ", "resnet"))}
    assert set(rows) == {"mlp", "resnet50"}
    # The MLP's own ratio, ResNet50's buffers (weights, Adam slots, BN statistics).
    assert rows["mlp"][5] == "1.00x" and rows["resnet50"][5].endswith("x")
    assert int(rows["resnet50"][1]) > 500
    # The plain drop was measured next to the managed MLP.
    assert rows["mlp"][-3] != "-"
