"""ModelService: what the server serves, in Triton's and TensorFlow Serving's terms.

It loads the configured models and the repository's (through the registry's
watches), answers the repository index, loads and unloads by name, and reloads
a model config. Requests do not pass through it: the protocol adapters lease a
version from ``service.registry.serving()`` and run it there, and the admin
API promotes, labels and routes on ``service.registry`` itself. Every method is
blocking (it may load a model): adapters call it on a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._core._model_dirs import repository_models
from .._registry import ModelRegistry, ScanReport, VersionState, VersionStatus
from ..errors import LoadError, UnknownModelError
from ._config import ServedModel, ServerConfig
from ._errors import ModelControlError

__all__ = ["ModelService"]

# A version's state in the repository index, in Triton's words.
_INDEX_STATES = {
    VersionState.LOADING: "LOADING",
    VersionState.READY: "READY",
    VersionState.RETIRING: "UNLOADING",  # drains its requests, then is disposed
    VersionState.UNLOADED: "UNAVAILABLE",
}


@attrs.define(eq=False)
class ModelService:
    """What the server does, in the registry's terms.

    Each configured model is a base path the registry watches
    (:meth:`ModelRegistry.watch`), polled every
    ``config.file_system_poll_wait_seconds`` and scanned at once when the
    operating system reports a change in it (``notify``): the registry loads,
    promotes and retires its versions. A repository unload stops watching the model and
    retires its versions, so polling leaves it alone until a repository load
    watches it again.

    A model repository (``config.model_repository``,
    ``<repository>/<model>/<version>/``) is a repository the registry watches
    (:meth:`ModelRegistry.watch_repository`): each model's latest version
    serves. The service adds Triton's control modes: ``none`` loads every
    model at start-up and refuses repository loads and unloads; ``poll`` too,
    and the registry scans the repository every ``config.repository_poll_secs``
    (new models load, removed ones unload, and each model's new versions swap
    in); ``explicit`` loads ``config.load_models`` at start-up and any model of
    the repository by name (a load of a loaded model reads its directory again).

    Args:
        registry: The registry that holds and runs the versions; the service
            does not own it (whoever created it closes it).
        config: The server's configuration: which models to load (a
            :meth:`reload` replaces its models).
    """

    registry: ModelRegistry
    config: ServerConfig
    # Set once the configured models are loaded and warmed up.
    _ready: threading.Event = attrs.field(factory=threading.Event, init=False)
    # Serialises the service's loads, unloads and reloads.
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # The configured models the registry watches for us (the repository's
    # models are the registry's repository watch's).
    _watched: set[str] = attrs.field(factory=set, init=False)
    # Whether the registry watches the model repository for us.
    _watching_repository: bool = attrs.field(default=False, init=False)
    # The start-up models' factories (--model_factory) by name: a reloaded
    # config (a ModelServerConfig, which cannot name code) keeps them.
    _factories: dict[str, Callable[[], Any]] = attrs.field(init=False)

    @_factories.default
    def _startup_factories(self) -> dict[str, Callable[[], Any]]:
        return {m.name: m.factory for m in self.config.models if m.factory is not None}

    @property
    def ready(self) -> bool:
        """Whether the configured models are loaded and warmed up."""
        return self._ready.is_set()

    def start(self) -> None:
        """Load the configured models and the repository's start-up ones, then report ready.

        The routes are set once the models are loaded.

        Once started, later calls return at once.

        Raises:
            FileNotFoundError: A model's base path has no version its policy serves.
            LoadError, BudgetExceededError: A version failed to load.
            CheckpointError: A base path vanished.
        """
        if self._ready.is_set():
            return
        with self._lock:
            for model in self.config.models:
                self._watch(model, strict=True)
            if self.config.model_repository is not None:
                self._watch_repository()
            for name, weights in self.config.routes.items():
                self.registry.route(name, weights)
        self._ready.set()

    def stop(self) -> None:
        """Stop polling the base paths and the repository (waits for a scan in progress).

        The loaded versions stay loaded (whoever created the registry closes
        it). Safe to call twice.
        """
        with self._lock:
            if self._watching_repository:
                self._watching_repository = False
                assert self.config.model_repository is not None
                with contextlib.suppress(UnknownModelError):  # the registry closed
                    self.registry.unwatch_repository(self.config.model_repository)
            for name in list(self._watched):
                self._unwatch(name)

    # -- status and metadata ------------------------------------------------------

    def versions(
        self, name: str, version: int | None = None, label: str | None = None
    ) -> tuple[VersionStatus, ...]:
        """The status of ``name``'s versions, or of the one ``version``/``label`` means.

        Raises:
            UnknownModelError: No such model, version or label.
        """
        statuses = self.registry.status(name)
        if label is not None:
            chosen = tuple(s for s in statuses if label in s.labels)
            if not chosen:
                raise UnknownModelError(f"Model {name!r} has no version labelled {label!r}.")
            return chosen
        if version is not None:
            chosen = tuple(s for s in statuses if s.version == version)
            if not chosen:
                raise UnknownModelError(
                    f"Model {name!r} has no version {version}. "
                    f"Loaded: {[s.version for s in statuses]}"
                )
            return chosen
        return statuses

    # -- the model repository -----------------------------------------------------

    def repository(self) -> list[tuple[str, int | None, str]]:
        """``(name, version, state)`` of every loaded version, and of every model not loaded.

        The models not loaded are the configured ones and those of the model
        repository, with version ``None`` and state ``UNAVAILABLE``. The
        states are Triton's, read from the registry: ``LOADING`` (a version
        being loaded), ``READY``, ``UNLOADING`` (a retired version draining its
        requests) and ``UNAVAILABLE``.
        """
        rows: list[tuple[str, int | None, str]] = [
            (s.name, s.version, _INDEX_STATES[s.state]) for s in self.registry.status()
        ]
        loaded = {name for name, _, _ in rows}
        known = [m.name for m in self.config.models] + self._repository_names()
        rows += [(name, None, "UNAVAILABLE") for name in known if name not in loaded]
        return rows

    def load(self, name: str) -> None:
        """Load a configured model or a model of the repository, or read it again if loaded.

        Loads the versions the policy wants (a repository model's latest),
        makes the newest the default, sets the configured labels, and polls
        the base path again. Versions that failed before are tried again.
        A model of the repository loads only in control mode ``explicit``;
        if one of its versions fails to load, the versions it had serve on.

        Raises:
            ModelControlError: ``name`` is not a configured model, and the
                repository's control mode is not ``explicit``.
            UnknownModelError: ``name`` is neither a configured model nor a
                directory of the repository.
            LoadError, BudgetExceededError: A version failed to load (those
                that loaded serve).
        """
        for model in self.config.models:
            if model.name == name:
                with self._lock:
                    self._watch(model, strict=False)
                return
        if self.config.model_repository is not None:
            self._check_control(name)
            if name in self._repository_names():
                with self._lock:
                    report = self.registry.scan_repository(
                        self.config.model_repository, models=[name]
                    )
                    self._check_scan(report.scan(name), name, self._model_dir(name), strict=True)
                return
        raise UnknownModelError(
            f"Model {name!r} is not in the server's configuration: "
            f"{[m.name for m in self.config.models]}"
            + (
                ""
                if self.config.model_repository is None
                else f", nor in its model repository: {self._repository_names()}"
            )
        )

    def unload(self, name: str) -> None:
        """Stop watching ``name`` and retire every version: its labels and route go too.

        Polling leaves the model alone until :meth:`load`.

        Raises:
            ModelControlError: ``name`` is not a configured model, and the
                repository's control mode is not ``explicit``.
            UnknownModelError: ``name`` is not loaded.
        """
        configured = any(model.name == name for model in self.config.models)
        if not configured and self.config.model_repository is not None:
            self._check_control(name)
        with self._lock:
            self.versions(name)  # UnknownModelError if nothing is loaded
            self._unwatch(name, retire=True)

    def reload(self, models: Sequence[ServedModel]) -> None:
        """Serve ``models`` instead of the configured ones, as TensorFlow Serving's reload does.

        Models no longer listed are unloaded (every version retired, its labels
        and route removed); listed ones are watched with their base path,
        policy and labels, and become the configuration. A listed model
        without a factory gets the one ``--model_factory`` gave the model of
        its name at start-up, so its versions of checkpoints still load.
        Models loaded into the registry by other means are left alone.

        Raises:
            FileNotFoundError, LoadError, BudgetExceededError: A listed model
                failed to load; the new configuration stands, and the models
                listed before it in ``models`` are served.
        """
        repository = self.config.model_repository
        clash = sorted({m.name for m in models} & set(self._repository_names()))
        if clash:
            raise ValueError(
                f"The model repository {repository!r} holds models named {clash}: "
                "a model config may not name them."
            )
        models = [
            attrs.evolve(model, factory=self._factories[model.name])
            if model.factory is None and model.name in self._factories
            else model
            for model in models
        ]
        with self._lock:
            listed = {model.name: model for model in models}
            previous = {model.name: model for model in self.config.models}
            self.config = attrs.evolve(self.config, models=tuple(models))
            for name in previous.keys() - listed.keys():
                self._unwatch(name, retire=True)
            for model in models:
                before = previous.get(model.name)
                if (
                    before is not None
                    and model.name in self._watched
                    and (before.base_path, before.policy) == (model.base_path, model.policy)
                ):
                    self._set_labels(model)  # same versions: only the labels may change
                else:
                    self._watch(model, strict=False)

    def _watch(self, model: ServedModel, *, strict: bool) -> None:
        """Have the registry watch ``model``'s base path (anew), and set its labels.

        The versions an earlier watch of the model loaded that the new policy
        (or base path) does not serve are retired by the registry's scan, once
        a version it serves is ready.

        Args:
            model: The configured model.
            strict: Any failed version is an error (at start-up); otherwise
                only when the model ends up with no version to serve.
        """
        self._unwatch(model.name)
        interval = self.config.file_system_poll_wait_seconds
        report = self.registry.watch(
            model.name,
            model.base_path,
            model.factory,
            policy=model.policy,
            poll_interval=interval or None,
            batching=self.config.batching,
            # Where polling is on, a new version is also found the moment its
            # directory appears, not up to a poll later.
            notify=bool(interval),
        )
        self._watched.add(model.name)
        self._check_scan(report, model.name, model.base_path, strict=strict)
        self._set_labels(model)

    def _check_scan(
        self, report: ScanReport | None, name: str, base_path: str, *, strict: bool
    ) -> None:
        """Raise if the scan of ``name`` left it without what it should serve.

        A model without a version to serve is no longer watched (the index
        shows it ``UNAVAILABLE``); one whose failed version leaves an older one
        serving stays watched.

        Args:
            report: ``name``'s scan (``None``: it was not scanned).
            name: The model.
            base_path: Its directory of versions, for the message.
            strict: Any failed version is an error (at start-up, and a load
                by name); otherwise only when no version serves.

        Raises:
            FileNotFoundError: No version directory holds a version to serve.
            LoadError: A version failed to load.
        """
        if report is None or not report.wanted:
            self._unwatch(name)
            raise FileNotFoundError(
                f"Model {name!r}: no version directory under {base_path!r} holds a version "
                "its policy serves."
            )
        failed = dict(report.failed)
        if failed and (strict or report.default is None):
            if report.default is None:
                self._unwatch(name)
            version, message = next(iter(failed.items()))
            raise LoadError(f"Loading {name!r} version {version} failed: {message}")

    def _watch_repository(self) -> None:
        """Have the registry watch the model repository, and check the start-up models loaded.

        In control mode ``explicit`` only ``config.load_models`` are watched
        (more join with :meth:`load`); otherwise every model directory is,
        and in mode ``poll`` the registry rescans the repository and each
        model every ``config.repository_poll_secs``.

        Raises:
            FileNotFoundError, LoadError: A start-up model has no version to
                serve, or a version failed to load; the repository is not watched.
        """
        repository = self.config.model_repository
        assert repository is not None
        mode = self.config.model_control_mode
        poll = mode == "poll"
        report = self.registry.watch_repository(
            repository,
            models=list(self.config.startup_models()) if mode == "explicit" else None,
            poll_interval=self.config.repository_poll_secs if poll else None,
            # Where polling is on, a new model or version is also found the
            # moment it appears, not up to a poll later.
            notify=poll,
            batching=self.config.batching,
        )
        self._watching_repository = True
        try:
            for name in report.models:
                self._check_scan(report.scan(name), name, self._model_dir(name), strict=True)
        except (FileNotFoundError, LoadError):
            self._watching_repository = False
            self.registry.unwatch_repository(repository)
            raise

    def _model_dir(self, name: str) -> str:
        """The directory of the repository's model ``name``."""
        assert self.config.model_repository is not None
        return os.path.join(self.config.model_repository, name)

    def _repository_names(self) -> list[str]:
        """The models of the repository now, but names of configured models (those win)."""
        if self.config.model_repository is None:
            return []
        configured = {model.name for model in self.config.models}
        names = repository_models(self.config.model_repository)
        return [name for name in names if name not in configured]

    def _check_control(self, name: str) -> None:
        """Refuse a repository load or unload unless the control mode is ``explicit``."""
        mode = self.config.model_control_mode
        if mode != "explicit":
            raise ModelControlError(
                "explicit model load / unload is not allowed if polling is enabled: the "
                f"model repository is served with --model_control_mode {mode}, in which "
                "Triton answers this error too (every model loads at start-up"
                + (", and the repository is polled" if mode == "poll" else "")
                + "). To load and unload models by name, serve it with "
                f"--model_control_mode explicit. Model: {name!r}"
            )

    def _set_labels(self, model: ServedModel) -> None:
        """Point ``model``'s configured labels at their versions.

        Raises:
            ValueError: A label points to a version that is not served.
        """
        served = {
            s.version
            for s in self.registry.status()
            if s.name == model.name and s.state is VersionState.READY
        }
        stray = {label: v for label, v in model.labels.items() if v not in served}
        if stray:
            raise ValueError(
                f"Model {model.name!r}: labels {stray} point to versions not served "
                f"(served: {sorted(served)})."
            )
        for label, version in model.labels.items():
            self.registry.set_label(model.name, label, version)

    def _unwatch(self, name: str, *, retire: bool = False) -> None:
        """Stop the registry watching ``name`` (a configured or repository model).

        Args:
            name: The model.
            retire: Also retire every version of it, with the labels and route
                on them (the registry's retirement: each drains, then goes).
        """
        self._watched.discard(name)
        with contextlib.suppress(UnknownModelError):  # not watched, or the registry closed
            self.registry.unwatch(name, retire=retire)
