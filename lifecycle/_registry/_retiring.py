"""Retiring versions: refuse new leases, let the leases in flight drain, then dispose.

A retired version is disposed by whoever sees it drained: the retiring call
when no lease holds it, otherwise the registry's cleaner once the last lease
returns (never on the request thread that returned it).
"""

from __future__ import annotations

from collections.abc import Callable

from ._table import VersionTable
from ._versions import LoadedVersion

__all__ = ["Retirement"]


class Retirement:
    """Retires and disposes the versions of one registry.

    Args:
        table: The registry's version table.
        defer: Runs a disposal off the request path (the registry's cleaner).
        drain_timeout: Seconds a waiting retirement waits for the drain.
    """

    def __init__(
        self,
        table: VersionTable,
        defer: Callable[[Callable[[], None]], None],
        drain_timeout: float | None,
    ) -> None:
        self._table = table
        self._defer = defer
        self._drain_timeout = drain_timeout

    def retire(self, loaded: LoadedVersion, *, wait: bool) -> None:
        """Refuse new leases of ``loaded``; dispose it now if it is drained.

        Args:
            loaded: A ready (or already retiring) version.
            wait: Block until it is disposed, up to the drain timeout; also
                when an earlier call already retired it.
        """
        if self._table.mark_retiring(loaded):
            self.dispose(loaded)
        elif wait:
            self._table.wait_unloaded(loaded, self._drain_timeout)

    def lease_returned(self, loaded: LoadedVersion) -> None:
        """A lease of ``loaded`` came back; dispose it later if that was its last."""
        if self._table.release(loaded):
            self._defer(lambda: self.dispose(loaded))

    def dispose(self, loaded: LoadedVersion) -> None:
        """Close the version's session (disposing its model), then forget it.

        What only a collection frees becomes byte pressure on the registry's
        cleaner (the closed session's successor): a collection follows once
        enough has piled up (``pressure_threshold``), not with every unload.
        """
        loaded.session.close()
        loaded.session.cleaner.note_garbage(loaded.collectable_bytes)
        self._table.remove(loaded)
