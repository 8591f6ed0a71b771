"""The report of a run: its cases, the tables printed, the JSON result file.

:func:`summarise` turns the runs into cases (per case, variant and metric: the
median over the rounds with its range, and the median of the per-round ratios
to the baseline variant); :func:`report` prints them and writes the file whose
schema :func:`result_document` gives.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .stats import Spread, fmt, spread_of

if TYPE_CHECKING:
    from . import Benchmark, Result, Runs

# Metrics per table of the report (a wider table would wrap).
COLUMNS = 6


# ------------------------------------------------------------------------- machine


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` gives it (``/proc/cpuinfo`` if it cannot)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    if not out and Path("/proc/cpuinfo").is_file():
        out = Path("/proc/cpuinfo").read_text()
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "model name":
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def version_of(*distributions: str) -> str:
    """The version of the first of ``distributions`` installed, or ``"not installed"``."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def machine() -> dict[str, Any]:
    """The ``machine`` of a result file."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": version_of("tensorflow", "tensorflow-cpu"),
        "keras": version_of("keras"),
    }


# -------------------------------------------------------------------------- report


def cases_of(result: Result, default: str) -> dict[str, Mapping[str, Any]]:
    """A result's cases: its ``cases``, or the result itself as the case ``default``."""
    return result.get("cases") or {default: result}


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def summarise(bench: Benchmark, runs: Runs) -> list[dict[str, Any]]:
    """The ``cases`` of a result file: per case, variant and metric, over the rounds."""
    values: dict[tuple[str, str, str], list[float | None]] = {}
    series: dict[tuple[str, str, str], list[Any]] = {}
    for number_, run in enumerate(runs):
        for variant, result in run.items():
            for case, found in cases_of(result or {}, bench.name).items():
                for metric in bench.metrics:
                    column = values.setdefault((case, variant, metric.key), [None] * len(runs))
                    column[number_] = number(found.get(metric.key))
                    if metric.series and found.get(metric.series) is not None:
                        series.setdefault((case, variant, metric.key), [])
                        series[case, variant, metric.key].append(found[metric.series])
    rows = []
    for (case, variant, key), column in values.items():
        metric = next(m for m in bench.metrics if m.key == key)
        found = spread_of(column)
        if found is None:
            continue
        base = bench.baseline_of(variant) if metric.ratio else None
        under = values.get((case, base, key)) if base else None
        ratios = None
        if under is not None:
            ratios = spread_of(a / b for a, b in zip(column, under, strict=True) if a and b)
        rows.append(
            {
                "case": case,
                "variant": variant,
                "metric": key,
                "unit": metric.unit,
                "median": found.median,
                "min": found.low,
                "max": found.high,
                "rounds": found.count,
                "baseline": base if ratios else None,
                "ratio": ratios.median if ratios else None,
                "ratio_min": ratios.low if ratios else None,
                "ratio_max": ratios.high if ratios else None,
                # What a page shows for them: the variant's description, the column's name.
                "variant_label": bench.variants.get(variant, variant),
                "metric_label": metric.label or key,
            }
        )
        if (case, variant, key) in series:
            rows[-1]["series"] = series[case, variant, key]
    return rows


def ratio_over_rounds(
    runs: Runs, key: str, over: str, under: str, case: str | None = None
) -> Spread | None:
    """``over``'s ``key`` over ``under``'s within each round that has both, summarised.

    ``case``: the case of results that report several; None for a one-case result.
    """

    def value(result: Result | None) -> float | None:
        found = (result or {}).get("cases", {}).get(case, {}) if case else (result or {})
        return number(found.get(key))

    pairs = [(value(run.get(over)), value(run.get(under))) for run in runs]
    return spread_of(a / b for a, b in pairs if a is not None and b)


def judge(label: str, found: Spread | None, bound: float, at_least: bool = False) -> str:
    """A target's line: ``label``, met or MISSED by the median of ``found``, the median."""
    if found is None:
        return f"target: {label}: not measured"
    met = found.median >= bound if at_least else found.median <= bound
    return f"target: {label}: {'met' if met else 'MISSED'} ({found.median:.2f}x)"


