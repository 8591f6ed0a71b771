"""The one harness of the benchmark scripts: options, rounds, children, tables, JSON.

A script declares a :class:`Benchmark`: its variants, the metrics its
measurement reports, its own options, and the function that measures one
variant. Its ``main`` is ``_harness.main(BENCHMARK)``; everything else is here:

* the command line: the script's options plus ``--variants``, ``--rounds``,
  ``--timeout``, ``--quick`` (the script's small workload, 1 round, no file
  written unless ``--out``) and ``--out`` (the JSON file; by default
  ``benchmarks/results/<script>.json``);
* rounds: the machine drifts (±15 % over minutes), so variants are
  interleaved. Each round runs every variant in a fresh child process (the
  script re-invoked with ``--variant NAME``, which prints one ``RESULT <json>``
  line), the order rotating from round to round (A B C, B C A, ...). A script
  that measures in one process (``collect``) rotates the same way with
  :func:`interleave`;
* the report: per case, variant and metric the median over the rounds with its
  range, and the ratio to the baseline variant taken within each round (where the
  drift cancels) and summarised the same way: ``1.01x (0.87-1.10)``. Printed as a
  table, written as JSON (:func:`result_document` gives the schema).

A child's result is a mapping of metric keys to numbers (one case), or
``{"cases": {case: {metric: number}}}`` plus any other keys, which only the
script's ``notes`` read. Nothing here imports TensorFlow, so neither does a parent.
The benchmarks that measure servers start, wait for and stop them with
:mod:`_harness.servers`.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
RESULT_PREFIX = "RESULT "
BENCHMARKS = Path(__file__).resolve().parents[1]
REPO_ROOT = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
# Metrics per table of the report (a wider table would wrap).
COLUMNS = 6
# Lines of a failed child's stderr kept in its error message.
STDERR_TAIL_LINES = 15

Result = dict[str, Any]
# One mapping per round, from variant to its result (None: its child failed).
Runs = list[dict[str, Result | None]]


@dataclass(frozen=True)
class Option:
    """One of a script's own command-line options; children get the same command line."""

    flag: str
    default: Any
    help: str
    type: Callable[[str], Any] | None = None  # None: the default's type


@dataclass(frozen=True)
class Metric:
    """A number a child reports, how it is shown, and whether it is compared."""

    key: str
    unit: str
    spec: str = ".1f"
    label: str = ""  # the table's column; the key by default
    ratio: bool = True  # compared with the baseline variant, round by round


@dataclass(frozen=True)
class Benchmark:
    """What a script measures; :func:`main` does the rest.

    Attributes:
        name: The script's stem (``Path(__file__).stem``).
        doc: Its module docstring (the first paragraph heads ``--help``).
        variants: Variant names and what each is.
        metrics: What a result holds.
        measure: Measures one variant in a child: ``measure(variant, args)``
            (for a benchmark that collects, runs a child's role).
        options: The script's own options.
        quick: Option values of ``--quick``, a small workload (1 round).
        baseline: The variant each is compared with, or a function of the variant
            (None: no comparison); the first variant by default.
        rounds, timeout: Defaults of ``--rounds`` and ``--timeout`` (seconds a
            child may take; without children, the whole run).
        collect: Instead of a child per variant, runs every round itself (in
            this process, :func:`interleave`, or with servers and children of
            its own) and returns the runs.
        notes: Extra report lines from the runs (targets, what a child saw).
        check: Problems that make the run fail (exit code 1), from the runs.
        validate: Checks the parsed options; returns an error message or None.
    """

    name: str
    doc: str | None
    variants: Mapping[str, str]
    metrics: Sequence[Metric]
    measure: Callable[[str, argparse.Namespace], Result] | None = None
    options: Sequence[Option] = ()
    quick: Mapping[str, Any] = field(default_factory=dict)
    baseline: str | Callable[[str], str | None] | None = ""
    rounds: int = 3
    timeout: float = 600.0
    collect: Callable[[argparse.Namespace], Runs] | None = None
    notes: Callable[[Runs, argparse.Namespace], list[str]] | None = None
    check: Callable[[Runs, argparse.Namespace], list[str]] | None = None
    validate: Callable[[argparse.Namespace], str | None] | None = None

    @property
    def title(self) -> str:
        return (self.doc or self.name).strip().splitlines()[0].rstrip(".")

    def baseline_of(self, variant: str) -> str | None:
        if callable(self.baseline):
            return self.baseline(variant)
        return self.baseline or next(iter(self.variants))


# ----------------------------------------------------------------- command line


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1; got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An ``argparse`` type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number above 0; got {text!r}")
    return value


