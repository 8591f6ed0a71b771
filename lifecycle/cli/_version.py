"""``lifecycle version``: the installed versions, and on request the self-check.

The versions come from the installed distributions' metadata, so that the
command answers at once: importing TensorFlow to ask it takes seconds. Only
``--check`` imports it.
"""

# No `from __future__ import annotations`: typer reads the command's annotations
# at run time.
from collections.abc import Iterator

import typer

from ._console import console
from ._quiet import import_library

# Distributions that install each package, most common first; any other is
# found through the package's import name.
_DISTRIBUTIONS = {
    "lifecycle": ("keras-lifecycle",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tf-nightly"),
    "keras": ("keras", "keras-nightly"),
}


def version(
    check: bool = typer.Option(
        False, "--check", help="Also run the compatibility self-check (imports TensorFlow)."
    ),
) -> None:
    """Print the versions of keras-lifecycle, TensorFlow and Keras.

    With --check, also exercise every TensorFlow and Keras internal that
    keras-lifecycle relies on; the exit code is 1 if one has moved.
    """
    out = console()
    out.print(
        f"keras-lifecycle {installed('lifecycle')}, TensorFlow {installed('tensorflow')}, "
        f"Keras {installed('keras')}"
    )
    if not check:
        return
    lc = import_library()
    try:
        report = lc.introspection.check_compatibility()
    except lc.CompatibilityError as error:
        out.print(f"self-check failed: {error}", markup=False)
        raise typer.Exit(1) from None
    for name in report.checks:
        out.print(f"  ok  {name}", markup=False)


def installed(package: str) -> str:
    """The installed version of the distribution that provides ``package``.

    Args:
        package: An import name: ``lifecycle``, ``tensorflow`` or ``keras``.

    Returns:
        Its version, or ``"not installed"``.
    """
    from importlib import metadata  # here: `lifecycle --help` does not need it

    for name in _distributions(package):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _distributions(package: str) -> Iterator[str]:
    from importlib import metadata

    yield from _DISTRIBUTIONS.get(package, ())
    # Any other (a fork, a build of one's own): slower, as it reads every distribution's files.
    yield from metadata.packages_distributions().get(package, ())
