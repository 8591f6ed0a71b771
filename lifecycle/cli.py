"""The ``lifecycle`` command line: ``soak``, ``inspect`` and ``version``.

Needs the ``cli`` extra (typer and rich); ``soak --plot`` needs ``plot``
(matplotlib). A missing extra is reported with the ``pip install`` that fixes it.
"""

# No `from __future__ import annotations`: typer reads the commands' annotations
# at run time, and typer itself is imported only inside build_app().
import json
import os
import runpy
import selectors
import subprocess
import sys
import time
import traceback
import types
from typing import Any

__all__ = ["build_app", "main"]

CLI_INSTALL = 'pip install "keras-lifecycle[cli]"'
PLOT_INSTALL = 'pip install "keras-lifecycle[plot]"'
MiB = 2**20


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message is the fix."""


def _require_cli() -> tuple[Any, Any]:
    try:
        import rich
        import typer
    except ImportError as error:
        raise MissingExtraError(
            f"The lifecycle command line needs typer and rich: {CLI_INSTALL}"
        ) from error
    return typer, rich


def _require_matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise MissingExtraError(f"--plot needs matplotlib: {PLOT_INSTALL}") from error
    return plt


# -- soak ------------------------------------------------------------------------------


def run_soak(
    variants: list[str], cycles: int, units: int, timeout: float, on_cycle: Any
) -> dict[str, dict[str, Any]]:
    """Run the soak variants side by side, each in its own process.

    Args:
        variants: Variant keys of :mod:`lifecycle._soak` (``a``, ``b``, ``c``).
        cycles: Cycles per variant.
        units: Hidden width of the MLP.
        timeout: Seconds for all of them.
        on_cycle: Called as ``on_cycle(variant, sample)`` for each cycle.

    Returns:
        Per variant: ``rss`` (MiB per cycle), ``seconds`` per cycle, ``error``.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = {
        variant: subprocess.Popen(
            [
                *(sys.executable, "-m", "lifecycle._soak", "--variant", variant),
                *("--cycles", str(cycles), "--units", str(units)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
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
        _, err = process.communicate()
        if process.returncode and results[variant]["error"] is None:
            results[variant]["error"] = f"exit code {process.returncode}: {err.strip()[-500:]}"
    return results


def plot_soak(results: dict[str, dict[str, Any]], labels: dict[str, str], path: str) -> None:
    """A PNG line chart of RSS per cycle per variant."""
    plt = _require_matplotlib()
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for variant, result in results.items():
        if result["rss"]:
            axes.plot(
                range(1, len(result["rss"]) + 1),
                result["rss"],
                marker="o",
                ms=3,
                label=labels[variant],
            )
    axes.set_xlabel("cycle (build, fit, drop)")
    axes.set_ylabel("process RSS (MiB)")
    axes.set_title("Memory per training cycle")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)


# -- inspect ---------------------------------------------------------------------------


def statistics_rows() -> list[tuple[str, str]]:
    """``lc.statistics()`` as (name, value) rows for a table."""
    import lifecycle as lc

    stats = lc.statistics()
    rows = [
        ("live models", f"{stats.live_models}"),
        (
            "models managed / disposed / cleaned up",
            f"{stats.models_managed} / {stats.models_disposed} / {stats.models_cleaned}",
        ),
        ("bytes owned", f"{stats.bytes_owned / MiB:.1f} MiB"),
        ("bytes released", f"{stats.bytes_released / MiB:.1f} MiB"),
        ("gradient-registry entries", f"{stats.gradient_registry_entries}"),
        ("live traced graphs", f"{stats.live_traced_graphs}"),
        ("collections (time)", f"{stats.collections} ({stats.collection_seconds * 1000:.0f} ms)"),
        ("cleaner queue", f"{stats.cleaner_queue}"),
        ("process RSS", "-" if stats.rss_bytes is None else f"{stats.rss_bytes / MiB:.1f} MiB"),
    ]
    rows += [
        (f"device {d.device}", f"{d.current_bytes / MiB:.1f} MiB (peak {d.peak_bytes / MiB:.1f})")
        for d in stats.device_memory
    ]
    return rows


# -- the app ---------------------------------------------------------------------------


def _console(console_class: Any) -> Any:
    """A rich console; 120 columns when the output is not a terminal (logs, CI)."""
    return console_class(width=None if sys.stdout.isatty() else 120)


def build_app() -> Any:
    """The typer application (needs the ``cli`` extra)."""
    typer, _ = _require_cli()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table

    app = typer.Typer(
        help="keras-lifecycle: watch Keras models give their memory back.",
        no_args_is_help=True,
        add_completion=False,
    )

    @app.command()
    def soak(
        cycles: int = typer.Option(15, min=3, help="Training cycles per variant."),
        units: int = typer.Option(512, min=1, help="Hidden width of the MLP."),
        variants: str = typer.Option("a,b,c", help="Comma-separated subset of a,b,c."),
        plot: str = typer.Option(None, help="Write a PNG chart of RSS per cycle here."),
        timeout: float = typer.Option(600.0, help="Seconds for the whole soak."),
    ) -> None:
        """Train and drop a model in a loop, three ways side by side, and compare memory.

        (a) del model; (b) del model + keras.backend.clear_session() + gc.collect();
        (c) a ManagedModel and dispose(). Each variant runs in its own process.
        """
        from . import _soak
        from .monitoring._trend import fit

        chosen = [v.strip() for v in variants.split(",") if v.strip()]
        unknown = sorted(set(chosen) - set(_soak.VARIANTS))
        if unknown or not chosen:
            raise typer.BadParameter(f"unknown variants {unknown}; choose from a,b,c")
        if plot is not None:
            try:
                _require_matplotlib()
            except MissingExtraError as error:
                raise typer.BadParameter(str(error)) from error
        console = _console(Console)
        model_mib = _soak.weights_mib(units)
        console.print(
            f"Soak: MLP 784-{units}-{units}-10 + Adam ({model_mib:.1f} MiB of weights and "
            f"slots), {cycles} cycles per variant, variants side by side"
        )
        with Progress(
            TextColumn("{task.description:<32}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rss]}"),
            console=console,
        ) as progress:
            tasks = {v: progress.add_task(_soak.VARIANTS[v], total=cycles, rss="") for v in chosen}

            def on_cycle(variant: str, sample: dict[str, Any]) -> None:
                progress.update(tasks[variant], advance=1, rss=f"RSS {sample['rss_mib']:.0f} MiB")

            results = run_soak(chosen, cycles, units, timeout, on_cycle)
        warmup = max(1, cycles // 5)
        table = Table(title="Memory per cycle (least-squares slope after the warm-up)")
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
            if result["error"] is not None or len(result["rss"]) < 3:
                failed = True
                table.add_row(
                    _soak.VARIANTS[variant], "FAILED", "-", str(result["error"]), "-", "-", "-"
                )
                continue
            trend = fit(
                [r * MiB for r in result["rss"][warmup:]],
                confidence=0.95,
                tolerance=0.25 * model_mib * MiB,
            )
            table.add_row(
                _soak.VARIANTS[variant],
                f"{trend.slope / MiB:+.2f}",
                f"{trend.low / MiB:+.2f} to {trend.high / MiB:+.2f}",
                trend.verdict,
                f"{result['rss'][-1] - result['rss'][0]:+.1f}",
                f"{result['rss'][-1]:.0f}",
                f"{sum(result['seconds'][warmup:]) / len(result['seconds'][warmup:]):.2f}",
            )
        console.print(table)
        console.print(
            f"verdict: 'leaking' when the interval's lower bound exceeds {0.25 * model_mib:.1f} "
            "MiB/cycle (a quarter of one model)"
        )
        if plot is not None:
            plot_soak(results, _soak.VARIANTS, plot)
            console.print(f"chart: {plot}")
        if failed:
            raise typer.Exit(1)

    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def inspect(
        ctx: typer.Context,
        target: str = typer.Argument(..., help="A Python file, or a module with --module."),
        module: bool = typer.Option(False, "--module", "-m", help="TARGET is a module name."),
    ) -> None:
        """Run a Python file or module, then print statistics and leak reports.

        Arguments after TARGET are passed to it as sys.argv.
        """
        console = _console(Console)
        saved_argv = sys.argv
        sys.argv = [target, *ctx.args]
        failed = False
        namespace: dict[str, Any] = {}
        try:
            if module:
                namespace = runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                if not os.path.isfile(target):
                    raise typer.BadParameter(f"no such file: {target}")
                namespace = runpy.run_path(target, run_name="__main__")
        except SystemExit as exit_:
            failed = exit_.code not in (None, 0)
        except typer.BadParameter:
            raise
        except Exception:
            failed = True
            console.print(traceback.format_exc(), markup=False)
        finally:
            sys.argv = saved_argv
        table = Table(title=f"keras-lifecycle statistics after {target}")
        table.add_column("statistic")
        table.add_column("value", justify="right")
        for name, value in statistics_rows():
            table.add_row(name, value)
        console.print(table)
        # The target's globals outlive its run as a module named after it, so
        # that what they hold is reported as held by that module.
        name = target if module else os.path.splitext(os.path.basename(target))[0]
        held = types.ModuleType(name)
        held.__dict__.update({k: v for k, v in namespace.items() if not k.startswith("__")})
        saved_module = sys.modules.get(name)
        sys.modules[name] = held
        try:
            from .monitoring import find_leaks

            report = find_leaks(include_live=True)
        except ImportError as error:
            console.print(f"leak report skipped: {error}", markup=False)
        else:
            console.print(str(report), markup=False)
            failed = failed or bool(report)
        finally:
            if saved_module is None:
                del sys.modules[name]
            else:
                sys.modules[name] = saved_module
        if failed:
            raise typer.Exit(1)

    @app.command()
    def version() -> None:
        """Print the versions and run the compatibility self-check."""
        import lifecycle as lc

        console = _console(Console)
        report = lc.check_compatibility()
        console.print(
            f"keras-lifecycle {lc.__version__}, TensorFlow {report.tensorflow}, "
            f"Keras {report.keras}"
        )
        for check in report.checks:
            console.print(f"  ok  {check}", markup=False)

    return app


def main() -> None:
    """Entry point of the ``lifecycle`` command."""
    try:
        app = build_app()
    except MissingExtraError as error:
        print(error, file=sys.stderr)
        raise SystemExit(2) from None
    app()
