"""Watching base paths: scans that bring a model's versions in line with its directories.

Each watched model name has a :class:`Watch`: its base path, the factory that
builds its architecture (for versions of checkpoints; SavedModels and ``.keras``
archives need none), the version policy, and the versions this watch
loaded. A scan loads the versions the policy wants and lacks, makes the newest
the default, and retires the versions it loaded that left the policy. With a
poll interval, a thread of the watch's own scans repeatedly (TensorFlow
Serving's file-system polling).

Two things a scan leaves alone: a version unloaded by hand (it is *held* until
loaded by hand again), and a version whose load failed, until its directory
changes (or, refused for lack of room, until the registry's loaded versions
change), so that polling does not load a broken version at every interval.

A failed swap leaves the model serving what it served, under either swap
policy. ``AVAILABILITY_PRESERVING`` retires nothing until a wanted version
serves; ``RESOURCE_PRESERVING`` retires the versions that left the policy
before it loads, and brings them back (with their labels, route and default)
when no wanted version serves after the loads.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import attrs
import keras

from .._core._batcher import BatchingPolicy
from .._core._policies import SwapPolicy, VersionPolicy
from ..errors import (
    BudgetExceededError,
    CheckpointError,
    LifecycleError,
    LoadError,
    UnknownModelError,
)
from ._retiring import Pins, Retirement, SetAside, Swap
from ._status import VersionState
from ._table import VersionTable
from ._version_dirs import available_versions, version_source
from ._versions import LoadedVersion

__all__ = [
    "WATCHFILES_INSTALL",
    "Failure",
    "ScanReport",
    "Watch",
    "Watcher",
    "fingerprint",
    "notify_changes",
    "require_notifications",
]

_log = logging.getLogger("lifecycle.registry")


def fingerprint(directory: str) -> tuple[int, int, int]:
    """``(files, bytes, newest mtime in ns)`` under ``directory``: changes when a file does."""
    files = size = newest = 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:  # removed meanwhile: the next scan sees the change
                continue
            files += 1
            size += stat.st_size
            newest = max(newest, stat.st_mtime_ns)
    return files, size, newest


@attrs.frozen
class ScanReport:
    """What one scan of a watched base path did.

    Attributes:
        name: The model's name.
        available: Versions with a complete version directory, ascending.
        wanted: Versions the policy serves, ascending.
        loaded: Versions loaded by this scan.
        retired: Versions retired by this scan (they drain, then go).
        failed: ``(version, error message)`` for versions that did not load,
            by this scan or an earlier one: a version that failed is tried
            again once a file in its directory changes (or the model is
            watched anew), not at every scan; one refused for lack of room,
            also once the registry's loaded versions change.
        default: The model's default version after the scan.
        held: Versions the policy wants that were unloaded by hand: no scan
            loads them until they are loaded by hand again.
        restored: Versions retired to make room for versions that then failed
            to load (``RESOURCE_PRESERVING``), and loaded back: they serve on,
            with their labels, route and default.
    """

    name: str
    available: tuple[int, ...]
    wanted: tuple[int, ...]
    loaded: tuple[int, ...]
    retired: tuple[int, ...]
    failed: tuple[tuple[int, str], ...]
    default: int | None
    held: tuple[int, ...] = ()
    restored: tuple[int, ...] = ()


@attrs.frozen
class Failure:
    """A load of a watched version that failed, not tried again while nothing changes."""

    # The version directory's fingerprint then.
    seen: tuple[int, int, int]
    # "type: message" of the error.
    message: str
    # For a lack of room: the registry's loaded (name, version) pairs then.
    room: frozenset[tuple[str, int]] | None = None

    def stands(self, seen: tuple[int, int, int], room: frozenset[tuple[str, int]]) -> bool:
        """Whether nothing that could change the outcome changed since."""
        return self.seen == seen and self.room in (None, room)


@attrs.define(eq=False)
class Polling:
    """The threads that keep one watched directory scanned: every interval, and on changes.

    The polling thread scans every ``interval`` seconds (``None``: only when
    woken); with ``notify``, a second thread wakes it at each change the
    operating system reports (:func:`notify_changes`). A failed scan is
    logged once per message, not at every interval, and polling goes on:
    the next scan may succeed. One for each watch and each watched repository.
    """

    stop: threading.Event = attrs.field(factory=threading.Event)
    # Set by a change the operating system reported, or by `halt`: scan (or stop) now.
    wake: threading.Event = attrs.field(factory=threading.Event)
    threads: tuple[threading.Thread, ...] = ()
    # The last failed scan's message (each scan that succeeds clears it).
    last_error: str | None = None

    def start(
        self,
        scan: Callable[[], object],
        interval: float | None,
        *,
        what: str,
        name: str,
        notify: str | None,
        notifier_name: str,
        recursive: bool,
        ended: Callable[[Exception], bool] = lambda error: False,
    ) -> None:
        """Start the polling thread, and with ``notify`` the notifying one.

        Args:
            scan: One scan.
            interval: Seconds between scans; ``None``: only when woken.
            what: What is polled, for the log (``"'risk' under '/models/risk'"``).
            name: The polling thread's name.
            notify: The directory whose changes wake the polling thread;
                ``None``: poll only.
            notifier_name: The notifying thread's name.
            recursive: Watch ``notify``'s whole tree.
            ended: Whether a scan's error means the watch ended meanwhile
                (unwatched, or the registry closed): the thread then ends.
        """
        poll = functools.partial(self._poll, scan, interval, what, ended)
        threads = [threading.Thread(target=poll, name=name, daemon=True)]
        if notify is not None:
            threads.append(
                threading.Thread(
                    target=notify_changes,
                    args=(what, notify, self.stop, self.wake),
                    kwargs={"recursive": recursive},
                    name=notifier_name,
                    daemon=True,
                )
            )
        self.threads = tuple(threads)
        for thread in threads:
            thread.start()

    def halt(self) -> None:
        """Stop the polling and notifying threads, if any, and wait for a scan in progress."""
        self.stop.set()
        self.wake.set()
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join()

    def _poll(
        self,
        scan: Callable[[], object],
        interval: float | None,
        what: str,
        ended: Callable[[Exception], bool],
    ) -> None:
        while True:
            self.wake.wait(interval)  # None: only when woken
            self.wake.clear()  # changes from now on wake the next round
            if self.stop.is_set():
                return
            try:
                scan()
            except Exception as error:  # keep polling: the next scan may succeed
                if self.stop.is_set() or ended(error):
                    return  # unwatched or closed meanwhile
                message = f"{type(error).__name__}: {error}"
                if message != self.last_error:  # once, not at every interval
                    _log.warning("Polling %s failed: %s", what, message)
                self.last_error = message


@attrs.define(eq=False)
class Watch:
    """A watched base path of one model name."""

    base: str
    # None: the versions must be SavedModels or .keras archives.
    factory: Callable[[], keras.Model] | None
    policy: VersionPolicy
    warmup: Any
    strict: bool
    poll_interval: float | None = None
    batching: BatchingPolicy | None = None
    # Scan as soon as the base path's entries change (see `ModelRegistry.watch`).
    notify: bool = False
    # Versions this watch loaded and still serves.
    served: set[int] = attrs.field(factory=set)
    # Versions unloaded by hand: scans leave them alone until loaded by hand.
    held: set[int] = attrs.field(factory=set)
    # version -> its failed load: not tried again while the directory (and,
    # for a lack of room, the registry's loaded versions) stay the same.
    failures: dict[int, Failure] = attrs.field(factory=dict)
    last: ScanReport | None = None
    polling: Polling = attrs.field(factory=Polling)


WATCHFILES_INSTALL = 'pip install "keras-lifecycle[serve]"'


def require_notifications() -> None:
    """Check that change notifications can be had (``watchfiles``).

    Raises:
        ImportError: ``watchfiles`` is missing; the message names the ``pip install``.
    """
    try:
        import watchfiles  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"`notify=True` needs watchfiles, which the serve extra installs: "
            f"{WATCHFILES_INSTALL} (or pip install watchfiles)."
        ) from error


def notify_changes(
    what: str, path: str, stop: threading.Event, wake: threading.Event, *, recursive: bool
) -> None:
    """Set ``wake`` whenever an entry under ``path`` changes, until ``stop`` is set.

    A base path's own entries are watched (``recursive=False``): a version
    written in place or aside and renamed in is one event when it appears, not
    one per file written. A repository is watched ``recursive``: a version
    appearing in one of its models is two levels down. If the operating
    system's notifications fail (the path removed, a file system without
    them), polling goes on alone.

    Args:
        what: What is watched, for the warning (``"'risk' under '/models/risk'"``).
        path: The directory.
        stop: Ends the notifications.
        wake: Set at each change.
        recursive: Watch the whole tree, not only ``path``'s own entries.
    """
    import watchfiles

    try:
        for _ in watchfiles.watch(
            path,
            watch_filter=None,
            recursive=recursive,
            # Changes a few milliseconds apart (a rename's two events) make one wake.
            step=20,
            stop_event=stop,
            raise_interrupt=False,
        ):
            wake.set()
    except Exception as error:  # the path vanished, say: polling still runs
        if not stop.is_set():
            _log.warning(
                "Change notifications for %s stopped (%s: %s); polling goes on.",
                what,
                type(error).__name__,
                error,
            )


class Watcher:
    """The watched base paths of one registry, and their scans.

    The caller holds the registry's admin lock around :meth:`add`,
    :meth:`remove` and :meth:`scan`.

    Args:
        registry: The registry's name, for messages and thread names.
        table: The registry's version table.
        retirement: Retires the versions that left a policy.
        load: The registry's ``load``.
        swap_policy: Whether new versions load before old ones retire.
    """

    def __init__(
        self,
        registry: str,
        table: VersionTable,
        retirement: Retirement,
        load: Callable[..., Any],
        swap_policy: SwapPolicy,
    ) -> None:
        self._registry = registry
        self._table = table
        self._retirement = retirement
        self._load = load
        self._swap_policy = swap_policy
        self._watches: dict[str, Watch] = {}
        # name -> versions an earlier watch of it loaded (it was unwatched, they
        # stayed): a new watch of the name adopts them, wherever they came from.
        self._earlier: dict[str, set[int]] = {}
        # Guards each watch's `held` and `served` against unloads, which do
        # not take the admin lock that scans hold.
        self._holding = threading.Lock()

    def __len__(self) -> int:
        return len(self._watches)

    def get(self, name: str) -> Watch:
        """The watch of ``name``.

        Raises:
            UnknownModelError: ``name`` is not watched.
        """
        watch = self._watches.get(name)
        if watch is None:
            raise UnknownModelError(f"{name!r} is not watched. Watched: {sorted(self._watches)}")
        return watch

    def add(self, name: str, watch: Watch) -> None:
        """Start watching ``name``.

        The versions of ``name`` loaded already whose directory is under the
        base path, or that an earlier watch of ``name`` loaded, become the
        watch's, as if it had loaded them: a model watched anew (a server
        reading its configuration again, with another base path or policy, say)
        retires them once they leave the policy, instead of keeping them for good.

        Raises:
            ValueError: ``name`` is already watched.
        """
        if name in self._watches:
            raise ValueError(
                f"{name!r} already watches {self._watches[name].base!r}; unwatch() it first."
            )
        present = self._table.present(name)
        earlier = self._earlier.pop(name, set())
        watch.served |= present & (set(available_versions(watch.base)) | earlier)
        self._watches[name] = watch

    def start_polling(self, name: str, watch: Watch) -> None:
        """Scan ``name`` every ``watch.poll_interval`` seconds, and on changes if notified.

        Scans run on a thread of their own; with ``watch.notify`` another
        thread wakes it when the operating system reports a change.
        """
        watch.polling.start(
            functools.partial(self.scan, name),
            watch.poll_interval,
            what=f"{name!r} under {watch.base!r}",
            name=f"lifecycle-watch-{self._registry}-{name}",
            notify=watch.base if watch.notify else None,
            notifier_name=f"lifecycle-notify-{self._registry}-{name}",
            recursive=False,
            ended=functools.partial(self._ended, name, watch),
        )

    def remove(self, name: str) -> Watch:
        """Stop watching ``name`` (the caller halts the returned watch).

        Raises:
            UnknownModelError: ``name`` is not watched.
        """
        watch = self.get(name)
        del self._watches[name]
        with self._holding:
            if watch.served:
                self._earlier[name] = set(watch.served)
        return watch

    def retire_all(self, name: str, watch: Watch) -> list[LoadedVersion]:
        """Retire every version of ``name`` (a model that left its repository, say).

        The labels, route and default that point at them go too; each drains,
        then is disposed, through the registry's retirement.

        Returns:
            The versions retired.
        """
        self._earlier.pop(name, None)
        return self._retire_leaving(name, watch, sorted(self._table.present(name)), frozenset())

    def hold(self, name: str, version: int) -> None:
        """Keep scans of ``name`` from loading ``version`` again (an unload by hand).

        Safe without the admin lock: an unload does not take it.
        """
        watch = self._watches.get(name)
        if watch is not None:
            with self._holding:
                watch.held.add(version)
                watch.served.discard(version)

    def release(self, name: str, version: int) -> None:
        """Let scans of ``name`` manage ``version`` again (a load by hand)."""
        watch = self._watches.get(name)
        if watch is not None:
            with self._holding:
                watch.held.discard(version)
                watch.failures.pop(version, None)

    def halt_all(self) -> None:
        """Stop every polling thread, waiting for scans in progress."""
        for watch in list(self._watches.values()):
            watch.polling.halt()

    def clear(self) -> None:
        """Forget every watch."""
        self._watches.clear()
        self._earlier.clear()

    def __contains__(self, name: object) -> bool:
        return name in self._watches

    def _ended(self, name: str, watch: Watch, error: Exception) -> bool:
        """Whether a polling scan's ``error`` says the watch ended meanwhile."""
        return isinstance(error, (UnknownModelError, LifecycleError)) and (
            self._table.closed or self._watches.get(name) is not watch
        )

    def scan(self, name: str) -> ScanReport:
        """Bring ``name``'s loaded versions in line with its base path (see ``ModelRegistry.scan``).

        Raises:
            UnknownModelError: ``name`` is not watched.
            CheckpointError: The base path disappeared; nothing changed.
        """
        watch = self.get(name)
        available = available_versions(watch.base)
        wanted = watch.policy.select(available)
        present = self._table.present(name)
        with self._holding:
            # Evicted under a budget, say: the version is no longer this watch's.
            watch.served &= present
            held = wanted & watch.held
            # A failure is kept while its directory is there: names on disk bound them.
            for version in [v for v in watch.failures if v not in available]:
                del watch.failures[version]
        room = self._room()
        attempts: list[tuple[int, tuple[int, int, int]]] = []
        failed: list[tuple[int, str]] = []
        for version in sorted(wanted - present - held):
            seen = fingerprint(os.path.join(watch.base, str(version)))
            earlier = watch.failures.get(version)
            if earlier is not None and earlier.stands(seen, room):
                failed.append((version, earlier.message))
            else:
                attempts.append((version, seen))
        loaded: list[int] = []
        fresh: list[tuple[int, str, bool]] = []
        swap = Swap(self._table, self._retirement, name, wanted)
        try:
            if self._swap_policy is SwapPolicy.RESOURCE_PRESERVING and attempts:
                # Room first; brought back if no wanted version serves after the loads.
                swap.begin([version for version, _ in attempts])
                pins = Pins.of(self._table, name)
                leaving = self._retire_leaving(name, watch, sorted(watch.served - wanted), wanted)
                swap.aside = SetAside(tuple(leaving), (pins,))
            for index, (version, seen) in enumerate(attempts):
                last = index == len(attempts) - 1
                try:
                    self._load_version(name, version, watch, swap.rollback if last else None)
                except (LoadError, CheckpointError, BudgetExceededError, OSError) as error:
                    message = f"{type(error).__name__}: {error}"
                    short = isinstance(error, BudgetExceededError)  # room may be made later
                    failed.append((version, message))
                    fresh.append((version, message, short))
                    watch.failures[version] = Failure(seen, message, room if short else None)
                else:
                    watch.failures.pop(version, None)
                    loaded.append(version)
                    with self._holding:
                        watch.served.add(version)
        finally:
            swap.rollback()  # if the last load failed before it began, say
            swap.end()
        comeback = swap.comeback
        if comeback is not None:
            with self._holding:
                watch.served.update(version for _, version in comeback.back)
        default = self._table.default(name)
        if loaded or default is None or default not in wanted:
            # A default promoted by hand (a rollback) stays until a newer version arrives.
            self._table.promote_newest(name, wanted)
        if comeback is None:
            retired = [v.version for v in swap.aside.versions]
        else:
            retired = [version for _, version, _ in comeback.lost]
        if wanted & set(self._table.ready(name)):
            # Under either policy, what left the policy goes once a wanted
            # version serves: if every new one failed, the old ones serve on
            # until a later scan succeeds.
            leaving = sorted(watch.served - wanted)
            retired += [v.version for v in self._retire_leaving(name, watch, leaving, wanted)]
        if fresh:
            account = swap.account(retired)
            for version, message, short in fresh:
                _log.warning(
                    "%r version %d failed to load from %r: %s; %s. It is tried again once "
                    "its directory changes%s.",
                    name,
                    version,
                    os.path.join(watch.base, str(version)),
                    message.rstrip("."),
                    account,
                    " or the registry's loaded versions change" if short else "",
                )
        watch.last = ScanReport(
            name=name,
            available=tuple(available),
            wanted=tuple(sorted(wanted)),
            loaded=tuple(loaded),
            retired=tuple(sorted(retired)),
            failed=tuple(failed),
            default=self._table.default(name),
            held=tuple(sorted(held)),
            restored=tuple(sorted(v for _, v in comeback.back)) if comeback else (),
        )
        watch.polling.last_error = None
        return watch.last

    def _room(self) -> frozenset[tuple[str, int]]:
        """The registry's loaded versions: a load refused for room waits for them to change."""
        return frozenset((loaded.name, loaded.version) for loaded in self._table.versions())

    def _load_version(
        self,
        name: str,
        version: int,
        watch: Watch,
        rollback: Callable[[], None] | None = None,
    ) -> None:
        """Load one version directory, whatever it holds.

        ``rollback`` runs if the load fails, while requests still wait for it.

        Raises:
            LoadError: It holds only checkpoints and the watch has no factory,
                or it is no longer complete, or the load failed.
        """
        directory = os.path.join(watch.base, str(version))
        source = version_source(directory)
        if source is None:
            raise LoadError(f"{directory!r} no longer holds a complete version.")
        if source.kind != "checkpoints":
            self._load(
                name,
                version,
                source.path,
                warmup=watch.warmup,
                batching=watch.batching,
                rollback=rollback,
            )
            return
        if watch.factory is None:
            raise LoadError(
                f"{directory!r} holds only checkpoints, and restoring them needs the "
                f"model's architecture: pass watch({name!r}, ..., factory=<a function "
                "building the model>), or export the version as a SavedModel or a "
                ".keras archive."
            )
        self._load(
            name,
            version,
            watch.factory,
            warmup=watch.warmup,
            checkpoint=directory,
            strict=watch.strict,
            batching=watch.batching,
            rollback=rollback,
        )

    def _retire_leaving(
        self, name: str, watch: Watch, leaving: list[int], wanted: frozenset[int]
    ) -> list[LoadedVersion]:
        """Retire versions that left a watch's policy; labels and routes on them go too.

        Returns:
            The versions retired (a version no longer ready is only forgotten).
        """
        retired = []
        for version in leaving:
            loaded = self._table.find(name, version)
            with self._holding:
                watch.served.discard(version)
            if loaded is None:
                continue
            with self._table.cond:
                # The route first: once the labels on the version are gone, a
                # route through them no longer shows it goes to this version.
                route = self._table.entry(name).route or ()
                if loaded.state is VersionState.READY and any(
                    self._table.entry(name).version_of(target) == version for target, _ in route
                ):
                    self._table.route(name, None)
                if not self._table.unpin(loaded, wanted):
                    continue
            self._retirement.retire(loaded, wait=False)
            retired.append(loaded)
        return retired
