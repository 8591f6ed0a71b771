"""Leak assertions for test suites, and a pytest plugin.

A check fails when a managed model created by the checked code is still live
(never disposed), or a disposed one is still reachable from a module; the
failure message is the leak report::

    with lifecycle.testing.no_leaks():
        run_my_training_loop()

In pytest, installing keras-lifecycle adds a ``no_leaks`` fixture and a
``@pytest.mark.no_leaks`` marker that run the same check around a test's body
(the plugin module is ``lifecycle.pytest_plugin``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["LeakCheck", "assert_no_leaks", "no_leaks"]


class LeakCheck:
    """Leaks that appear between :meth:`start` and :meth:`check`.

    Counts managed models created in between and still live, and disposed
    models (with their variables and graphs) reachable from a module that were
    not reachable already at :meth:`start`.
    """

    def __init__(self) -> None:
        self._before: set[int] = set()
        self._leaked_before: set[str] = set()

    def start(self) -> LeakCheck:
        """Remember what exists now; it is not blamed on the checked code."""
        from . import _model_index

        # Imported now: importing it while checking allocates enough to start a
        # collection, which would free (and hide) a model left live but unreachable.
        from .monitoring import _leaks  # noqa: F401

        self._before = {id(model) for model in _model_index.managed_models()}
        return self

    def report(self) -> Any:
        """The :class:`~lifecycle.monitoring.LeakReport` of what leaked since :meth:`start`."""
        from . import _model_index
        from .monitoring._leaks import leaks_among

        return leaks_among(m for m in _model_index.managed_models() if id(m) not in self._before)

    def check(self, *, dispose_live: bool = True) -> None:
        """Raise ``AssertionError`` with the report if anything leaked.

        Args:
            dispose_live: Dispose the models left live after reporting them.
        """
        report = self.report()
        if dispose_live:
            self.dispose_live()
        if report:
            raise AssertionError(f"keras-lifecycle found leaks:\n{report}")

    def dispose_live(self) -> int:
        """Dispose the models created since :meth:`start` and still live; how many."""
        from . import _model_index
        from .monitoring._leaks import live_models

        created = [m for m in _model_index.managed_models() if id(m) not in self._before]
        left = live_models(created)
        for model in left:
            model.dispose(timeout=5)
        return len(left)


def assert_no_leaks() -> None:
    """Fail if any managed model is live or any disposed model is reachable from a module.

    Process-wide: every model managed so far counts. Use :func:`no_leaks` to
    check only what a block of code created.

    Raises:
        AssertionError: With the leak report.
        ImportError: objgraph (extra ``leaks``) is not installed.
    """
    from .monitoring import find_leaks

    report = find_leaks(include_live=True)
    leaks = tuple(leak for leak in report.leaks if leak.kind == "live" or leak.chain)
    if leaks:
        raise AssertionError(f"keras-lifecycle found leaks:\n{type(report)(leaks)}")


@contextlib.contextmanager
def no_leaks(*, dispose_live: bool = True) -> Iterator[LeakCheck]:
    """Fail if the block leaves a managed model live or a disposed one reachable.

    Args:
        dispose_live: Dispose the models the block left live, after reporting them.

    Raises:
        AssertionError: On leaving the block, with the leak report.

    Example:
        >>> with no_leaks():  # doctest: +SKIP
        ...     train_and_dispose()
    """
    check = LeakCheck().start()
    yield check
    check.check(dispose_live=dispose_live)
