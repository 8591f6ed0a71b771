"""The benchmarks' results files keep their schema, and docs/benchmarks.md renders them.

Every script in ``benchmarks/`` has ``benchmarks/results/<script>.json``: recorded
figures (``"source": "recorded"``) or a run of the script (``"run"``), in the schema
the harness writes, with the variant and metric keys the script declares, so that a
rerun's file compares case by case with the recorded one. A recorded figure that no
script measures any more stays only under ``history``, with a note. The page stays
short and links every file.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
# A page a user reads in two minutes.
MAX_PAGE_LINES = 400

SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))
FILES = sorted(RESULTS.glob("*.json"))
TOP_KEYS = {"benchmark", "title", "date", "machine", "command", "source", "cases"}
CASE_KEYS = {"case", "variant", "metric", "unit", "median", "min", "max", "rounds"}
CASE_KEYS |= {"baseline", "ratio", "variant_label", "metric_label"}
HISTORY_KEYS = {"case", "variant", "metric", "unit", "median", "note"}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number_or_none(value: Any) -> bool:
    return value is None or _is_number(value)


@functools.cache
def _declaration(script: str) -> tuple[dict[str, str], dict[str, str]]:
    """A script's variants and its metrics' units, read from its ``BENCHMARK``.

    Importing a script runs no benchmark: they import TensorFlow when they measure.
    """
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # the scripts import _harness and each other
    bench = importlib.import_module(script).BENCHMARK
    return dict(bench.variants), {metric.key: metric.unit for metric in bench.metrics}


def _declared_problems(case: dict[str, Any], script: str) -> list[str]:
    if CASE_KEYS - case.keys():
        return []  # the schema's test names what is missing
    variants, units = _declaration(script)
    problems = []
    if case["variant"] not in variants:
        problems.append(
            f"variant {case['variant']!r} is not one of {script}.py's {sorted(variants)}"
        )
    if case["metric"] not in units:
        problems.append(f"metric {case['metric']!r} is not one of {script}.py's {sorted(units)}")
    elif case["unit"] != units[case["metric"]]:
        problems.append(f"unit {case['unit']!r}, but {script}.py says {units[case['metric']]!r}")
    if case["baseline"] is not None and case["baseline"] not in variants:
        problems.append(f"baseline {case['baseline']!r} is not a variant of {script}.py")
    return problems


def _case_problems(case: dict[str, Any], runs: dict[str, Any]) -> list[str]:
    problems = [f"missing {key!r}" for key in sorted(CASE_KEYS - case.keys())]
    if problems:
        return problems
    for key in ("case", "variant", "metric", "unit", "variant_label", "metric_label"):
        if not isinstance(case[key], str):
            problems.append(f"{key} is not a string: {case[key]!r}")
    # A recorded figure may be a ratio alone (within each round), its median unknown.
    if case["median"] is None and case["ratio"] is None:
        problems.append("neither a median nor a ratio")
    elif not _number_or_none(case["median"]):
        problems.append(f"median is neither a number nor null: {case['median']!r}")
    if case["median"] is None and case["min"] is not None:
        problems.append("a range without a median")
    for key in ("min", "max", "ratio", "ratio_min", "ratio_max"):
        if not _number_or_none(case.get(key)):
            problems.append(f"{key} is neither a number nor null: {case[key]!r}")
    if not (case["rounds"] is None or isinstance(case["rounds"], int)):
        problems.append(f"rounds is neither an integer nor null: {case['rounds']!r}")
    if case["baseline"] is not None and not isinstance(case["baseline"], str):
        problems.append(f"baseline is neither a string nor null: {case['baseline']!r}")
    if case["ratio"] is not None and case["baseline"] is None:
        problems.append("a ratio without a baseline")
    if (case["min"] is None) != (case["max"] is None):
        problems.append("min and max: one is null, the other not")
    elif (
        case["min"] is not None
        and _is_number(case["median"])
        and not case["min"] <= case["median"] <= case["max"]
    ):
        problems.append(f"median {case['median']} outside {case['min']}..{case['max']}")
    if "run" in case and case["run"] not in runs:
        problems.append(f"run {case['run']!r} is not described under 'runs'")
    return problems


def test_every_benchmark_script_has_a_results_file():
    assert SCRIPTS, "no benchmark scripts found"
    missing = [name for name in SCRIPTS if not (RESULTS / f"{name}.json").exists()]
    assert not missing, f"no benchmarks/results/<script>.json for: {', '.join(missing)}"
    orphans = sorted({path.stem for path in FILES} - set(SCRIPTS))
    assert not orphans, f"results files without a script: {', '.join(orphans)}"


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_a_results_file_has_the_schema(path):
    text = path.read_text(encoding="utf-8")
    document = json.loads(text)
    missing = sorted(TOP_KEYS - document.keys())
    assert not missing, f"{path.name}: missing keys {missing}"
    assert document["benchmark"] == path.stem, f"{path.name}: benchmark {document['benchmark']!r}"
    assert document["source"] in ("recorded", "run"), f"{path.name}: source {document['source']!r}"
    date = document["date"]
    assert date is None or re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), f"{path.name}: date {date!r}"
    machine = document["machine"]
    assert isinstance(machine, dict) and machine.get("cpu"), f"{path.name}: machine has no cpu"
    assert isinstance(machine.get("cores"), int), f"{path.name}: machine has no cores"
    assert document["command"].startswith("python benchmarks/"), f"{path.name}: command"
    runs = document.get("runs", {})
    assert isinstance(runs, dict), f"{path.name}: runs is not a mapping"
    assert document["cases"], f"{path.name}: no cases"
    problems = [
        f"case {index} ({case.get('variant')}, {case.get('metric')}): {problem}"
        for index, case in enumerate(document["cases"])
        for problem in _case_problems(case, runs)
    ]
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)
    history = document.get("history", [])
    assert isinstance(history, list), f"{path.name}: history is not a list"
    problems = [
        f"history {index} ({entry.get('variant')}, {entry.get('metric')}): {problem}"
        for index, entry in enumerate(history)
        for problem in _history_problems(entry, runs)
    ]
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def _history_problems(entry: dict[str, Any], runs: dict[str, Any]) -> list[str]:
    problems = [f"missing {key!r}" for key in sorted(HISTORY_KEYS - entry.keys())]
    if not problems and not (isinstance(entry["note"], str) and entry["note"].strip()):
        problems.append("no note saying where the figure came from")
    if not problems and not _is_number(entry["median"]):
        problems.append(f"median is not a number: {entry['median']!r}")
    if "run" in entry and entry["run"] not in runs:
        problems.append(f"run {entry['run']!r} is not described under 'runs'")
    return problems


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_a_results_file_uses_the_keys_its_script_declares(path):
    document = json.loads(path.read_text(encoding="utf-8"))
    if path.stem not in SCRIPTS:
        pytest.fail(f"{path.name}: no benchmarks/{path.stem}.py")
    problems = [
        f"case {index} ({case.get('variant')}, {case.get('metric')}): {problem}"
        for index, case in enumerate(document["cases"])
        for problem in _declared_problems(case, path.stem)
    ]
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)
    # What a script still measures belongs in cases, not in history.
    variants, units = _declaration(path.stem)
    current = [
        f"history {index}: {entry['variant']!r}, {entry['metric']!r}"
        for index, entry in enumerate(document.get("history", []))
        if entry["variant"] in variants and entry["metric"] in units
    ]
    assert not current, f"{path.name}: declared by {path.stem}.py, so not history:\n  " + (
        "\n  ".join(current)
    )


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_a_results_file_has_one_case_per_key(path):
    cases = json.loads(path.read_text(encoding="utf-8"))["cases"]
    keys = [(c["case"], c["variant"], c["metric"], c["baseline"], c.get("run")) for c in cases]
    twice = sorted({key for key in keys if keys.count(key) > 1}, key=str)
    assert not twice, f"{path.name}: cases given twice: {twice}"


def test_the_page_stays_short_and_links_every_results_file():
    page = PAGE.read_text(encoding="utf-8")
    lines = page.count("\n")
    assert lines <= MAX_PAGE_LINES, (
        f"docs/benchmarks.md has {lines} lines (at most {MAX_PAGE_LINES})"
    )
    unlinked = [name for name in SCRIPTS if f"](../benchmarks/results/{name}.json)" not in page]
    assert not unlinked, f"docs/benchmarks.md does not link the results of: {', '.join(unlinked)}"


def test_every_chart_on_the_page_has_a_bar_per_label():
    page = PAGE.read_text(encoding="utf-8")
    charts = re.findall(r"```mermaid\n(.*?)```", page, re.S)
    assert charts, "docs/benchmarks.md has no chart"
    for chart in charts:
        labels = re.search(r"x-axis \[(.*)\]", chart)
        bars = re.search(r"\bbar \[(.*)\]", chart)
        assert labels and bars, f"a chart without x-axis labels or bars:\n{chart}"
        assert len(re.findall(r'"[^"]*"', labels.group(1))) == len(bars.group(1).split(",")), chart
