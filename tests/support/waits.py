"""Waiting on observable progress, with a deadline and a message naming what was awaited.

Tests never ``sleep`` and then assert: they wait until the thing they expect
can be seen, and fail after ``timeout`` naming it. A check that something does
*not* happen keeps a bounded sleep only after proving that what would make it
happen is live (see :func:`wait_for_scans`).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import lifecycle as lc


def wait_until(
    predicate: Callable[[], object],
    what: str,
    *,
    timeout: float = 60,
    poll: float | None = None,
) -> None:
    """Poll ``predicate()`` until it is true; fail after ``timeout`` seconds naming ``what``.

    Polls every ``poll`` seconds; by default often at first (5 ms), backing off
    to 100 ms, so a quick condition is seen at once and a slow one (an HTTP
    round trip) is not hammered. An error raised by ``predicate`` fails the
    test at once.
    """
    deadline = time.monotonic() + timeout
    interval = poll or 0.005
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(interval)
        if poll is None:
            interval = min(interval * 1.5, 0.1)


def joined(*threads: threading.Thread, timeout: float = 60) -> None:
    """Join ``threads`` within ``timeout`` seconds in all; fail naming those still running."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    running = [thread.name for thread in threads if thread.is_alive()]
    if running:
        pytest.fail(f"still running after {timeout} s: {running}")


def collect_until(predicate: Callable[[], object], what: str, *, timeout: float = 60) -> None:
    """``gc.collect()`` until ``predicate()`` holds (see :func:`wait_until`).

    A ``gc.collect()`` returns at once while another thread (a cleaner) is
    collecting, so one call does not guarantee that a dropped object was found.
    """
    wait_until(lambda: (gc.collect(), predicate())[1], what, timeout=timeout)


def wait_for_scans(
    registry: lc.ModelRegistry, name: str, count: int = 3, *, timeout: float = 60
) -> None:
    """Wait until ``count`` more scans of ``name``'s base path have run.

    Proof that polling is live before asserting that it changed nothing: each
    scan leaves a new report (``registry.last_scan``), so seeing the report
    replaced ``count`` times means at least that many polls ran.
    """
    seen = [registry.last_scan(name)]

    def scanned() -> bool:
        latest = registry.last_scan(name)
        if latest is not seen[-1]:
            seen.append(latest)
        return len(seen) > count

    wait_until(scanned, f"{count} scans of {name!r}", timeout=timeout)