def positive_ints(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated integers of at least 1."""
    return [positive_int(part) for part in text.split(",")]


def names(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An ``argparse`` type: a comma-separated subset of ``choices``, in the order given."""

    def parse(text: str) -> list[str]:
        picked = list(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
        unknown = [v for v in picked if v not in choices]
        if unknown or not picked:
            raise argparse.ArgumentTypeError(f"takes a subset of {','.join(choices)}; got {text!r}")
        return picked

    return parse


def image_side(text: str) -> int:
    """An ``argparse`` type: an image side ResNet50 accepts (at least 32)."""
    value = positive_int(text)
    if value < 32:
        raise argparse.ArgumentTypeError(f"must be at least 32 (ResNet50's minimum); got {text!r}")
    return value


def parse_args(bench: Benchmark, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of ``bench``: its options, then the harness's."""
    parser = argparse.ArgumentParser(
        prog=f"{bench.name}.py",
        description=(bench.doc or "").split("\n\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for option in bench.options:
        if isinstance(option.default, bool):
            parser.add_argument(option.flag, action="store_true", help=option.help)
            continue
        kind = option.type or type(option.default)
        parser.add_argument(option.flag, type=kind, default=option.default, help=option.help)
    choices = list(bench.variants)
    parser.add_argument(
        "--variants", type=names(choices), default=",".join(choices), help="comma-separated"
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=bench.rounds, help="rounds of every variant"
    )
    what = "the whole run" if bench.collect else "each child"
    parser.add_argument(
        "--timeout", type=positive_float, default=bench.timeout, help=f"seconds for {what}"
    )
    parser.add_argument("--quick", action="store_true", help="small workload, 1 round")
    parser.add_argument("--out", type=Path, help="JSON result file [results/<script>.json]")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # a child's one variant
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--quick" in argv:
        parser.set_defaults(**{"rounds": 1, **bench.quick})
    args = parser.parse_args(argv)
    args.argv = argv
    problem = bench.validate(args) if bench.validate else None
    if problem:
        parser.error(problem)
    return args


def main(bench: Benchmark, argv: Sequence[str] | None = None) -> int:
    """Run ``bench`` as its command line says: one child's variant, or the whole report."""
    args = parse_args(bench, argv)
    if args.variant is not None:
        assert bench.measure is not None
        print(RESULT_PREFIX + json.dumps(bench.measure(args.variant, args)), flush=True)
        return 0
    if bench.collect is not None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # SIGALRM ends a run that hangs; with children, each has its own timeout.
        signal.alarm(0 if bench.measure else max(1, int(args.timeout)))
        runs, failures = bench.collect(args), []
        signal.alarm(0)
        runs = [{v: r for v, r in run.items() if v in args.variants} for run in runs]
    else:
        assert bench.measure is not None, "a benchmark measures in children or collects"
        script = Path(sys.modules[bench.measure.__module__].__file__ or bench.name)
        runs, failures = run_rounds(script, args.variants, args.rounds, args.argv, args.timeout)
    return report(bench, args, runs, failures)


# ------------------------------------------------------------------------ rounds


@dataclass
class ChildOutcome:
    """What a child process produced for one variant: its result or why it failed."""

    variant: str
    result: Result | None
    error: str | None
    seconds: float


def child_environment() -> dict[str, str]:
    """The environment of a child: quiet TensorFlow, this source tree first on the path."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if (REPO_ROOT / "lifecycle" / "__init__.py").is_file():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def spawn_child(
    script: str | os.PathLike[str], variant: str, options: Sequence[str], timeout: float
) -> ChildOutcome:
    """Run ``script *options --variant variant`` in a fresh Python; parse its ``RESULT`` line."""
    command = [sys.executable, str(script), *options, "--variant", variant]
    started = time.perf_counter()
    try:
        # On timeout, subprocess.run kills the child before raising.
        done = subprocess.run(
            command, env=child_environment(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return ChildOutcome(variant, None, f"timed out after {timeout:g} s", timeout)
    elapsed = time.perf_counter() - started
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
        missing = "" if lines else ", no result line"
        return ChildOutcome(variant, None, f"exit code {done.returncode}{missing}\n{tail}", elapsed)
    return ChildOutcome(variant, json.loads(lines[-1][len(RESULT_PREFIX) :]), None, elapsed)


def rotation(items: Sequence[str], index: int) -> list[str]:
    """The order of round ``index`` (from 0): A B C, then B C A, then C A B, ..."""
    shift = index % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def run_rounds(
    script: str | os.PathLike[str],
    variants: Sequence[str],
    rounds: int,
    options: Sequence[str],
    timeout: float,
    spawn: Callable[..., ChildOutcome] | None = None,
) -> tuple[Runs, list[str]]:
    """``rounds`` rounds, each every variant in a fresh child, the order rotating.

    Returns:
        The runs, and one line per failed child (its round, variant and error).
    """
    if rounds < 1 or not variants:
        raise ValueError(f"need at least 1 round and 1 variant; got {rounds} and {variants!r}")
    spawn = spawn or spawn_child  # looked up now, so that tests can stand in for it
    runs: Runs = []
    failures = []
    for index in range(rounds):
        run: dict[str, Result | None] = {}
        for variant in rotation(variants, index):
            print(f"round {index + 1}/{rounds}: {variant} ...", file=sys.stderr, flush=True)
            outcome = spawn(script, variant, options, timeout)
            run[variant] = outcome.result
            if outcome.error is not None:
                failures.append(f"round {index + 1}, variant {variant}: {outcome.error}")
        runs.append(run)
    return runs, failures


def interleave(ways: Mapping[str, Callable[[], Result]], rounds: int) -> Runs:
    """Call every way once per round in this process, after a warm-up round, rotating.

    Args:
        ways: By variant, a call that measures it once and returns its result.
        rounds: Measured rounds.

    Returns:
        The measured rounds (the warm-up round left out).
    """
    runs: Runs = []
    for index in range(rounds + 1):
        run = {way: ways[way]() for way in rotation(list(ways), index)}
        if index:
            runs.append(run)
    return runs


# ------------------------------------------------------------------------- numbers


@dataclass(frozen=True)
class Spread:
    """The median of a few measurements and their range."""

    median: float
    low: float
    high: float
    count: int


def spread_of(values: Iterable[float | None]) -> Spread | None:
    """The median and range of ``values`` that are neither None nor NaN; None if none are."""
    found = [v for v in values if v is not None and not math.isnan(v)]
    if not found:
        return None
    return Spread(statistics.median(found), min(found), max(found), len(found))


def percentiles(values: Sequence[float], *points: float) -> list[float | None]:
    """The ``points`` percentiles (0-100) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    if not ordered:
        return [None for _ in points]
    found = []
    for point in points:
        at = (len(ordered) - 1) * point / 100
        low = math.floor(at)
        high = min(low + 1, len(ordered) - 1)
        found.append(ordered[low] + (ordered[high] - ordered[low]) * (at - low))
    return found


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """A cell: ``value`` formatted, or ``"-"`` for None or NaN."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:{spec}}{suffix}"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:  # all bound at once: distinct
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def slope(values: Sequence[float]) -> float | None:
    """Least-squares slope of ``values`` against their index (None for fewer than 2)."""
    if len(values) < 2:
        return None
    return statistics.linear_regression(range(len(values)), values).slope


class Collections:
    """Python's collections while ``active``, through ``gc.callbacks``.

    Each is ``(start, end, generation, thread name)``, perf_counter seconds. A
    collection's time is not all time the GIL was held: the finalizers it runs
    can let other threads run. :meth:`close` removes the callback.
    """

    def __init__(self, active: bool = True) -> None:
        self.active = active
        self.events: list[tuple[float, float, int, str]] = []
        self._started: dict[str, float] = {}
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        thread = threading.current_thread().name
        if phase == "start":
            self._started[thread] = time.perf_counter()
        elif self.active and thread in self._started:
            started = self._started.pop(thread)
            self.events.append((started, time.perf_counter(), info["generation"], thread))

    def close(self) -> None:
        gc.callbacks.remove(self)

    def summary(self, prefix: str, keep: Callable[[int, str], bool]) -> dict[str, float]:
        """Count, total and longest (ms) of the collections ``keep(generation, thread)``."""
        ms = [1000 * (end - start) for start, end, gen, name in self.events if keep(gen, name)]
        found = {"collections": len(ms), "total_ms": sum(ms), "max_ms": max(ms, default=0.0)}
        return {f"{prefix}_{key}": value for key, value in found.items()}

    def inside(self, start: float, end: float) -> float:
        """Milliseconds of collections within ``[start, end]``."""
        return sum(1000 * max(0.0, min(end, e) - max(start, s)) for s, e, *_ in self.events)


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
    for number_, run in enumerate(runs):
        for variant, result in run.items():
            for case, found in cases_of(result or {}, bench.name).items():
                for metric in bench.metrics:
                    column = values.setdefault((case, variant, metric.key), [None] * len(runs))
                    column[number_] = number(found.get(metric.key))
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
    return rows


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
    out = args.out or (None if args.quick else RESULTS / f"{bench.name}.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written: {out}")
    return 1 if problems else 0
