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
script's ``notes`` read, or lists a :class:`Metric` names as its ``series``.
Nothing here imports TensorFlow, so neither does a parent.
Medians, percentiles and collections are in :mod:`_harness.stats`, the report
and the result file in :mod:`_harness.report` (with the per-round ratios that
judge targets); the benchmarks that measure servers start, wait for and stop
them with :mod:`_harness.servers`, and load them, closed-loop threads or
Locust, while swapping models, with :mod:`_harness.load`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .report import judge as judge
from .report import ratio_over_rounds as ratio_over_rounds
from .report import render_table as render_table
from .report import report as report
from .report import result_document as result_document
from .report import spread_text as spread_text
from .report import summarise as summarise
from .stats import Collections as Collections
from .stats import Spread as Spread
from .stats import fmt as fmt
from .stats import percentiles as percentiles
from .stats import slope as slope
from .stats import spread_of as spread_of

MIB = 1024 * 1024
RESULT_PREFIX = "RESULT "
BENCHMARKS = Path(__file__).resolve().parents[1]
REPO_ROOT = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
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
    # The key of a list in the child's case the number comes from (RSS per cycle, per
    # fold): kept in the JSON as the row's "series", one list per round, not printed.
    series: str = ""


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


def checked(kind: type, ok: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An ``argparse`` type: ``kind(text)`` if ``ok`` of it, else an error saying ``what``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}")
        return value

    return parse


positive_int = checked(int, lambda value: value >= 1, "an integer of at least 1")
positive_float = checked(float, lambda value: value > 0, "a number above 0")
# ResNet50's smallest input.
image_side = checked(int, lambda value: value >= 32, "at least 32 (ResNet50's minimum)")


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
