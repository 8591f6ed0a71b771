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
import sys
from collections.abc import MutableMapping

import typer

from .._core import _allocator
from .._core._flag import Flag

DEFAULT_ALLOCATOR = "system"

#: The flag, declared once for both commands (and docs/serving.md's table of flags).
ALLOCATOR = Flag(
    "allocator",
    str,
    None,
    "TensorFlow's CPU allocator: `system` (oneDNN's kernels, every block from malloc: an "
    "unloaded version's memory goes back to the system), `tensorflow` (TensorFlow's "
    "defaults: oneDNN's pool keeps it for reuse) or `no-onednn` "
    "([the CPU allocator](allocator.md))",
    shown_default=f"`{DEFAULT_ALLOCATOR}` (or `{_allocator.ENVIRONMENT_VARIABLE}`)",
)


def allocator_option() -> typer.models.OptionInfo:
    """The ``--allocator`` option (``None`` when not given)."""
    return typer.Option(
        None, ALLOCATOR.flag, help=ALLOCATOR.plain_help, show_default=ALLOCATOR.plain_default
    )


def choose_allocator(flag: str | None, environ: MutableMapping[str, str] | None = None) -> str:
    """Choose the allocator: the flag if given, else the user's variable, else the default.

    Sets ``LIFECYCLE_ALLOCATOR`` for the children the command runs and, for
    ``os.environ``, applies the choice in this process (TensorFlow is not
    imported yet).

    Args:
        flag: The ``--allocator`` value, or ``None``.
        environ: The environment to update; ``os.environ`` by default.

    Returns:
        The choice.

    Raises:
        typer.BadParameter: The flag, or the variable, names no known choice.
    """
    environ = os.environ if environ is None else environ
    variable = _allocator.ENVIRONMENT_VARIABLE
    chosen = flag if flag is not None else environ.get(variable, "").strip() or DEFAULT_ALLOCATOR
    try:
        _allocator.check_allocator(chosen)
    except ValueError as error:
        hint = f"'{ALLOCATOR.flag}'" if flag is not None else variable
        raise typer.BadParameter(str(error), param_hint=hint) from None
    environ[variable] = chosen
    if environ is os.environ and "tensorflow" not in sys.modules:
        # `import lifecycle` ran before the flag was read: apply the choice now,
        # unless the variable already made it. (A command run in a process that
        # already runs TensorFlow, as in tests, changes only what its children get.)
        current = _allocator.current_choice()
        if current is None or current.name != chosen:
            _allocator.use_allocator(chosen)
    return chosen
