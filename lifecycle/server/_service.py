"""ModelService: the one path from every protocol adapter into the registry.

Adapters translate their wire format into calls on this object and its answers
back; they never touch the registry themselves. Every method is blocking (it
may run a model or load one): adapters call it on a worker thread.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._registry import (
    Inference,
    ModelRegistry,
    ServingSignature,
    VersionState,
    VersionStatus,
    version_source,
)
from ..errors import UnknownModelError
from ._config import _LABEL_CHARS, ServedModel, ServerConfig

__all__ = ["ModelService", "served_versions"]

_log = logging.getLogger("lifecycle.server")


def served_versions(base_path: str) -> dict[int, str]:
    """``{version: source}`` of the complete version directories under ``base_path``.

    A version is ``<base_path>/<version>/`` holding a SavedModel (the source is
    the directory) or one ``.keras`` archive (the source is the file), as the
    registry reads them (``version_source``): a directory still being written,
    or named otherwise than by an integer, is skipped. Checkpoint-only versions
    need a factory, which a server has not, and are skipped too.

    Raises:
        FileNotFoundError: ``base_path`` is not a directory.
    """
    if not os.path.isdir(base_path):
        raise FileNotFoundError(f"Base path {base_path!r} is not a directory.")
    found = {}
    for entry in os.scandir(base_path):
        if not (entry.is_dir() and entry.name.isdigit()):
            continue
        source = version_source(entry.path)
        if source is not None and source.kind in ("saved_model", "keras"):
            found[int(entry.name)] = source.path
    return found


@attrs.define(eq=False)
class ModelService:
    """What the server does, in the registry's terms.

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
    # Serialises loads and unloads of configured models (requests, the poller).
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # Models unloaded through the repository API: polling leaves them alone
    # until a repository load.
    _unloaded: set[str] = attrs.field(factory=set, init=False)
    # (source, its mtime) of versions whose load failed: not retried by
    # polling until the file changes.
    _failed: set[tuple[str, float]] = attrs.field(factory=set, init=False)
    _stop: threading.Event = attrs.field(factory=threading.Event, init=False)
    _poller: threading.Thread | None = attrs.field(default=None, init=False)

    @property
    def ready(self) -> bool:
        """Whether the configured models are loaded and warmed up."""
        return self._ready.is_set()

    def start(self) -> None:
        """Load every configured model, then report ready.

        Raises:
            FileNotFoundError: A base path vanished.
            LoadError, BudgetExceededError: A version failed to load.
        """
        for model in self.config.models:
            with self._lock:
                self._load_model(model)
        self._ready.set()
        if self.config.file_system_poll_wait_seconds > 0:  # a reload may add models
            self._poller = threading.Thread(
                target=self._poll, name="lifecycle-server-poller", daemon=True
            )
            self._poller.start()

    def stop(self) -> None:
        """Stop polling the base paths (waits for a poll in progress). Safe to call twice."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join()

    def _poll(self) -> None:
        """Every ``file_system_poll_wait_seconds``, bring each model in line with its base path."""
        while not self._stop.wait(self.config.file_system_poll_wait_seconds):
            for model in self.config.models:
                with self._lock:
                    if (
                        self._stop.is_set()
                        or model.name in self._unloaded
                        or model not in self.config.models  # dropped by a reload
                    ):
                        continue
                    try:
                        self._load_model(model, polling=True)
                    except Exception:
                        _log.exception("Polling %r under %r failed", model.name, model.base_path)

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
        """The version a request would get, and its serving signature.

        Raises:
            UnknownModelError: No such model, version or label.
        """
        signature = self.registry.signature(name, version=version, label=label)
        if version is None:
            version = self._serving_version(name, label)
        return version, signature

    def _serving_version(self, name: str, label: str | None) -> int:
        for status in self.registry.status(name):
            if (label in status.labels) if label is not None else status.default:
                return status.version
        raise UnknownModelError(f"Model {name!r} has no version ready to serve.")

    def infer(
        self,
        name: str,
        inputs: Mapping[str, Any],
        version: int | None = None,
        label: str | None = None,
        key: str | None = None,
    ) -> Inference:
        """Run a request with named inputs on the version it resolves to.

        Args:
            name: The model.
            inputs: ``{input name: values}``.
            version: Serve this version.
            label: Serve the version this label points to.
            key: The request's sticky routing key: with a route, the same key
                always gets the same version.

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
        if not label or not set(label) <= _LABEL_CHARS:
            raise ValueError(f"A version label must match [a-zA-Z0-9_]+. Received: {label!r}")
        self.registry.set_label(name, label, version)
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
        """``(name, version, state)`` of loaded versions and unloaded configured models."""
        rows: list[tuple[str, int | None, str]] = [
            (s.name, s.version, s.state.name) for s in self.registry.status()
        ]
        loaded = {name for name, _, _ in rows}
        rows += [(m.name, None, "UNAVAILABLE") for m in self.config.models if m.name not in loaded]
        return rows

    def load(self, name: str) -> None:
        """Bring a configured model in line with its base path and version policy.

        Loads the versions the policy wants and are not loaded yet, makes the
        newest the default, and retires the versions that left the policy.

        Raises:
            UnknownModelError: ``name`` is not in the server's configuration.
        """
        for model in self.config.models:
            if model.name == name:
                with self._lock:
                    self._unloaded.discard(name)
                    self._load_model(model)
                return
        raise UnknownModelError(
            f"Model {name!r} is not in the server's configuration: "
            f"{[m.name for m in self.config.models]}"
        )

    def unload(self, name: str) -> None:
        """Retire every version of ``name``: the default last.

        Raises:
            UnknownModelError: ``name`` is not loaded.
            ValueError: A label points to a version (re-point or restart first).
        """
        with self._lock:
            statuses = self.versions(name)
            for status in sorted(statuses, key=lambda s: s.default):
                if status.state is VersionState.READY:
                    self.registry.unload(name, status.version)
            self._unloaded.add(name)

    def reload(self, models: Sequence[ServedModel]) -> None:
        """Serve ``models`` instead of the configured ones, as TensorFlow Serving's reload does.

        Models no longer listed are unloaded (every version retired); listed
        ones are brought in line with their base path, policy and labels, and
        become the configuration. Models loaded into the registry by other
        means are left alone.

        Raises:
            ValueError: A model to drop has a version a label points to (the
                registry cannot remove labels); nothing is changed then.
            FileNotFoundError, LoadError, BudgetExceededError: A listed model
                failed to load; the new configuration stands, and the models
                listed before it in ``models`` are served.
        """
        with self._lock:
            listed = {model.name for model in models}
            dropped = [m.name for m in self.config.models if m.name not in listed]
            labelled = {
                name: [s.version for s in self._statuses(name) if s.labels] for name in dropped
            }
            labelled = {name: versions for name, versions in labelled.items() if versions}
            if labelled:
                raise ValueError(
                    f"Cannot drop {sorted(labelled)}: labels point to versions {labelled}. "
                    "Keep these models in the config."
                )
            self.config = attrs.evolve(self.config, models=tuple(models))
            for name in dropped:
                for status in sorted(self._statuses(name), key=lambda s: s.default):
                    if status.state is VersionState.READY:
                        self.registry.unload(name, status.version)
                self._unloaded.discard(name)
            for model in models:
                self._unloaded.discard(model.name)
                self._load_model(model)
                for label, version in model.labels.items():
                    self.registry.set_label(model.name, label, version)

    def _load_model(self, model: ServedModel, *, polling: bool = False) -> None:
        """Load what the policy wants, promote the newest, retire what left it.

        Polling skips versions whose file failed to load before (until it
        changes) and keeps serving what it has when a load fails.
        """
        files = served_versions(model.base_path)
        if polling:
            files = {v: f for v, f in files.items() if (f, os.path.getmtime(f)) not in self._failed}
        present = {s.version for s in self._statuses(model.name)}
        wanted = sorted(model.policy.select(files))
        if not wanted and polling:
            return
        if not wanted:
            raise FileNotFoundError(
                f"Model {model.name!r}: no version directory under {model.base_path!r} "
                "holds a SavedModel or a .keras file that its version policy serves."
            )
        stray = {lb: v for lb, v in model.labels.items() if v not in wanted}
        if stray:
            raise ValueError(
                f"Model {model.name!r}: labels {stray} point to versions not served "
                f"(served: {wanted})."
            )
        loaded = False
        for version in wanted:
            if version not in present:
                labels = [lb for lb, v in model.labels.items() if v == version]
                try:
                    self.registry.load(model.name, version, files[version], labels=labels)
                except Exception:
                    self._failed.add((files[version], os.path.getmtime(files[version])))
                    raise
                loaded = True
        # A poll that found nothing new keeps the default an admin call chose.
        default = next((s.version for s in self._statuses(model.name) if s.default), None)
        if not polling or loaded or default not in wanted:
            self.registry.promote(model.name, wanted[-1])
        for version in present - set(wanted):  # left the policy: drained, then disposed
            self.registry.unload(model.name, version)

    def _statuses(self, name: str) -> tuple[VersionStatus, ...]:
        try:
            return self.registry.status(name)
        except UnknownModelError:
            return ()
