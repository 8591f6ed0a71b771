"""The soak's chart: process RSS per cycle, one line per variant (the ``plot`` extra)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._console import MissingExtraError

PLOT_INSTALL = 'pip install "keras-lifecycle[plot]"'


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend.

    Raises:
        MissingExtraError: matplotlib is not installed; the message names the
            ``pip install``.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise MissingExtraError(f"--plot needs matplotlib: {PLOT_INSTALL}") from error
    return plt


def path_problem(path: str) -> str | None:
    """Why a chart could not be written at ``path``, checked before the soak runs.

    Args:
        path: The ``--plot`` argument.

    Returns:
        A one-line reason, or ``None`` if the file can be written.
    """
    target = Path(path)
    if target.is_dir():
        return f"{path} is a directory, not a file"
    directory = target.parent
    if not directory.is_dir():
        return f"no such directory: {directory}"
    if not os.access(directory, os.W_OK):
        return f"cannot write to directory: {directory}"
    return None


def plot_soak(results: dict[str, dict[str, Any]], labels: dict[str, str], path: str) -> None:
    """Write a PNG line chart of RSS per cycle per variant.

    Args:
        results: Per variant, ``rss``: MiB after each cycle.
        labels: Legend label per variant.
        path: Where to write the PNG.
    """
    plt = require_matplotlib()
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
