"""The benchmarks (the loop one is what `make bench` runs) work end to end, on tiny workloads."""

from __future__ import annotations

import re
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
def test_serve_benchmark_compares_the_servers_and_swaps_without_failed_requests():
    lines = run_benchmark(
        "serve.py",
        *("--rounds", "1", "--seconds", "3", "--warmup", "1", "--clients", "2"),
        *("--units", "32", "--swap-every", "1", "--poll-wait", "0.5", "--min-swaps", "0"),
    )
    rows = {line.split("  ")[0]: line.split() for line in lines if line.startswith("(")}
    for label in ("(a) hand-written", "(b) lifecycle serve, steady", "(c) lifecycle serve +"):
        row = next((r for name, r in rows.items() if name.startswith(label)), None)
        assert row is not None, lines
        assert row[-1] == "0" and int(row[-2].replace(",", "")) > 0, row  # 0 failed of > 0
    assert rows["(b)/(a) requests/s"][2].endswith("x")
    swaps = next(line for line in lines if line.startswith("swaps: "))
    assert int(swaps.split()[1]) > 0, swaps


@pytest.mark.subprocess
@pytest.mark.slow
def test_sweeps_benchmark_compares_plain_and_managed_on_the_same_search():
    lines = run_benchmark("sweeps.py", *("--trials", "2", "--rounds", "1", "--units", "16,32"))
    rows = {
        line.split("  ")[0]: line.split() for line in lines if line.startswith(("plain", "man"))
    }
    plain, managed = rows["plain kt.RandomSearch"], rows["managed_tuner(kt.RandomSearch)"]
    # The same seeded search finds the same best trial; only the managed one releases.
    assert plain[-3:] == managed[-3:]
    assert plain[-4] == "-" and float(managed[-4]) >= 0


@pytest.mark.subprocess
@pytest.mark.slow
def test_sweep_benchmark_compares_managed_with_plain():
    lines = run_benchmark(
        "sweep.py",
        *("--rounds", "1", "--archs", "MobileNetV3Small", "--size", "32", "--eager"),
        *("--settle", "0", "--variants", "plain,managed"),
    )
    # Cells are separated by two spaces or more; a growth cell holds single spaces.
    rows = {
        cells[0].split(":")[0]: cells
        for cells in (re.split(r"\s{2,}", line) for line in lines)
        if cells[0].startswith(("plain:", "managed:"))
    }
    assert rows["plain"][3] == "1.000", rows
    assert float(rows["managed"][3]) > 0, rows
    assert any("cleaner trims" in line for line in lines)


def check_batching_part(lines: list[str], served: bool) -> None:
    """One part of the batching benchmark's report: its table, ratios and targets."""
    rows = {line.split("  ")[0].strip(): line.split() for line in lines if " / o" in line}
    assert set(rows) == {"1 / off", "1 / on", "4 / off", "4 / on"}, lines
    # Failed requests, then (served only) the server's and the load generator's CPU.
    failed = -5 if served else -1
    for label, cells in rows.items():
        assert cells[failed] == "0", (label, cells)
        assert float(cells[3].replace(",", "")) > 0, (label, cells)  # requests/s
        if served:
            assert float(cells[-4]) > 0 and float(cells[-2]) > 0, (label, cells)
    # Batching on reports its requests per batch (median, then spread), off a dash.
    on, off = rows["4 / on"], rows["4 / off"]
    assert float(on[failed - 2]) >= 1.0 and on[failed - 1].startswith("("), on
    assert off[failed - 1] == "-", off
    # The ratio table: clients, then on/off ratios such as "1.23x (1.01-1.40x)".
    ratio_rows = [cells for cells in map(str.split, lines) if cells[1:2] and cells[1][-1] == "x"]
    assert [row[0] for row in ratio_rows] == ["1", "4"], lines
    assert all(row[1].endswith("x") and float(row[1][:-1]) > 0 for row in ratio_rows)
    assert any(line.startswith("  1 clients, throughput on/off >= 0.95x: ") for line in lines)
    assert "  no failed request: met (0 failed)" in lines


@pytest.mark.subprocess
@pytest.mark.slow
def test_batching_benchmark_measures_off_and_on_in_process_and_served():
    lines = run_benchmark(
        "batching.py",
        *("--rounds", "1", "--seconds", "1", "--warmup", "0.5"),
        *("--units", "256", "--clients", "1,4"),
    )
    served = lines.index("through lifecycle serve (TF Serving REST :predict):")
    in_process = lines.index("in-process (registry.predict):")
    assert in_process < served, lines
    check_batching_part(lines[in_process:served], served=False)
    check_batching_part(lines[served:], served=True)


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
