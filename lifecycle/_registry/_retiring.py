"""Retiring versions: refuse new leases, let the leases in flight drain, then dispose.

A retired version is disposed by whoever sees it drained: the retiring call
when no lease holds it, otherwise the registry's cleaner once the last lease
returns (never on the request thread that returned it).

Versions retired to make room for a load that then fails come back
(:meth:`Retirement.bring_back`): made routable again if their disposal has not
begun, built again from their source otherwise, and the labels, route and
default that pointed at them are put back (:class:`Pins`). A scan's swap
(:class:`Swap`) keeps requests waiting from the retirement to the end of the
rollback, and says what it left serving.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable

import attrs

from ..errors import LoadError, UnknownModelError
from ._status import VersionState
from ._table import VersionTable
from ._versions import LoadedVersion

__all__ = ["Comeback", "Pins", "Retirement", "SetAside", "Swap", "pins_of"]


@attrs.frozen
class Pins:
    """What pointed at one model's versions: its labels, its route and its default.

    Taken before versions of the model retire to make room; put back if they
    come back.
    """

    name: str
    labels: tuple[tuple[str, int], ...] = ()
    # (label or version, weight) pairs; None without a route.
    route: tuple[tuple[Hashable, float], ...] | None = None
    default: int | None = None

    @classmethod
    def of(cls, table: VersionTable, name: str) -> Pins:
        """The pins of ``name`` now (none for a model without versions)."""
        with table.cond:
            try:
                entry = table.entry(name)
            except UnknownModelError:
                return cls(name)
            route = tuple(entry.route) if entry.route is not None else None
            return cls(name, tuple(entry.labels.items()), route, entry.default)


@attrs.frozen
class SetAside:
    """Versions retired to make room for a load, and their models' pins before that."""

    versions: tuple[LoadedVersion, ...] = ()
    pins: tuple[Pins, ...] = ()


@attrs.frozen
class Comeback:
    """What :meth:`Retirement.bring_back` did.

    Attributes:
        back: ``(name, version)`` of the versions routable again.
        lost: ``(name, version, why)`` of the versions that could not come back.
        unrestored: Labels, routes and defaults that could not be put back, in words.
    """

    back: tuple[tuple[str, int], ...] = ()
    lost: tuple[tuple[str, int, str], ...] = ()
    unrestored: tuple[str, ...] = ()


