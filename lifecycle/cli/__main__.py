"""``python -m lifecycle.cli``: the ``lifecycle`` command."""

from ._app import main

main()
