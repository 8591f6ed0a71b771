"""``lifecycle inspect``: run a Python file or module, then report statistics and leaks."""

# No `from __future__ import annotations`: typer reads the command's annotations
# at run time.
import importlib.util
import os
import runpy
import sys
import traceback
import types
from typing import Any

import typer

from ._console import console
from ._quiet import import_library

# Arguments after TARGET, options included, are the target's own.
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}
MiB = 2**20


def inspect(
    ctx: typer.Context,
    target: str = typer.Argument(
        ..., metavar="TARGET", help="A Python file, or a module with --module."
    ),
    module: bool = typer.Option(False, "--module", "-m", help="TARGET is a module name."),
) -> None:
    """Run a Python file or module, then print statistics and leak reports.

    Arguments after TARGET are passed to it as sys.argv.
    """
    problem = module_problem(target) if module else file_problem(target)
    if problem is not None:
        raise typer.BadParameter(problem)
    out = console()
    lc = import_library()
    saved_argv = sys.argv
    sys.argv = [target, *ctx.args]
    failed = False
    namespace: dict[str, Any] = {}
    try:
        if module:
            namespace = runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            namespace = runpy.run_path(target, run_name="__main__")
    except SystemExit as exit_:
        failed = exit_.code not in (None, 0)
    except Exception:
        failed = True
        out.print(traceback.format_exc(), markup=False, soft_wrap=True)
    finally:
        sys.argv = saved_argv
    from rich.table import Table  # here: `lifecycle --help` does not need it

    table = Table(title=f"keras-lifecycle statistics after {target}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for name, value in statistics_rows(lc):
        table.add_row(name, value)
    out.print(table)
    # The target's globals outlive its run as a module named after it, so
    # that what they hold is reported as held by that module.
    name = target if module else os.path.splitext(os.path.basename(target))[0]
    held = types.ModuleType(name)
    held.__dict__.update({k: v for k, v in namespace.items() if not k.startswith("__")})
    saved_module = sys.modules.get(name)
    sys.modules[name] = held
    try:
        report = lc.find_leaks(include_live=True)
    except ImportError as error:
        out.print(f"leak report skipped: {error}", markup=False)
    else:
        # One line per reference chain, however long: logs are searched line by line.
        out.print(str(report), markup=False, soft_wrap=True)
        failed = failed or bool(report)
    finally:
        if saved_module is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved_module
    if failed:
        raise typer.Exit(1)


def file_problem(path: str) -> str | None:
    """Why ``python path`` could not start, or ``None``."""
    return None if os.path.isfile(path) else f"no such file: {path}"


def module_problem(name: str) -> str | None:
    """Why ``python -m name`` could not start, or ``None``.

    Finding a submodule imports its parent packages, as running it would.
    """
    try:
        spec = importlib.util.find_spec(name)
        if spec is None:
            return f"no such module: {name}"
        package = spec.submodule_search_locations is not None
        if package and importlib.util.find_spec(f"{name}.__main__") is None:
            return f"{name} is a package with no __main__; name one of its modules"
    except (ImportError, ValueError):  # a parent package is missing, or the name is malformed
        return f"no such module: {name}"
    return None


def statistics_rows(lc: types.ModuleType) -> list[tuple[str, str]]:
    """``lc.statistics()`` as (name, value) rows for a table.

    Args:
        lc: The ``lifecycle`` package.

    Returns:
        One (name, value) row per statistic, and one per device.
    """
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
        ("longest collection", f"{stats.max_collection_seconds * 1000:.0f} ms"),
        ("other threads blocked", f"{stats.blocking_seconds * 1000:.0f} ms"),
        ("heap trims (time)", f"{stats.trims} ({stats.trim_seconds * 1000:.0f} ms)"),
        ("kernel-cache clears", f"{stats.kernel_cache_clears}"),
        ("cleaner queue", f"{stats.cleaner_queue}"),
        ("process RSS", "-" if stats.rss_bytes is None else f"{stats.rss_bytes / MiB:.1f} MiB"),
        ("CPU allocator", stats.cpu_allocator),
        (
            "freed, kept by oneDNN's pool",
            "-" if stats.cpu_pooled_bytes is None else f"{stats.cpu_pooled_bytes / MiB:.1f} MiB",
        ),
    ]
    rows += [
        (f"device {d.device}", f"{d.current_bytes / MiB:.1f} MiB (peak {d.peak_bytes / MiB:.1f})")
        for d in stats.device_memory
    ]
    return rows
