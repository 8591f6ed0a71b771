"""keras-lifecycle's pytest plugin: the ``no_leaks`` fixture and marker.

Registered through the ``pytest11`` entry point. Loading it imports neither
TensorFlow nor the library's parts that use it (``import lifecycle`` loads its
names on first use); a test that asks for the check imports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["no_leaks", "pytest_configure", "pytest_runtest_call"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``no_leaks`` marker."""
    config.addinivalue_line(
        "markers",
        "no_leaks: fail the test if it leaves a managed model live or a disposed model "
        "reachable from a module (keras-lifecycle)",
    )


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves a managed model live or a disposed one reachable."""
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Run the leak check around the body of tests that use ``no_leaks``."""
    wanted = "no_leaks" in getattr(item, "fixturenames", ()) or (
        item.get_closest_marker("no_leaks") is not None
    )
    if not wanted:
        return (yield)
    from .testing import LeakCheck

    check = LeakCheck().start()
    try:
        result = yield
    except BaseException:
        check.dispose_live()  # the test failed anyway; do not spread its models
        raise
    check.check()
    return result
