"""ModelService: the one path from every protocol adapter into the registry.

Adapters translate their wire format into calls on this object and its answers
back; they never touch the registry themselves. Every method is blocking (it
may run a model or load one): adapters call it on a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .._core._checks import check_label
from .._registry import (
    Inference,
    ModelRegistry,
    ServingLease,
    ServingSignature,
    VersionState,
    VersionStatus,
)
from .._registry._watching import fingerprint
from ..errors import BudgetExceededError, CheckpointError, LoadError, UnknownModelError
from ._config import ServedModel, ServerConfig
from ._errors import ModelControlError
from ._rules import repository_models

__all__ = ["ModelService"]

_log = logging.getLogger("lifecycle.server")

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

    The models of a model repository (``config.model_repository``,
    ``<repository>/<model>/<version>/``) are watched the same way, each with
    the latest version policy, as Triton's control mode says: ``none`` loads
    them all at start-up and refuses repository loads and unloads of them;
    ``poll`` too, and a thread of the service rescans the repository every
    ``config.repository_poll_secs`` (new models load, removed ones unload,
    and each model's new versions swap in); ``explicit`` loads
    ``config.load_models`` at start-up and any model of the repository by
    name (a load of a loaded model reads its directory again).

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
    # The models the registry watches for us: configured ones and the repository's.
    _watched: set[str] = attrs.field(factory=set, init=False)
    # The repository's models the service loaded (and watches).
    _repository_loaded: set[str] = attrs.field(factory=set, init=False)
    # The repository's models being loaded now: the index says LOADING.
    _loading: set[str] = attrs.field(factory=set, init=False)
    # Poll mode: repository models whose load failed -> their directory's
    # fingerprint then; not tried again until it changes.
    _failed: dict[str, object] = attrs.field(factory=dict, init=False)
    # Poll mode: the thread that rescans the repository, and what stops it.
    _poller: threading.Thread | None = attrs.field(default=None, init=False)
    _stopping: threading.Event = attrs.field(factory=threading.Event, init=False)
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
            for name in self.config.startup_models():
                self._watch_repository(name, strict=True)
            for name, weights in self.config.routes.items():
                self.registry.route(name, weights)
        if self.config.model_repository is not None and self.config.model_control_mode == "poll":
            self._poller = threading.Thread(
                target=self._poll_repository, name="lifecycle-repository-poll", daemon=True
            )
            self._poller.start()
        self._ready.set()

    def stop(self) -> None:
        """Stop polling the base paths and the repository (waits for a scan in progress).

        Safe to call twice.
        """
        self._stopping.set()
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join()
        with self._lock:
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

    def signature(
        self, name: str, version: int | None = None, label: str | None = None
    ) -> tuple[int, ServingSignature]:
        """The version a request would get, and its serving signature, from one resolution.

        For metadata; a request decodes against the signature of the version
        that serves it (:meth:`request`).

        Raises:
            UnknownModelError: No such model, version or label.
        """
        served, signatures = self.registry.peek(name, version=version, label=label)
        return served, next(iter(signatures.values()))

    def signatures(
        self, name: str, version: int | None = None, label: str | None = None
    ) -> tuple[int, dict[str, ServingSignature]]:
        """The version a request would get, and all its signatures by name, from one resolution.

        ``serving_default`` comes first; a SavedModel has each of its signatures.

        Raises:
            UnknownModelError: No such model, version or label.
        """
        return self.registry.peek(name, version=version, label=label)

    def serving_signature(
        self, name: str, version: int | None = None, label: str | None = None
    ) -> ServingSignature:
        """The serving signature a request would get now, for metadata.

        Never decode a request with it: with a route, the version that serves
        the request may be another (:meth:`request` holds that one).

        Raises:
            UnknownModelError: No such model, version or label.
        """
        return self.registry.signature(name, version=version, label=label)

    def request(
        self,
        name: str,
        version: int | None = None,
        label: str | None = None,
        key: str | None = None,
    ) -> contextlib.AbstractContextManager[ServingLease]:
        """Hold the version that serves one request, from decoding to the answer.

        Adapters decode the request against ``lease.signature`` and run it with
        ``lease.infer`` inside the ``with`` block: one resolution of the
        route per request, so an A/B split between versions whose inputs
        differ decodes every request against the version that runs it.

        Args:
            name: The model.
            version: Serve this version.
            label: Serve the version this label points to.
            key: The request's sticky routing key: with a route, the same key
                always gets the same version.

        Raises:
            UnknownModelError: No such model, version or label.
            UnavailableError: No routable version appeared in time.
        """
        return self.registry.serving(name, version=version, label=label, key=key)

    def infer(
        self,
        name: str,
        inputs: Mapping[str, Any],
        version: int | None = None,
        label: str | None = None,
        key: str | None = None,
    ) -> Inference:
        """Run a request with named inputs on the version it resolves to (one resolution).

        Args:
            name: The model.
            inputs: ``{input name: values}``.
            version: Serve this version.
            label: Serve the version this label points to.
            key: The request's sticky routing key.

        Raises:
            UnknownModelError: No such model, version or label.
            ValueError, TypeError: The inputs do not fit the signature.
        """
        return self.registry.infer(name, inputs, version=version, label=label, key=key)

    # -- swaps, labels, routes (the admin API) ---------------------------------------

    def promote(self, name: str, version: int) -> tuple[VersionStatus, ...]:
        """Make a ready version the default; returns the model's versions.

        Polling the base path does not undo it: a poll promotes only a version
        it has just loaded, or when the default left the version policy.

        Raises:
            UnknownModelError: No such model or ready version.
        """
        self.registry.promote(name, version)
        return self.versions(name)

    def set_label(self, name: str, label: str, version: int) -> tuple[VersionStatus, ...]:
        """Point ``label`` at a ready version; returns the model's versions.

        Raises:
            ValueError: The label is not TensorFlow Serving's ``[a-zA-Z0-9_]+``.
            UnknownModelError: No such model or ready version.
        """
        self.registry.set_label(name, check_label(label), version)
        return self.versions(name)

    def remove_label(self, name: str, label: str) -> tuple[VersionStatus, ...]:
        """Remove ``label``; returns the model's versions.

        Raises:
            UnknownModelError: No such model or label.
            ValueError: The route goes through the label.
        """
        self.registry.remove_label(name, label)
        return self.versions(name)

    def route(
        self, name: str, weights: Mapping[str | int, float] | None
    ) -> tuple[VersionStatus, ...]:
        """Split ``name``'s traffic by weight among labels (str) and versions (int).

        ``None`` removes the route. Returns the model's versions.

        Raises:
            TypeError, ValueError: Bad weights.
            UnknownModelError: No such model, label or ready version.
        """
        self.registry.route(name, weights)
        return self.versions(name)

    # -- the model repository -----------------------------------------------------

    def repository(self) -> list[tuple[str, int | None, str]]:
        """``(name, version, state)`` of every loaded version, and of every model not loaded.

        The models not loaded are the configured ones and those of the model
        repository, with version ``None`` and state ``UNAVAILABLE``, or
        ``LOADING`` while a load of theirs runs. The states are Triton's:
        ``LOADING``, ``READY``, ``UNLOADING`` (a retired version draining its
        requests) and ``UNAVAILABLE``.
        """
        rows: list[tuple[str, int | None, str]] = [
            (s.name, s.version, _INDEX_STATES[s.state]) for s in self.registry.status()
        ]
        loaded = {name for name, _, _ in rows}
        known = [m.name for m in self.config.models] + self._repository_names()
        rows += [
            (name, None, "LOADING" if name in self._loading else "UNAVAILABLE")
            for name in known
            if name not in loaded
        ]
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
                self._loading.add(name)
                try:
                    with self._lock:
                        self._watch_repository(name, strict=True)
                finally:
                    self._loading.discard(name)
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
            self._unwatch(name)
            self._retire(name)
            self._repository_loaded.discard(name)

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
                self._unwatch(name)
                self._retire(name)
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

    def _watch(self, model: ServedModel, *, strict: bool, repository: bool = False) -> None:
        """Have the registry watch ``model``'s base path (anew), and set its labels.

        Versions loaded before that the new policy does not serve are retired.

        Args:
            model: The configured model.
            strict: Any failed version is an error (at start-up); otherwise
                only when the model ends up with no version to serve.
            repository: ``model`` is one of the model repository's: its base
                path is polled only in control mode ``poll``, as often as the
                repository.
        """
        self._unwatch(model.name)
        interval = self.config.file_system_poll_wait_seconds
        if repository:
            poll = self.config.model_control_mode == "poll"
            interval = self.config.repository_poll_secs if poll else 0
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
        if not report.wanted:
            self._unwatch(model.name)
            raise FileNotFoundError(
                f"Model {model.name!r}: no version directory under {model.base_path!r} "
                "holds a version its policy serves."
            )
        failed = dict(report.failed)
        if failed and (strict or report.default is None):
            if report.default is None:
                self._unwatch(model.name)
            version, message = next(iter(failed.items()))
            raise LoadError(f"Loading {model.name!r} version {version} failed: {message}")
        ready = [
            s.version
            for s in self._statuses(model.name)
            if s.version in report.wanted and s.state is VersionState.READY
        ]
        if ready and report.default not in report.wanted:  # the policy changed: its newest serves
            self.registry.promote(model.name, max(ready))
        if ready:
            # Only once a wanted version serves: if every one failed to load, the
            # versions loaded before serve on (a failed swap loses nothing).
            leftover = [
                s.version for s in self._statuses(model.name) if s.version not in report.wanted
            ]
            self._retire(model.name, leftover)
        self._set_labels(model)

    def _watch_repository(self, name: str, *, strict: bool) -> None:
        """Watch the repository's model ``name`` (anew): load its latest version, swap to it."""
        assert self.config.model_repository is not None
        model = ServedModel(name, os.path.join(self.config.model_repository, name))
        try:
            self._watch(model, strict=strict, repository=True)
        finally:  # a failed read of a loaded model leaves its versions serving
            if name in self._watched:
                self._repository_loaded.add(name)
            else:
                self._repository_loaded.discard(name)

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

    def _poll_repository(self) -> None:
        """Rescan the repository every ``repository_poll_secs`` until :meth:`stop`."""
        while not self._stopping.wait(self.config.repository_poll_secs):
            try:
                self._scan_repository()
            except Exception:  # keep polling: the next scan may succeed
                _log.exception("Scanning the model repository failed")

    def _scan_repository(self) -> None:
        """Load the repository's new models, unload its removed ones (control mode ``poll``)."""
        assert self.config.model_repository is not None
        present = set(self._repository_names())
        with self._lock:
            if self._stopping.is_set():
                return
            for name in sorted(self._repository_loaded - present):
                self._unwatch(name)
                self._retire(name)
                self._repository_loaded.discard(name)
                _log.info("Model %r left the repository: unloaded.", name)
            self._failed = {name: seen for name, seen in self._failed.items() if name in present}
            for name in sorted(present - self._repository_loaded):
                directory = os.path.join(self.config.model_repository, name)
                # Its entries too: a version directory renamed into place changes no file.
                try:
                    seen = (sorted(os.listdir(directory)), fingerprint(directory))
                except OSError:  # removed meanwhile
                    continue
                if self._failed.get(name) == seen:
                    continue
                try:
                    self._watch_repository(name, strict=True)
                except (
                    FileNotFoundError,
                    LoadError,
                    BudgetExceededError,
                    CheckpointError,
                    ValueError,
                ) as error:
                    self._failed[name] = seen
                    _log.warning(
                        "Model %r of the repository did not load; it is tried again once "
                        "its directory changes. %s: %s",
                        name,
                        type(error).__name__,
                        error,
                    )
                else:
                    self._failed.pop(name, None)
                    _log.info("Model %r joined the repository: loaded.", name)

    def _set_labels(self, model: ServedModel) -> None:
        """Point ``model``'s configured labels at their versions.

        Raises:
            ValueError: A label points to a version that is not served.
        """
        served = {s.version for s in self._statuses(model.name) if s.state is VersionState.READY}
        stray = {label: v for label, v in model.labels.items() if v not in served}
        if stray:
            raise ValueError(
                f"Model {model.name!r}: labels {stray} point to versions not served "
                f"(served: {sorted(served)})."
            )
        for label, version in model.labels.items():
            self.registry.set_label(model.name, label, version)

    def _unwatch(self, name: str) -> None:
        if name in self._watched:
            self._watched.discard(name)
            with contextlib.suppress(UnknownModelError):  # the registry closed or unwatched it
                self.registry.unwatch(name)

    def _retire(self, name: str, versions: Sequence[int] | None = None) -> None:
        """Retire ``name``'s ready versions (all, or ``versions``), dropping what pins them.

        Labels on them are removed, and the route if it goes through one; the
        default goes last, since a default with others ready cannot be unloaded.
        """
        statuses = [s for s in self._statuses(name) if s.state is VersionState.READY]
        if versions is not None:
            statuses = [s for s in statuses if s.version in versions]
        if any(s.labels or s.weight is not None for s in statuses):
            self.registry.route(name, None)
        for status in sorted(statuses, key=lambda s: s.default):
            for label in status.labels:
                self.registry.remove_label(name, label)
            self.registry.unload(name, status.version)

    def _statuses(self, name: str) -> tuple[VersionStatus, ...]:
        try:
            return self.registry.status(name)
        except UnknownModelError:
            return ()