def spread_text(found: Spread | None, spec: str = ".2f", unit: str = "x") -> str:
    """``1.01x (0.87-1.10)``, or ``-`` when nothing was measured."""
    if found is None:
        return "-"
    return f"{found.median:{spec}}{unit} ({found.low:{spec}}-{found.high:{spec}})"


def result_document(bench: Benchmark, args: argparse.Namespace, runs: Runs) -> dict[str, Any]:
    """The JSON a run writes: what ran, where, and every case's numbers."""
    return {
        "benchmark": bench.name,
        "title": bench.title,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "command": " ".join(["python", f"benchmarks/{bench.name}.py", *args.argv]),
        "source": "run",
        "rounds": args.rounds,
        "cases": summarise(bench, runs),
    }


def tables(bench: Benchmark, cases: Sequence[Mapping[str, Any]]) -> list[list[list[str]]]:
    """The report's tables: a row per case and variant, a column per metric (and ratio).

    Metrics are split over several tables of at most :data:`COLUMNS` metrics each.
    """
    metrics = [m for m in bench.metrics if any(c["metric"] == m.key for c in cases)]
    several = len({c["case"] for c in cases}) > 1
    order = {name: i for i, name in enumerate(dict.fromkeys(c["case"] for c in cases))}
    rank = {name: i for i, name in enumerate(bench.variants)}
    keys = sorted(
        {(c["case"], c["variant"]) for c in cases}, key=lambda k: (order[k[0]], rank[k[1]])
    )
    by_key = {(c["case"], c["variant"], c["metric"]): c for c in cases}
    compared = {c["metric"] for c in cases if c["ratio"] is not None}
    base = "baseline" if callable(bench.baseline) else bench.baseline_of("")
    found = []
    for start in range(0, len(metrics), COLUMNS):
        group = metrics[start : start + COLUMNS]
        header = ["case"] * several + ["variant"]
        for metric in group:
            header += [metric.label or f"{metric.key} {metric.unit}".strip()]
            header += [f"vs {base}"] * (metric.key in compared)
        rows = [header]
        for case, variant in keys:
            row = [case] * several + [variant]
            for metric in group:
                one = by_key.get((case, variant, metric.key))
                row.append(cell(one, "median", "min", "max", metric.spec, ""))
                if metric.key in compared:
                    row.append(cell(one, "ratio", "ratio_min", "ratio_max", ".2f", "x"))
            if any(c != "-" for c in row[1 + several :]):
                rows.append(row)
        found.append(rows)
    return found


def cell(found: Mapping[str, Any] | None, mid: str, low: str, high: str, spec: str, x: str) -> str:
    if found is None or found[mid] is None:
        return "-"
    if found["rounds"] == 1 or found[low] == found[high]:
        return fmt(found[mid], spec, x)
    return f"{fmt(found[mid], spec, x)} ({fmt(found[low], spec)}-{fmt(found[high], spec)})"


def render_table(rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: the header, a rule, the rows; first column left-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(rows[0]), rule, *(line(row) for row in rows[1:])])


def report(bench: Benchmark, args: argparse.Namespace, runs: Runs, failures: Sequence[str]) -> int:
    """Print the report, write the JSON file; 1 if a child failed or a check did not pass."""
    document = result_document(bench, args, runs)
    info = document["machine"]
    print(f"{bench.title}")
    print(
        f"machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}, "
        f"TensorFlow {info['tensorflow']}, Keras {info['keras']}"
    )
    print(f"rounds:  {args.rounds}, variants interleaved; cells: median (min-max) over rounds,")
    print("         ratios: to the baseline variant within each round, then their median")
    for variant in args.variants:
        print(f"  {variant}: {bench.variants[variant]}")
    for rows in tables(bench, document["cases"]):
        print()
        print(render_table(rows))
    baselines = sorted({c["baseline"] for c in document["cases"] if c["baseline"]})
    if baselines:
        print(f"\nbaseline: {', '.join(baselines)}")
    for line in bench.notes(runs, args) if bench.notes else []:
        print(line)
    problems = [*failures, *(bench.check(runs, args) if bench.check else [])]
    for problem in problems:
        print(f"FAILED: {problem.splitlines()[0]}")
        print(problem, file=sys.stderr)
    from . import RESULTS  # read at the call: tests point it elsewhere

    out = args.out or (None if args.quick else RESULTS / f"{bench.name}.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written: {out}")
    return 1 if problems else 0
