"""``lifecycle soak``: train and drop a model in a loop, three ways side by side.

Each variant runs in a child process of its own (:mod:`._soak_worker`), which
prints one JSON line per cycle; this process reads them as they come, shows a
progress bar per variant and ends with a table of memory growth per cycle.
"""

# No `from __future__ import annotations`: typer reads the command's annotations
# at run time.
import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from typing import Any

import typer

from ._allocator import allocator_option, choose_allocator
from ._console import MissingExtraError, console
from ._plot import path_problem, plot_soak, require_matplotlib
from ._quiet import import_library
from ._soak_worker import VARIANTS, weights_mib

MiB = 2**20
WORKER = "lifecycle.cli._soak_worker"


def soak(
    cycles: int = typer.Option(15, min=3, help="Training cycles per variant."),
    units: int = typer.Option(512, min=1, help="Hidden width of the MLP."),
    variants: str = typer.Option("a,b,c", help="Comma-separated subset of a,b,c."),
    plot: str = typer.Option(None, help="Write a PNG chart of RSS per cycle here."),
    timeout: float = typer.Option(600.0, help="Seconds for the whole soak."),
    allocator: str = allocator_option(),
) -> None:
    """Train and drop a model in a loop, three ways side by side, and compare memory.

    (a) del model; (b) del model + keras.backend.clear_session() + gc.collect();
    (c) a ManagedModel and dispose(). Each variant runs in its own process.
    """
    chosen = [v.strip() for v in variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown variants {unknown}; choose from a,b,c")
    if plot is not None:
        try:
            require_matplotlib()
        except MissingExtraError as error:
            raise typer.BadParameter(str(error)) from error
        problem = path_problem(plot)
        if problem is not None:
            raise typer.BadParameter(problem, param_hint="'--plot'")
    # Every variant's process runs with it (LIFECYCLE_ALLOCATOR, inherited).
    chosen_allocator = choose_allocator(allocator)
    out = console()
    model_mib = weights_mib(units)
    out.print(
        f"Soak: MLP 784-{units}-{units}-10 + Adam ({model_mib:.1f} MiB of weights and "
        f"slots), {cycles} cycles per variant, variants side by side, "
        f"CPU allocator: {chosen_allocator}"
    )
    # Here rather than at the top: `lifecycle --help` does not need them.
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table

    # Only for the trend fit: the children train, this process reads their samples.
    import_library()
    from ..monitoring._trend import fit

    with Progress(
        TextColumn("{task.description:<32}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rss]}"),
        console=out,
    ) as progress:
        tasks = {v: progress.add_task(VARIANTS[v], total=cycles, rss="") for v in chosen}

        def on_cycle(variant: str, sample: dict[str, Any]) -> None:
            progress.update(tasks[variant], advance=1, rss=f"RSS {sample['rss_mib']:.0f} MiB")

        results = run_soak(chosen, cycles, units, timeout, on_cycle)
    # A fifth of the cycles settle caches and the allocator, as long as the 3 samples
    # a trend needs are left: none at the minimum of 3 cycles.
    warmup = min(max(1, cycles // 5), cycles - 3)
    table = Table(
        title=f"Memory per cycle (least-squares slope after {warmup} warm-up "
        f"{'cycle' if warmup == 1 else 'cycles'})"
    )
    for column in (
        "variant",
        "MiB/cycle",
        "95% interval",
        "verdict",
        "growth MiB",
        "final RSS MiB",
        "s/cycle",
    ):
        left = column in ("variant", "verdict")
        table.add_column(column, justify="left" if left else "right", no_wrap=left)
    failed = False
    for variant in chosen:
        result = results[variant]
        if result["error"] is not None or len(result["rss"]) < cycles:
            failed = True
            reason = result["error"] or f"{len(result['rss'])} of {cycles} cycles reported"
            table.add_row(VARIANTS[variant], "FAILED", "-", reason, "-", "-", "-")
            continue
        trend = fit(
            [r * MiB for r in result["rss"][warmup:]],
            confidence=0.95,
            tolerance=0.25 * model_mib * MiB,
        )
        table.add_row(
            VARIANTS[variant],
            f"{trend.slope / MiB:+.2f}",
            f"{trend.low / MiB:+.2f} to {trend.high / MiB:+.2f}",
            trend.verdict,
            f"{result['rss'][-1] - result['rss'][0]:+.1f}",
            f"{result['rss'][-1]:.0f}",
            f"{sum(result['seconds'][warmup:]) / len(result['seconds'][warmup:]):.2f}",
        )
    out.print(table)
    out.print(
        f"verdict: 'leaking' when the interval's lower bound exceeds {0.25 * model_mib:.1f} "
        "MiB/cycle (a quarter of one model)"
    )
    if plot is not None:
        plot_soak(results, VARIANTS, plot)
        out.print(f"chart: {plot}")
    if failed:
        raise typer.Exit(1)


def run_soak(
    variants: list[str], cycles: int, units: int, timeout: float, on_cycle: Any
) -> dict[str, dict[str, Any]]:
    """Run the soak variants side by side, each in its own process.

    Args:
        variants: Variant keys of :data:`VARIANTS` (``a``, ``b``, ``c``).
        cycles: Cycles per variant.
        units: Hidden width of the MLP.
        timeout: Seconds for all of them.
        on_cycle: Called as ``on_cycle(variant, sample)`` for each cycle.

    Returns:
        Per variant: ``rss`` (MiB per cycle), ``seconds`` per cycle, ``error``.
    """
    # Each worker's stderr goes to a file: a pipe read only at the end would
    # block a worker that wrote more than the pipe holds.
    with contextlib.ExitStack() as stack:
        errors = {v: stack.enter_context(tempfile.TemporaryFile("w+")) for v in variants}
        return _run_workers(variants, cycles, units, timeout, on_cycle, errors)


def _run_workers(
    variants: list[str],
    cycles: int,
    units: int,
    timeout: float,
    on_cycle: Any,
    errors: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """:func:`run_soak`'s work, each worker's stderr going to its file in ``errors``."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = {
        variant: subprocess.Popen(
            [
                *(sys.executable, "-m", WORKER, "--variant", variant),
                *("--cycles", str(cycles), "--units", str(units)),
            ],
            stdout=subprocess.PIPE,
            stderr=errors[variant],
            text=True,
            env=env,
        )
        for variant in variants
    }
    results: dict[str, dict[str, Any]] = {
        v: {"rss": [], "seconds": [], "error": None} for v in variants
    }
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for variant, process in processes.items():
            assert process.stdout is not None
            selector.register(process.stdout, selectors.EVENT_READ, variant)
        open_streams = len(processes)
        while open_streams and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1.0):
                line = key.fileobj.readline()  # type: ignore[union-attr]
                if not line:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                try:
                    sample = json.loads(line)
                except json.JSONDecodeError:
                    continue
                results[key.data]["rss"].append(sample["rss_mib"])
                results[key.data]["seconds"].append(sample["seconds"])
                on_cycle(key.data, sample)
    for variant, process in processes.items():
        try:  # its output is complete; let it exit
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            results[variant]["error"] = f"timed out after {timeout:g} s"
        process.communicate()
        errors[variant].seek(0)
        err = errors[variant].read()
        if process.returncode and results[variant]["error"] is None:
            results[variant]["error"] = f"exit code {process.returncode}: {err.strip()[-500:]}"
    return results
