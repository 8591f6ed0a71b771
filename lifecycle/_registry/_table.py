"""The registry's table of versions: who may be leased, and where each request goes.

One condition guards every :class:`ModelEntry` and every version's state,
leases and counters; it also wakes requests waiting for a routable version
(during a swap gap, or while a model's first version loads). Loads, retirement
and disposal happen outside it; this module only keeps the books.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from .._core import Resident, check_key, check_version, check_weights, pick
from ..errors import ClosedError, UnavailableError, UnknownModelError
from ._status import VersionState, VersionStatus
from ._versions import LoadedVersion, ModelEntry

__all__ = ["VersionTable"]


class VersionTable:
    """Every loaded version of a registry, by model name, under one condition.

    Args:
        registry: The registry's name, for messages.
    """

    def __init__(self, registry: str) -> None:
        self.registry = registry
        # Guards everything below; its waiters are requests waiting for a
        # routable version and unloads waiting for a drain.
        self.cond = threading.Condition(threading.RLock())
        self._entries: dict[str, ModelEntry] = {}
        # (name, version) of loads in progress: requests for them wait, not fail.
        self._loading: set[tuple[str, int]] = set()
        # Leases held across all versions; read without the lock by the loader.
        self.in_flight = 0
        self.closed = False

    # -- lookups -----------------------------------------------------------------

    def check_open(self) -> None:
        """Raise :class:`ClosedError` once the registry is closed."""
        if self.closed:
            raise ClosedError(
                f"ModelRegistry {self.registry!r} is closed: its versions were unloaded. "
                "Create a new ModelRegistry to load and serve models."
            )

    def entry(self, name: str) -> ModelEntry:
        """The entry of ``name``, or :class:`UnknownModelError`."""
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownModelError(
                f"No model named {name!r} is loaded. Loaded: {sorted(self._entries)}"
            )
        return entry

    def ready_version(self, name: str, version: int) -> tuple[ModelEntry, LoadedVersion]:
        """The entry and ready version, or :class:`UnknownModelError`."""
        entry = self.entry(name)
        loaded = entry.versions.get(version)
        if loaded is None or loaded.state is not VersionState.READY:
            raise UnknownModelError(
                f"{name!r} has no ready version {version}. Ready: {entry.ready()}"
            )
        return entry, loaded

    def find(self, name: str, version: int) -> LoadedVersion | None:
        """The loaded (ready or retiring) ``version`` of ``name``, if any."""
        with self.cond:
            entry = self._entries.get(name)
            return entry.versions.get(version) if entry is not None else None

    def present(self, name: str) -> set[int]:
        """Versions of ``name`` loaded now (ready or retiring)."""
        with self.cond:
            entry = self._entries.get(name)
            return set(entry.versions) if entry is not None else set()

    def ready(self, name: str) -> list[int]:
        """Routable versions of ``name``, ascending."""
        with self.cond:
            entry = self._entries.get(name)
            return entry.ready() if entry is not None else []

    def default(self, name: str) -> int | None:
        """The default version of ``name``, if it has one."""
        with self.cond:
            entry = self._entries.get(name)
            return entry.default if entry is not None else None

    def versions(self) -> list[LoadedVersion]:
        """Every loaded version (ready or retiring)."""
        with self.cond:
            return [v for e in self._entries.values() for v in e.versions.values()]

    def residents(self) -> list[Resident]:
        """What the budget policy needs to know of every loaded version."""
        with self.cond:
            residents = []
            for name, entry in self._entries.items():
                pinned = entry.pinned()  # once per model, not once per version
                residents += [
                    Resident(
                        key=loaded,
                        model=name,
                        nbytes=loaded.nbytes,
                        last_used=loaded.last_used,
                        ready=loaded.state is VersionState.READY,
                        pinned=loaded.version in pinned,
                        default=loaded.version == entry.default,
                    )
                    for loaded in entry.versions.values()
                ]
            return residents

    # -- loads -------------------------------------------------------------------

    def begin_load(self, name: str, version: int) -> None:
        """Refuse a version already loaded; then requests for it wait while it loads.

        Raises:
            ValueError: ``version`` of ``name`` is already loaded.
        """
        with self.cond:
            entry = self._entries.get(name)
            if entry is not None and version in entry.versions:
                raise ValueError(
                    f"{name!r} version {version} is already loaded; unload it first or "
                    "load another version number."
                )
            self._loading.add((name, version))

    def end_load(self, name: str, version: int) -> None:
        """The load of ``version`` ended (ready or failed): wake its waiters."""
        with self.cond:
            self._loading.discard((name, version))
            self.cond.notify_all()

    def add_ready(self, loaded: LoadedVersion, labels: Iterable[str]) -> VersionStatus:
        """Make a built version routable; it becomes the default if there is none."""
        with self.cond:
            entry = self._entries.setdefault(loaded.name, ModelEntry())
            entry.versions[loaded.version] = loaded
            loaded.state = VersionState.READY
            if entry.default is None or entry.default not in entry.ready():
                entry.default = loaded.version
            for label in labels:
                entry.labels[label] = loaded.version
            self.cond.notify_all()
            return entry.status(loaded.name, loaded)

    # -- requests ----------------------------------------------------------------

    def acquire(
        self,
        name: str,
        version: int | None,
        label: str | None,
        key: Any,
        timeout: float | None,
    ) -> LoadedVersion:
        """Lease the version a request resolves to, waiting up to ``timeout`` for one.

        Raises:
            UnknownModelError: No such model, version or label.
            UnavailableError: No routable version appeared within ``timeout``.
        """
        if key is not None:
            check_key(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                loaded = self._resolve(name, version, label, key)
                if loaded is not None:
                    loaded.leases += 1
                    self.in_flight += 1
                    loaded.requests += 1
                    loaded.last_used = time.monotonic()
                    return loaded
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise UnavailableError(
                        f"No routable version of {name!r} appeared within "
                        f"{timeout} s (a swap may be in progress). Retry later."
                    )
                self.cond.wait(remaining)

    def _resolve(
        self, name: str, version: int | None, label: str | None, key: Any
    ) -> LoadedVersion | None:
        """The routable version for a request, None to wait, or raise if unknown.

        The order: an explicit ``version``, a ``label``, the route (sticky for
        a ``key``), the default.
        """
        self.check_open()
        entry = self._entries.get(name)
        if entry is None:
            if any(loading == name for loading, _ in self._loading):
                return None
            raise UnknownModelError(
                f"No model named {name!r} is loaded. Loaded: {sorted(self._entries)}"
            )
        if version is not None:
            target: Any = version
        elif label is not None:
            if label not in entry.labels:
                raise UnknownModelError(
                    f"{name!r} has no label {label!r}. Labels: {sorted(entry.labels)}"
                )
            target = entry.labels[label]
        elif entry.route is not None:
            target = entry.version_of(pick(entry.route, key))
        else:
            target = entry.default
        loaded = entry.versions.get(target) if target is not None else None
        if loaded is not None and loaded.state is VersionState.READY:
            return loaded
        if version is not None and (name, version) not in self._loading:
            # An explicit version is waited for only while it loads.
            raise UnknownModelError(
                f"{name!r} has no version {version} ready to serve. Ready: {entry.ready()}"
            )
        return None

    def peek(self, name: str, version: int | None, label: str | None) -> LoadedVersion:
        """The version a request would lease now, without leasing it (metadata reads).

        Raises:
            UnknownModelError: No such model, version or label.
            UnavailableError: Nothing routable yet (a load or swap in progress).
        """
        with self.cond:
            loaded = self._resolve(name, version, label, None)
            if loaded is None:
                raise UnavailableError(
                    f"No routable version of {name!r} yet (a load or swap is in progress). "
                    "Retry later."
                )
            return loaded

    def release(self, loaded: LoadedVersion) -> bool:
        """Return a lease; True when it was the last lease of a retiring version."""
        with self.cond:
            loaded.leases -= 1
            self.in_flight -= 1
            drained = loaded.state is VersionState.RETIRING and loaded.leases == 0
            if drained:
                self.cond.notify_all()
            return drained

    # -- defaults, labels, routes ---------------------------------------------------

    def promote(self, name: str, version: int) -> None:
        """Make a ready version the default of ``name``."""
        with self.cond:
            entry, _ = self.ready_version(name, version)
            entry.default = version
            self.cond.notify_all()

    def set_label(self, name: str, label: str, version: int) -> None:
        """Point ``label`` at a ready version."""
        with self.cond:
            entry, _ = self.ready_version(name, version)
            entry.labels[label] = version
            self.cond.notify_all()

    def remove_label(self, name: str, label: str) -> None:
        """Remove ``label`` from ``name``, unless the route sends traffic through it."""
        with self.cond:
            entry = self.entry(name)
            if label not in entry.labels:
                raise UnknownModelError(
                    f"{name!r} has no label {label!r}. Labels: {sorted(entry.labels)}"
                )
            if any(target == label for target, _ in entry.route or ()):
                raise ValueError(
                    f"{name!r} label {label!r} is a target of the route "
                    f"{dict(entry.route or ())}; change or remove the route first."
                )
            del entry.labels[label]

    def route(self, name: str, weights: Mapping[Hashable, float] | None) -> None:
        """Set (or with ``None`` remove) the weighted route of ``name``."""
        with self.cond:
            entry = self.entry(name)
            if weights is None:
                entry.route = None
                return
            pairs = check_weights(weights)
            for target, _ in pairs:
                if isinstance(target, str):
                    if target not in entry.labels:
                        raise UnknownModelError(
                            f"{name!r} has no label {target!r} to route to. Labels: "
                            f"{sorted(entry.labels)}"
                        )
                else:
                    self.ready_version(name, check_version(target))
            entry.route = pairs
            self.cond.notify_all()

    def unpin(self, loaded: LoadedVersion, successors: Iterable[int]) -> bool:
        """Drop the labels and route that point at a ready version, and its default.

        The default moves to the newest ready version among ``successors``.
        Returns False (and changes nothing) when ``loaded`` is no longer ready.
        """
        with self.cond:
            entry = self._entries.get(loaded.name)
            if entry is None or loaded.state is not VersionState.READY:
                return False
            version = loaded.version
            for label in [k for k, v in entry.labels.items() if v == version]:
                del entry.labels[label]
            if entry.route is not None and any(
                entry.version_of(target) == version for target, _ in entry.route
            ):
                entry.route = None
            if entry.default == version:
                wanted = set(successors)
                others = [v for v in entry.ready() if v in wanted]
                entry.default = others[-1] if others else None
            return True

    def promote_newest(self, name: str, wanted: Iterable[int]) -> None:
        """Make the newest ready version among ``wanted`` the default if it is newer."""
        with self.cond:
            entry = self._entries.get(name)
            if entry is None:
                return
            ready = [v for v in sorted(wanted) if v in entry.ready()]
            if ready and (entry.default is None or entry.default < ready[-1]):
                entry.default = ready[-1]
                self.cond.notify_all()

    def unpin_all(self) -> None:
        """Drop every label and route (a registry closing)."""
        with self.cond:
            for entry in self._entries.values():
                entry.labels.clear()
                entry.route = None

    # -- retirement ----------------------------------------------------------------

    def check_unloadable(self, name: str, version: int) -> LoadedVersion:
        """The version an unload by hand may retire, or a clear error.

        Raises:
            UnknownModelError: No such model or version.
            ValueError: The version is the default while others are ready, or a
                label or route points to it.
        """
        with self.cond:
            entry = self.entry(name)
            loaded = entry.versions.get(version)
            if loaded is None:
                raise UnknownModelError(
                    f"{name!r} has no version {version}. Loaded: {sorted(entry.versions)}"
                )
            pinned = [label for label, v in entry.labels.items() if v == version]
            routed = any(target == version for target, _ in entry.route or ())
            if pinned or routed:
                raise ValueError(
                    f"{name!r} version {version} is still pointed to by "
                    f"{'labels ' + str(pinned) if pinned else 'the route'}; point them "
                    "elsewhere before unloading it."
                )
            others = [v for v in entry.ready() if v != version]
            if version == entry.default and others:
                raise ValueError(
                    f"{name!r} version {version} is the default; promote another version "
                    f"({others}) before unloading it."
                )
            return loaded

    def mark_retiring(self, loaded: LoadedVersion) -> bool:
        """Refuse new leases of a ready version; True if no lease holds it now."""
        with self.cond:
            if loaded.state is not VersionState.READY:
                return False
            loaded.state = VersionState.RETIRING
            entry = self._entries[loaded.name]
            if entry.default == loaded.version:
                entry.default = None
            return loaded.leases == 0

    def reinstate(self, loaded: LoadedVersion) -> bool:
        """Make a retiring version routable again; False if it was already disposed."""
        with self.cond:
            if loaded.state is not VersionState.RETIRING:
                return False
            loaded.state = VersionState.READY
            entry = self._entries[loaded.name]
            if entry.default is None:
                entry.default = loaded.version
            self.cond.notify_all()
            return True

    def remove(self, loaded: LoadedVersion) -> None:
        """Forget a disposed version; wake anyone waiting for its drain."""
        with self.cond:
            loaded.state = VersionState.UNLOADED
            entry = self._entries.get(loaded.name)
            if entry is not None and entry.versions.get(loaded.version) is loaded:
                del entry.versions[loaded.version]
                if not entry.versions:
                    del self._entries[loaded.name]
            loaded.model = loaded.serve = None
            self.cond.notify_all()

    def wait_unloaded(self, loaded: LoadedVersion, timeout: float | None) -> None:
        """Wait (up to ``timeout``) until ``loaded`` is disposed."""
        with self.cond:
            self.cond.wait_for(lambda: loaded.state is VersionState.UNLOADED, timeout)

    def close(self) -> None:
        """Refuse every request from now on; wake the waiting ones to fail."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    # -- status --------------------------------------------------------------------

    def status(self, name: str | None = None) -> tuple[VersionStatus, ...]:
        """Frozen status of every loaded or loading version (of ``name``).

        Raises:
            UnknownModelError: ``name`` is given and nothing of it is loaded or loading.
        """
        with self.cond:
            if name is not None and not any(n == name for n, _ in self._loading):
                self.entry(name)  # raises for an unknown name
            loaded = [
                entry.status(n, v)
                for n, entry in self._entries.items()
                if name in (None, n)
                for v in entry.versions.values()
            ]
            loading = [
                VersionStatus(
                    name=n,
                    version=v,
                    state=VersionState.LOADING,
                    default=False,
                    labels=(),
                    weight=None,
                    leases=0,
                    bytes=0,
                    load_seconds=0.0,
                    requests=0,
                )
                for n, v in self._loading
                if name is None or n == name
            ]
            return tuple(sorted(loaded + loading, key=lambda s: (s.name, s.version)))
