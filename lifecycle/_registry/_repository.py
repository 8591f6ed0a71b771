"""Watching a model repository: ``<repository>/<model>/<version>/``, Triton's and KServe's layout.

Each directory of the repository is a model named after it, and a base path
of version directories (``_version_dirs``). A :class:`Repository` turns the
repository into watches of the registry's :class:`~._watching.Watcher`, one per
model, with the latest version policy: a scan of the repository starts
watching the model directories that appeared, retires every version of those
that disappeared (through the registry's :class:`~._retiring.Retirement`), and
scans each model it watches, which loads, swaps and remembers failed loads as a
watched base path does. With a poll interval, one thread scans the whole
repository; the models' own watches have none.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import attrs

from .._core._batcher import BatchingPolicy
from .._core._model_dirs import repository_models
from .._core._policies import VersionPolicy
from ..errors import LifecycleError, UnknownModelError
from ._watching import Polling, ScanReport, Watch, Watcher

__all__ = ["Repository", "RepositoryReport", "repository_models"]

_log = logging.getLogger("lifecycle.registry")


@attrs.frozen
class RepositoryReport:
    """What one scan of a watched model repository did.

    Attributes:
        path: The repository (absolute).
        models: The models the repository watches after the scan, sorted.
        joined: Models watched from this scan on (their directory appeared,
            or a scan named them).
        left: Models whose directory is gone: no longer watched, every
            version retired (they drain, then go).
        scans: Each watched model's :class:`ScanReport`, by name (loads,
            swaps and failed loads are there).
        errors: ``(model, "type: message")`` of models whose scan failed (its
            directory removed while being read, say); the next scan tries again.
        skipped: Model directories not watched because their name is watched
            already, from a base path elsewhere (:meth:`ModelRegistry.watch`).
    """

    path: str
    models: tuple[str, ...]
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    scans: tuple[ScanReport, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    skipped: tuple[str, ...] = ()

    def scan(self, name: str) -> ScanReport | None:
        """``name``'s scan in this report, if it was scanned."""
        return next((report for report in self.scans if report.name == name), None)


@attrs.define(eq=False)
class Repository:
    """A watched model repository of one registry.

    The caller holds the registry's admin lock around :meth:`scan`,
    :meth:`forget` and :meth:`retire`.

    Args:
        path: The repository (absolute).
        watcher: The registry's watcher: each model of the repository is a
            watch of it.
        models: Watch only these models (Triton's explicit mode); ``None``:
            every model directory, as it comes and goes.
        poll_interval: Scan every this many seconds on a thread; ``None``: only
            when asked.
        notify: Also scan as soon as the operating system reports a change.
        batching: Each version's request batching.
    """

    path: str
    watcher: Watcher
    models: set[str] | None
    poll_interval: float | None = None
    notify: bool = False
    batching: BatchingPolicy | None = None
    # The models this repository watches: each is a watch of `watcher`.
    members: set[str] = attrs.field(factory=set)
    # With `models=None`: models unwatched by hand; scans leave them alone
    # until a scan names them again.
    dropped: set[str] = attrs.field(factory=set)
    # Names skipped because watched elsewhere: each is logged once.
    clashes: set[str] = attrs.field(factory=set)
    last: RepositoryReport | None = None
    polling: Polling = attrs.field(factory=Polling)

    def scan(self, names: tuple[str, ...] = ()) -> RepositoryReport:
        """Bring the watched models in line with the repository's directories, then scan each.

        Args:
            names: Models to read anew: each starts being watched if it was not
                (Triton's explicit load), or is watched afresh (its failed
                versions are tried again); its scan swaps to its newest version.

        Raises:
            UnknownModelError: A name in ``names`` is not a model directory of
                the repository.
        """
        present = repository_models(self.path)
        unknown = sorted(set(names) - set(present))
        if unknown:
            raise UnknownModelError(
                f"No model directory {unknown} in the repository {self.path!r}. "
                f"Its models: {present}"
            )
        if self.models is not None:
            self.models.update(names)
        self.dropped.difference_update(names)
        chosen = {
            name
            for name in present
            if (self.models is None or name in self.models) and name not in self.dropped
        }
        left = sorted(self.members - chosen)
        for name in left:
            self.retire(name)
            _log.info("Model %r left the repository %r: its versions retire.", name, self.path)
        joined, skipped, errors = [], [], []
        for name in sorted(chosen):
            if name in self.members and name not in names:
                continue
            if name in self.members:  # read anew
                self.watcher.remove(name)
                self.members.discard(name)
            elif name in self.watcher:
                skipped.append(name)
                if name not in self.clashes:
                    self.clashes.add(name)
                    _log.warning(
                        "Model directory %r of the repository %r is not watched: %r is "
                        "watched from another base path (%r).",
                        name,
                        self.path,
                        name,
                        self.watcher.get(name).base,
                    )
                continue
            try:
                self.watcher.add(name, self._watch_of(name))
            except LifecycleError as error:  # its directory vanished since the listing
                errors.append((name, f"{type(error).__name__}: {error}"))
                continue
            self.members.add(name)
            joined.append(name)
        self.clashes &= set(skipped)
        scans = []
        for name in sorted(self.members):
            try:
                scans.append(self.watcher.scan(name))
            except LifecycleError as error:  # its directory vanished meanwhile, say
                errors.append((name, f"{type(error).__name__}: {error}"))
        self.last = RepositoryReport(
            path=self.path,
            models=tuple(sorted(self.members)),
            joined=tuple(joined),
            left=tuple(left),
            scans=tuple(scans),
            errors=tuple(errors),
            skipped=tuple(skipped),
        )
        self.polling.last_error = None
        return self.last

    def _watch_of(self, name: str) -> Watch:
        return Watch(
            os.path.join(self.path, name),
            None,  # SavedModels and .keras archives only: no factory to name
            VersionPolicy.latest(),
            warmup=None,
            strict=True,
            batching=self.batching,
        )

    def retire(self, name: str) -> None:
        """Stop watching ``name`` and retire every version of it."""
        watch = self.watcher.remove(name)
        self.members.discard(name)
        self.watcher.retire_all(name, watch)

    def forget(self, name: str) -> None:
        """``name`` was unwatched by hand: scans leave it alone until one names it."""
        self.members.discard(name)
        if self.models is None:
            self.dropped.add(name)
        else:
            self.models.discard(name)

    def start_polling(self, scan: Callable[[], RepositoryReport]) -> None:
        """Call ``scan`` every ``poll_interval`` seconds, and on changes if notified."""
        base = os.path.basename(self.path)
        self.polling.start(
            scan,
            self.poll_interval,
            what=f"the repository {self.path!r}",
            name=f"lifecycle-repository-{base}",
            notify=self.path if self.notify else None,
            notifier_name=f"lifecycle-repository-notify-{base}",
            recursive=True,
        )


def members_of(repositories: dict[str, Repository], name: str) -> Iterator[Repository]:
    """The repositories that watch ``name`` (at most one)."""
    return (repository for repository in repositories.values() if name in repository.members)
