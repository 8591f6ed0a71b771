"""The class of every ``lifecycle`` command: usage lines that name arguments plainly."""

from typing import Any

import typer.core


class Command(typer.core.TyperCommand):
    """A typer command whose usage line reads ``[OPTIONS] TARGET [ARGS]...``.

    Recent typer versions write a required argument as ``{target}`` there; this
    writes it the way the help text refers to it: its metavar, else its name in
    capitals (``[TARGET]`` when optional). A command that passes the arguments
    after its own on (``allow_extra_args``) ends its usage with ``[ARGS]...``.
    """

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The words of the usage line after the command's name."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                continue
            name = param.metavar or (param.name or "").upper()
            if param.nargs != 1:
                name += "..."
            pieces.append(name if param.required else f"[{name}]")
        if ctx.allow_extra_args:
            pieces.append("[ARGS]...")
        return pieces
