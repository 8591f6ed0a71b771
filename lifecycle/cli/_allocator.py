"""``--allocator``: the CPU allocator of the commands that own their process.

``lifecycle serve``, ``lifecycle soak`` and ``make demo`` run TensorFlow in a
process of their own, so they choose its CPU allocator: by default the one
that gives freed memory back to the system at the smallest measured cost
(``system``; see docs/allocator.md). The choice is passed on as
``LIFECYCLE_ALLOCATOR``, which ``import lifecycle`` applies before TensorFlow
starts, in this process and in the children it runs.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from types import ModuleType

import typer

from ._standalone import PACKAGE, standalone

DEFAULT_ALLOCATOR = "system"


def allocator_module() -> ModuleType:
    """``lifecycle._core._allocator``, without importing TensorFlow."""
    return standalone("lifecycle._core._allocator", PACKAGE / "_core" / "_allocator.py")


def allocator_option() -> typer.models.OptionInfo:
    """The ``--allocator`` option (``None`` when not given)."""
    return typer.Option(
        None,
        "--allocator",
        help="TensorFlow's CPU allocator: system (memory freed by disposed models goes back "
        "to the system; the default), tensorflow (TensorFlow's defaults: oneDNN's pool keeps "
        "it where oneDNN is on) or no-onednn (oneDNN off). Default: LIFECYCLE_ALLOCATOR if "
        "set, else system.",
        show_default=False,
    )


def choose_allocator(flag: str | None, environ: MutableMapping[str, str] | None = None) -> str:
    """Set ``LIFECYCLE_ALLOCATOR``: the flag if given, else the user's variable, else the default.

    Args:
        flag: The ``--allocator`` value, or ``None``.
        environ: The environment to update; ``os.environ`` by default.

    Returns:
        The choice.

    Raises:
        typer.BadParameter: The flag, or the variable, names no known choice.
    """
    environ = os.environ if environ is None else environ
    module = allocator_module()
    variable = module.ENVIRONMENT_VARIABLE
    chosen = flag if flag is not None else environ.get(variable, "").strip() or DEFAULT_ALLOCATOR
    try:
        module.check_allocator(chosen)
    except ValueError as error:
        hint = "'--allocator'" if flag is not None else variable
        raise typer.BadParameter(str(error), param_hint=hint) from None
    environ[variable] = chosen
    return chosen