class Retirement:
    """Retires and disposes the versions of one registry, and brings them back.

    Args:
        table: The registry's version table.
        defer: Runs a disposal off the request path (the registry's cleaner).
        drain_timeout: Seconds a waiting retirement waits for the drain.
        run: Runs a build as the registry's loads run (on its loader thread
            or the calling one), with the bytes it will hold if known.
    """

    def __init__(
        self,
        table: VersionTable,
        defer: Callable[[Callable[[], None]], None],
        drain_timeout: float | None,
        run: Callable[[Callable[[], LoadedVersion], int | None], LoadedVersion],
    ) -> None:
        self._table = table
        self._defer = defer
        self._drain_timeout = drain_timeout
        self._run = run

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

        A version brought back before its deferred disposal ran stays (its
        state is ``READY`` again). What only a collection frees becomes byte
        pressure on the registry's cleaner (the closed session's successor):
        a collection follows once enough has piled up (``pressure_threshold``),
        not with every unload.
        """
        with self._table.cond:
            if loaded.disposing or loaded.state is not VersionState.RETIRING:
                return
            loaded.disposing = True
        loaded.session.close()
        loaded.session.cleaner.note_garbage(loaded.collectable_bytes)
        self._table.remove(loaded)

    # -- rollback -------------------------------------------------------------------

    def take_back(self, loaded: LoadedVersion) -> bool:
        """Make a retiring version routable again; False once its disposal has begun."""
        with self._table.cond:
            return not loaded.disposing and self._table.reinstate(loaded)

    def bring_back(self, aside: SetAside) -> Comeback:
        """Bring back versions retired to make room, and put their models' pins back.

        Each version is made routable again if its disposal has not begun, or
        built again from its source (its factory, file or checkpoint) while
        requests for it wait. Labels and routes are put back where they are
        missing now; a default is put back if its version serves.
        """
        back: list[tuple[str, int]] = []
        lost: list[tuple[str, int, str]] = []
        for loaded in aside.versions:
            if not self.take_back(loaded):
                try:
                    self._rebuild(loaded)
                except Exception as error:  # any failure of the factory, file or warm-up
                    lost.append((loaded.name, loaded.version, f"{type(error).__name__}: {error}"))
                    continue
            back.append((loaded.name, loaded.version))
        unrestored: list[str] = []
        for pins in aside.pins:
            unrestored += self._restore(pins)
        return Comeback(tuple(back), tuple(lost), tuple(unrestored))

    def _rebuild(self, loaded: LoadedVersion) -> None:
        """Build a disposed version again from its source and make it routable."""
        if loaded.rebuild is None:
            raise LoadError(f"{loaded.name!r} version {loaded.version} has no source to build.")
        # Its disposal may still be running on the cleaner: let it finish first.
        self._table.wait_unloaded(loaded, self._drain_timeout)
        self._table.begin_load(loaded.name, loaded.version)  # requests wait, not fail
        try:
            self._table.add_ready(self._run(loaded.rebuild, loaded.nbytes), ())
        finally:
            self._table.end_load(loaded.name, loaded.version)

    def _restore(self, pins: Pins) -> list[str]:
        """Put back the labels, route and default in ``pins`` that are missing now.

        Returns:
            What could not be put back, in words.
        """
        with self._table.cond:
            try:
                entry = self._table.entry(pins.name)
                labels, route = dict(entry.labels), entry.route
            except UnknownModelError:
                labels, route = {}, None
        problems = []
        for label, version in pins.labels:
            if label in labels:
                continue  # still there, or pointed elsewhere meanwhile
            try:
                self._table.set_label(pins.name, label, version)
            except UnknownModelError:  # its version did not come back
                problems.append(f"label {label!r} of {pins.name!r} (version {version} is gone)")
        if pins.route is not None and route is None:
            try:
                self._table.route(pins.name, dict(pins.route))
            except (UnknownModelError, ValueError) as error:
                problems.append(f"the route of {pins.name!r} {dict(pins.route)} ({error})")
        if pins.default is not None:
            # Gone with a version that did not come back (named already), or unloaded meanwhile.
            with contextlib.suppress(UnknownModelError):
                self._table.promote(pins.name, pins.default)
        return problems


def pins_of(table: VersionTable, names: Iterable[str]) -> tuple[Pins, ...]:
    """The pins of each model in ``names``, once each."""
    return tuple(Pins.of(table, name) for name in dict.fromkeys(names))


class Swap:
    """A scan's swap: versions set aside to make room, brought back if the swap fails.

    From :meth:`begin` to :meth:`end` the versions being loaded count as
    loading, so requests for the model wait (up to the lease timeout) through
    the whole swap, the rollback included, instead of finding no model.

    Args:
        table: The registry's version table.
        retirement: The registry's retirement, which brings versions back.
        name: The model.
        wanted: The versions its policy wants: if one serves, the swap did
            not fail.
    """

    def __init__(
        self, table: VersionTable, retirement: Retirement, name: str, wanted: frozenset[int]
    ) -> None:
        self._table = table
        self._retirement = retirement
        self._name = name
        self._wanted = wanted
        self._marked: list[int] = []
        # The versions retired to make room, and what pointed at them.
        self.aside = SetAside()
        # What the rollback did; None until it ran.
        self.comeback: Comeback | None = None

    def begin(self, versions: Iterable[int]) -> None:
        """Mark ``versions`` as loading, before anything retires."""
        for version in versions:
            self._table.begin_load(self._name, version)
            self._marked.append(version)

    def rollback(self) -> None:
        """Bring the set-aside versions back unless a wanted version serves; once."""
        if self.comeback is not None or not self.aside.versions:
            return
        if self._wanted & set(self._table.ready(self._name)):
            return
        self.comeback = self._retirement.bring_back(self.aside)

    def end(self) -> None:
        """Requests stop waiting for the versions marked (those that loaded serve)."""
        for version in self._marked:
            self._table.end_load(self._name, version)

    def account(self, retired: Iterable[int]) -> str:
        """What the swap left serving, in words, for the warning of a failed load.

        Args:
            retired: The versions the scan retired for good.
        """
        name, words = self._name, []
        comeback = self.comeback
        if comeback is not None:
            what = "retired to make room"
            if comeback.back:
                back = sorted(version for _, version in comeback.back)
                words.append(f"versions {back} were {what} and are loaded back")
            if comeback.lost:
                lost = sorted(version for _, version, _ in comeback.lost)
                why = "; ".join(f"version {v}: {reason}" for _, v, reason in comeback.lost)
                words.append(
                    f"versions {lost} were {what} and could not be loaded back ({why}), so "
                    "they no longer serve"
                )
            if comeback.unrestored:
                words.append(f"not put back: {', '.join(comeback.unrestored)}")
        elif retired:
            words.append(f"versions {sorted(retired)} were retired (they left the version policy)")
        ready = self._table.ready(name)
        words.append(f"{name!r} serves versions {ready}" if ready else f"{name!r} serves nothing")
        return "; ".join(words)
