"""Harness shared by the benchmark scripts: one child process per variant, one table.

A benchmark script plays two roles. Run plainly, it is the parent: it re-invokes
itself once per variant with ``--variant NAME``, each in a fresh Python process so
that one variant's leaks and caches cannot distort another's numbers, then prints
the machine (:func:`machine_lines`) and a table (:func:`render_table`). Run with
``--variant``, it is a child: it measures that one variant and prints the result
as a single ``RESULT <json>`` line on stdout (:func:`print_result`), which the
parent parses.

Rounds: the machine drifts (±15 % over minutes), so a variant run once, after
another run once, compares two moments as much as two variants.
:func:`run_rounds` runs ``--rounds`` rounds, each running every variant in a
fresh child, the order rotating from round to round (A B C, B C A, C A B, ...),
so that no variant always runs first or last. A ratio between two variants is
taken within each round (:meth:`Rounds.ratios`), where drift mostly cancels, and
reported as the median of the per-round ratios with their spread, min to max
(:func:`fmt_spread`: ``1.01x (0.87-1.10)``); absolute values are reported the
same way, as the median over the rounds (min-max).

The scripts import this module as ``_harness`` (a script run directly has its own
directory on ``sys.path``). Nothing here imports TensorFlow, so neither does the
parent; psutil is imported only where it is needed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TypeAlias

MIB = 1024 * 1024
RESULT_PREFIX = "RESULT "
REPO_ROOT = Path(__file__).resolve().parents[1]
# Lines of a failed child's stderr kept in its error message.
STDERR_TAIL_LINES = 15


@dataclass
class ChildOutcome:
    """What a child process produced for one variant.

    Attributes:
        variant: The variant the child ran.
        result: The child's parsed result, or None if it failed.
        error: Why the child failed (exit code or timeout, and the end of its
            stderr), or None if it succeeded.
        seconds: Wall time of the child process.
    """

    variant: str
    result: dict[str, Any] | None
    error: str | None
    seconds: float


# A measurement read from a child's result: a key, or a function of the result
# (None where the result has no such measurement).
Metric: TypeAlias = "str | Callable[[Mapping[str, Any]], float | None]"


@dataclass
class Rounds:
    """The outcomes of :func:`run_rounds`: every variant's child, round by round.

    Attributes:
        variants: The variants, in the order given (the first round's order).
        runs: One mapping per round, from variant to the outcome of its child,
            in the order the children ran in that round.
    """

    variants: list[str]
    runs: list[dict[str, ChildOutcome]]

    def results(self, variant: str) -> list[dict[str, Any] | None]:
        """``variant``'s result in each round, None where its child failed."""
        return [run[variant].result if variant in run else None for run in self.runs]

    def last_result(self, variant: str) -> dict[str, Any] | None:
        """``variant``'s result in the last round whose child succeeded, or None."""
        found = [r for r in self.results(variant) if r is not None]
        return found[-1] if found else None

    def per_round(self, variant: str, metric: Metric) -> list[float | None]:
        """``metric`` of ``variant`` in each round, None where it was not measured."""
        return [None if r is None else _read(r, metric) for r in self.results(variant)]

    def values(self, variant: str, metric: Metric) -> list[float]:
        """``metric`` of ``variant`` in the rounds that measured it, in round order."""
        return [v for v in self.per_round(variant, metric) if v is not None]

    def ratios(self, metric: Metric, over: str, under: str) -> list[float]:
        """Per round, ``metric`` of ``over`` divided by ``metric`` of ``under``.

        Both values come from the same round, so the machine's drift between
        rounds cancels; rounds where either is missing (or ``under``'s is 0)
        are left out.
        """
        return per_round_ratios(self.per_round(over, metric), self.per_round(under, metric))

    def cell(self, variant: str, metric: Metric, spec: str, suffix: str = "") -> str:
        """A table cell: ``metric`` of ``variant`` over the rounds, ``median (min-max)``.

        Args:
            variant: The variant.
            metric: A key of its results, or a function of a result.
            spec: The format spec of each number (see :func:`fmt_spread`).
            suffix: Text after the median.

        Returns:
            The formatted cell, ``"-"`` if no round measured it.
        """
        return fmt_spread(self.values(variant, metric), spec, suffix)

    def ratio_cell(self, metric: Metric, over: str, under: str, spec: str = ".2f") -> str:
        """A table cell: the per-round ratios ``over / under`` of ``metric``: ``1.01x (0.87-1.10)``.

        Args:
            metric: A key of the results, or a function of a result.
            over: The numerator's variant.
            under: The denominator's variant.
            spec: The format spec of each ratio.

        Returns:
            The median of the per-round ratios with their range, ``"-"`` if none.
        """
        return fmt_spread(self.ratios(metric, over, under), spec, "x")

    def failed(self) -> list[tuple[int, ChildOutcome]]:
        """The failed children, each with its round number (from 1)."""
        return [
            (number, outcome)
            for number, run in enumerate(self.runs, 1)
            for outcome in run.values()
            if outcome.error is not None
        ]

    def succeeded(self, variant: str) -> int:
        """How many of ``variant``'s children succeeded."""
        return sum(r is not None for r in self.results(variant))


def _read(result: Mapping[str, Any], metric: Metric) -> float | None:
    value = metric(result) if callable(metric) else result.get(metric)
    return None if value is None else float(value)


# ----------------------------------------------------------------- command line


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 1.

    Args:
        text: The option's value.

    Returns:
        The integer.

    Raises:
        argparse.ArgumentTypeError: If ``text`` is not an integer of at least 1.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1; got {text!r}")
    return value


def positive_ints(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated integers of at least 1, in order.

    Raises:
        argparse.ArgumentTypeError: If one of them is not an integer of at least 1.
    """
    return [positive_int(part) for part in text.split(",")]


#: The smallest image side keras.applications.ResNet50 accepts.
MIN_IMAGE_SIDE = 32


def image_side(text: str) -> int:
    """An ``argparse`` type: an image side ResNet50 accepts (an integer of at least 32).

    Raises:
        argparse.ArgumentTypeError: If ``text`` is not such an integer.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < MIN_IMAGE_SIDE:
        raise argparse.ArgumentTypeError(
            f"must be an integer of at least {MIN_IMAGE_SIDE} (ResNet50's minimum); got {text!r}"
        )
    return value


def add_input_size_argument(parser: argparse.ArgumentParser, models: str = "ResNet50") -> None:
    """``--input-size``: the image side of the script's ``keras.applications`` models (64)."""
    parser.add_argument(
        "--input-size",
        type=image_side,
        default=64,
        help=f"image side of {models} (at least {MIN_IMAGE_SIDE})",
    )


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of a script's docstring.

    Args:
        doc: The script's module docstring.

    Returns:
        The parser, showing each option's default in ``--help``.
    """
    return argparse.ArgumentParser(
        description=(doc or "").split("\n\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )


def add_variants_argument(parser: argparse.ArgumentParser, choices: Sequence[str]) -> None:
    """Add ``--variants``, the comma-separated variants to run (all by default).

    Args:
        parser: The script's parser.
        choices: The variants the script knows.
    """
    parser.add_argument(
        "--variants",
        default=",".join(choices),
        help=f"comma-separated subset of {','.join(choices)}",
    )


def add_child_arguments(
    parser: argparse.ArgumentParser,
    choices: Sequence[str],
    timeout: float,
    rounds: int | None = None,
) -> None:
    """Add ``--timeout`` (seconds per child), ``--rounds`` and a child's hidden ``--variant``.

    Args:
        parser: The script's parser.
        choices: The variants the script knows.
        timeout: The default of ``--timeout``.
        rounds: The default of ``--rounds`` (see :func:`run_rounds`); None adds
            no ``--rounds``, for a script that defines its own.
    """
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per child")
    if rounds is not None:
        parser.add_argument(
            "--rounds",
            type=positive_int,
            default=rounds,
            help="rounds; each runs every variant in a fresh child, the order rotating",
        )
    parser.add_argument("--variant", choices=choices, help=argparse.SUPPRESS)


def parse_variants(
    parser: argparse.ArgumentParser,
    spec: str,
    choices: Sequence[str],
    option: str = "--variants",
) -> list[str]:
    """The variants (or other choices) named by a comma-separated option's value.

    Args:
        parser: The script's parser, which reports a bad value (and exits).
        spec: The option's value.
        choices: The variants the script knows.
        option: The option's name, for the error message.

    Returns:
        The named variants, in the order given, without repeats.
    """
    variants = [v.strip() for v in spec.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(choices))
    if unknown or not variants:
        parser.error(f"{option} takes a subset of {','.join(choices)}; got {unknown}")
    return list(dict.fromkeys(variants))


def run_role(
    args: argparse.Namespace,
    run_child: Callable[[str, argparse.Namespace], Mapping[str, Any]],
    run_parent: Callable[[argparse.Namespace], int],
) -> int:
    """Run the child role if ``args.variant`` is set, else the parent role.

    Args:
        args: The parsed command line.
        run_child: Measures one variant and returns its result, which is printed
            for the parent (:func:`print_result`).
        run_parent: Runs the variants in children and prints the report.

    Returns:
        The exit code: 0 for a child that returned, else ``run_parent``'s.
    """
    if args.variant is not None:
        print_result(run_child(args.variant, args))
        return 0
    return run_parent(args)


# --------------------------------------------------------------------------- child


def print_result(result: Mapping[str, Any]) -> None:
    """Print a child's result as the ``RESULT <json>`` line its parent parses.

    Args:
        result: The measurements of the variant; must be JSON-serializable.
    """
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# -------------------------------------------------------------------------- parent


def spawn_child(
    script: str | os.PathLike[str], variant: str, options: Sequence[str], timeout: float
) -> ChildOutcome:
    """Run ``script --variant variant *options`` in a fresh Python process.

    The child runs with ``TF_CPP_MIN_LOG_LEVEL=2`` and, when the repository holds
    the ``lifecycle`` sources, with the repository root first on ``PYTHONPATH``,
    so that it measures the source tree the script belongs to, installed or not.

    Args:
        script: Path of the benchmark script to re-invoke.
        variant: Value of its ``--variant`` option.
        options: Further command-line arguments for the child.
        timeout: Seconds after which the child is killed.

    Returns:
        The child's outcome: its last ``RESULT`` line parsed, or the reason it
        failed (non-zero exit, no result line, or timeout).
    """
    command = [sys.executable, str(Path(script).resolve()), "--variant", variant, *options]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if (REPO_ROOT / "lifecycle" / "__init__.py").is_file():
        # Benchmark the source tree this script belongs to, installed or not.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
    started = time.perf_counter()
    try:
        # On timeout, subprocess.run kills the child before raising.
        completed = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        elapsed = time.perf_counter() - started
        return ChildOutcome(variant, None, f"timed out after {timeout:g} s", elapsed)
    elapsed = time.perf_counter() - started
    lines = [ln for ln in completed.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if completed.returncode != 0 or not lines:
        tail = "\n".join(completed.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
        missing = "" if lines else ", no result line"
        error = f"exit code {completed.returncode}{missing}\n{tail}"
        return ChildOutcome(variant, None, error, elapsed)
    return ChildOutcome(variant, json.loads(lines[-1][len(RESULT_PREFIX) :]), None, elapsed)


def run_variants(
    script: str | os.PathLike[str],
    variants: Iterable[str],
    options: Sequence[str],
    timeout: float,
    spawn: Callable[..., ChildOutcome] = spawn_child,
) -> dict[str, ChildOutcome]:
    """Run one child per variant, in order, reporting progress on stderr.

    Args:
        script: Path of the benchmark script to re-invoke.
        variants: The variants to run.
        options: Command-line arguments every child gets after ``--variant``.
        timeout: Seconds each child may take.
        spawn: Runs one child; :func:`spawn_child`, or a stand-in in tests.

    Returns:
        The outcome of each variant, in the order they ran.
    """
    outcomes: dict[str, ChildOutcome] = {}
    for variant in variants:
        print(f"running variant {variant} ...", file=sys.stderr, flush=True)
        outcome = spawn(script, variant, options, timeout)
        status = "ok" if outcome.error is None else "FAILED"
        print(f"  {status} in {outcome.seconds:.1f} s", file=sys.stderr, flush=True)
        outcomes[variant] = outcome
    return outcomes


def rotation(variants: Sequence[str], index: int) -> list[str]:
    """The order of round ``index`` (from 0): A B C, then B C A, then C A B, ...

    Args:
        variants: The variants, in the first round's order.
        index: The round, from 0.

    Returns:
        ``variants`` rotated left by ``index`` places.
    """
    shift = index % len(variants) if variants else 0
    return [*variants[shift:], *variants[:shift]]


def run_rounds(
    script: str | os.PathLike[str],
    variants: Sequence[str],
    rounds: int,
    options: Sequence[str],
    timeout: float,
    spawn: Callable[..., ChildOutcome] = spawn_child,
) -> Rounds:
    """Run ``rounds`` rounds, each running every variant in a fresh child.

    The order rotates from round to round (:func:`rotation`), so that drift
    and the first or last slot of a round hit every variant alike. A child
    that fails is kept in the outcome (see :meth:`Rounds.failed`), and the
    later children still run.

    Args:
        script: Path of the benchmark script to re-invoke.
        variants: The variants to run, in the first round's order.
        rounds: How many rounds, at least 1.
        options: Command-line arguments every child gets after ``--variant``.
        timeout: Seconds each child may take.
        spawn: Runs one child; :func:`spawn_child`, or a stand-in in tests.

    Returns:
        Every child's outcome, round by round.

    Raises:
        ValueError: If ``rounds`` is less than 1 or there are no variants.
    """
    if rounds < 1 or not variants:
        raise ValueError(f"need at least 1 round and 1 variant; got {rounds} and {variants!r}")
    runs = []
    for index in range(rounds):
        print(f"round {index + 1} of {rounds}", file=sys.stderr, flush=True)
        order = rotation(variants, index)
        runs.append(run_variants(script, order, options, timeout, spawn))
    return Rounds(list(variants), runs)


def print_report(
    description: Sequence[str],
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    legend: Sequence[str],
    notes: Sequence[str] = (),
) -> None:
    """Print a benchmark's report: what ran, the table, its legend, per-variant notes.

    Args:
        description: Lines about the machine and the workload.
        header: The table's column names.
        rows: The table's rows.
        legend: Lines explaining the columns.
        notes: Lines under "per variant:"; the heading is left out when empty.
    """
    print("\n".join(description))
    print_table(header, rows, legend)
    if notes:
        print("per variant:")
        print("\n".join(notes))


def print_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], legend: Sequence[str]
) -> None:
    """Print a blank line, a table, a blank line and the lines explaining it.

    Args:
        header: The table's column names.
        rows: The table's rows.
        legend: Lines explaining the columns.
    """
    print()
    print(render_table(header, rows))
    print()
    print("\n".join(legend))


def report_round_failures(rounds: Rounds) -> int:
    """Name the failed children on stdout, under the report, and their errors on stderr.

    Args:
        rounds: The outcomes returned by :func:`run_rounds`.

    Returns:
        The parent's exit code: 1 if any child failed, else 0.
    """
    failed = rounds.failed()
    if failed:
        names = ", ".join(f"{o.variant} in round {number}" for number, o in failed)
        print(f"FAILED children (left out of the medians; errors on stderr): {names}")
    for number, outcome in failed:
        print(
            f"\nround {number}, variant {outcome.variant} failed: {outcome.error}", file=sys.stderr
        )
    return 1 if failed else 0


def rounds_line(rounds: int, what: str = "variant") -> str:
    """The ``rounds:`` line of a report, saying how the numbers were taken.

    Args:
        rounds: The number of rounds run.
        what: What each child of a round measured.

    Returns:
        The line.
    """
    return (
        f"rounds:   {rounds}, each a fresh child per {what}, the order rotating between rounds; "
        "cells: median over the rounds (min-max), ratios taken within each round"
    )


# ------------------------------------------------------------------------- machine


def cpu_model() -> str:
    """The CPU's model name, from ``/proc/cpuinfo`` where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def total_ram_gib() -> float:
    """The machine's physical memory, in GiB."""
    import psutil

    return psutil.virtual_memory().total / 1024**3


def version_of(*distributions: str) -> str:
    """The version of the first of ``distributions`` that is installed.

    Args:
        *distributions: Distribution names to try, in order.

    Returns:
        Its version, or ``"not installed"`` if none is.
    """
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def machine_lines() -> list[str]:
    """The ``machine:`` and ``software:`` lines that head a benchmark's report."""
    return [
        f"machine:  {cpu_model()}, {os.cpu_count()} cores, {total_ram_gib():.1f} GiB RAM, "
        f"{platform.system()} {platform.machine()}",
        f"software: Python {platform.python_version()}, "
        f"TensorFlow {version_of('tensorflow', 'tensorflow-cpu')}, Keras {version_of('keras')}",
    ]


# --------------------------------------------------------------------------- table


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """Format a table cell.

    Args:
        value: The number, or None if there is none.
        spec: Its format spec, such as ``".1f"``.
        suffix: Text appended to the formatted number.

    Returns:
        The formatted number, or ``"-"`` for None or NaN.
    """
    if value is None or math.isnan(value):
        return "-"
    return f"{value:{spec}}{suffix}"


def per_round_ratios(over: Sequence[float | None], under: Sequence[float | None]) -> list[float]:
    """``over[i] / under[i]`` for each round ``i`` where both were measured.

    Args:
        over: The numerator's value in each round (None: not measured).
        under: The denominator's value in the same rounds.

    Returns:
        The ratios, in round order; rounds with a missing value or a zero
        denominator are left out.

    Raises:
        ValueError: If the two sequences differ in length.
    """
    if len(over) != len(under):
        raise ValueError(f"one value per round on each side; got {len(over)} and {len(under)}")
    return [a / b for a, b in zip(over, under, strict=True) if a is not None and b]


@dataclass(frozen=True)
class Spread:
    """The median of a few measurements and their range.

    Attributes:
        median: The median.
        low: The smallest value.
        high: The largest value.
        count: How many values.
    """

    median: float
    low: float
    high: float
    count: int


def spread_of(values: Iterable[float | None]) -> Spread | None:
    """The median and range of ``values`` that are neither None nor NaN.

    Args:
        values: The measurements, such as one per round.

    Returns:
        Their spread, or None if there are none.
    """
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return None
    return Spread(statistics.median(present), min(present), max(present), len(present))


def fmt_spread(values: Iterable[float | None], spec: str, suffix: str = "") -> str:
    """Format the median of ``values`` with their range: ``12.3 ms (11.8-13.0)``.

    Args:
        values: The measurements (None and NaN are left out).
        spec: The format spec of each number, such as ``".1f"``.
        suffix: Text after the median, such as ``"x"`` or ``" ms"``.

    Returns:
        ``median (min-max)``; the median alone for a single value; ``"-"``
        for none.
    """
    found = spread_of(values)
    if found is None:
        return "-"
    median = fmt(found.median, spec, suffix)
    if found.count == 1:
        return median
    return f"{median} ({fmt(found.low, spec)}-{fmt(found.high, spec)})"


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Lay out a plain-text table: first column left-aligned, the others right.

    Args:
        header: The column names.
        rows: The cells of each row, as many as ``header`` has.

    Returns:
        The header, a rule of dashes and the rows, one line each, without
        trailing spaces.
    """
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])
