"""Harness shared by the benchmark scripts: one child process per variant, one table.

A benchmark script plays two roles. Run plainly, it is the parent: it re-invokes
itself once per variant with ``--variant NAME`` (:func:`run_variants`), each in a
fresh Python process so that one variant's leaks and caches cannot distort
another's numbers, then prints the machine (:func:`machine_lines`) and a table
(:func:`render_table`). Run with ``--variant``, it is a child: it measures that one
variant and prints the result as a single ``RESULT <json>`` line on stdout
(:func:`print_result`), which the parent parses.

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
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

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


# ----------------------------------------------------------------- command line


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
    parser: argparse.ArgumentParser, choices: Sequence[str], timeout: float
) -> None:
    """Add ``--timeout`` (seconds per child) and the hidden ``--variant`` of a child.

    Args:
        parser: The script's parser.
        choices: The variants the script knows.
        timeout: The default of ``--timeout``.
    """
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per child")
    parser.add_argument("--variant", choices=choices, help=argparse.SUPPRESS)


def parse_variants(parser: argparse.ArgumentParser, spec: str, choices: Sequence[str]) -> list[str]:
    """The variants named by a comma-separated ``--variants`` value.

    Args:
        parser: The script's parser, which reports a bad value (and exits).
        spec: The value of ``--variants``.
        choices: The variants the script knows.

    Returns:
        The named variants, in the order given, without repeats.
    """
    variants = [v.strip() for v in spec.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(choices))
    if unknown or not variants:
        parser.error(f"--variants takes a subset of {','.join(choices)}; got {unknown}")
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
) -> dict[str, ChildOutcome]:
    """Run one child per variant, in order, reporting progress on stderr.

    Args:
        script: Path of the benchmark script to re-invoke.
        variants: The variants to run.
        options: Command-line arguments every child gets after ``--variant``.
        timeout: Seconds each child may take.

    Returns:
        The outcome of each variant, in the order they ran.
    """
    outcomes: dict[str, ChildOutcome] = {}
    for variant in variants:
        print(f"running variant {variant} ...", file=sys.stderr, flush=True)
        outcome = spawn_child(script, variant, options, timeout)
        status = "ok" if outcome.error is None else "FAILED"
        print(f"  {status} in {outcome.seconds:.1f} s", file=sys.stderr, flush=True)
        outcomes[variant] = outcome
    return outcomes


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
    print()
    print(render_table(header, rows))
    print()
    print("\n".join(legend))
    if notes:
        print("per variant:")
        print("\n".join(notes))


def report_failures(outcomes: Mapping[str, ChildOutcome]) -> int:
    """Print each failed variant's error on stderr.

    Args:
        outcomes: The outcomes returned by :func:`run_variants`.

    Returns:
        The parent's exit code: 1 if any variant failed, else 0.
    """
    failed = [o for o in outcomes.values() if o.error is not None]
    for outcome in failed:
        print(f"\nvariant {outcome.variant} failed: {outcome.error}", file=sys.stderr)
    return 1 if failed else 0


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
