"""One loaded version, and one model's versions with its default, labels and route."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

import attrs

from .._model import ManagedModel
from .._serving import ServingFunction
from .._session import LifecycleSession
from .._tf import SERVING_SIGNATURE
from ._batching import BatchedServe, batching_statistics
from ._signature import ServingSignature
from ._status import VersionState, VersionStatus

__all__ = ["LoadedVersion", "ModelEntry"]


@attrs.define(eq=False)
class LoadedVersion:
    """A version of a model, from its load to its disposal.

    It lives in a session of its own (a child of the registry's), so closing
    that session disposes the model and everything it owns.
    """

    name: str
    version: int
    session: LifecycleSession
    # Set when the build succeeds; None again once disposed.
    model: ManagedModel | None = None
    serve: ServingFunction | BatchedServe | None = None
    # Read once from `serve` after the build.
    signature: ServingSignature | None = None
    # A SavedModel's other signatures: {name: (signature, call on its input nest)}.
    others: dict[str, tuple[ServingSignature, Callable[[Any], Any]]] = attrs.field(
        factory=dict, repr=False
    )
    state: VersionState = VersionState.LOADING
    nbytes: int = 0
    # Bytes only a collection frees once the version is disposed (a SavedModel's
    # restored functions hold a copy of its variables in reference cycles).
    collectable_bytes: int = 0
    load_seconds: float = 0.0
    # Builds this version again from the same source (a failed load's rollback).
    rebuild: Callable[[], LoadedVersion] | None = attrs.field(default=None, repr=False)
    # Set under the version table's lock when its disposal begins: from then
    # on a rollback builds it again instead of making it routable.
    disposing: bool = False
    # Guarded by the version table's lock.
    leases: int = 0
    requests: int = 0
    last_used: float = attrs.field(factory=time.monotonic)

    @property
    def signatures(self) -> dict[str, ServingSignature]:
        """Every signature by name, ``serving_default`` (:attr:`signature`) first."""
        assert self.signature is not None  # built
        return {
            SERVING_SIGNATURE: self.signature,
            **{name: signature for name, (signature, _) in self.others.items()},
        }


@attrs.define(eq=False)
class ModelEntry:
    """One model name's loaded versions and where its traffic goes.

    Invariants (under the version table's lock): ``default``, each label's
    version and each int route target are keys of ``versions``; a version
    leaves ``versions`` only once disposed.
    """

    versions: dict[int, LoadedVersion] = attrs.field(factory=dict)
    # Where unrouted, unpinned requests go; None while no version is ready.
    default: int | None = None
    labels: dict[str, int] = attrs.field(factory=dict)
    # (label or version, weight) pairs, or None without a route.
    route: list[tuple[Hashable, float]] | None = None

    def version_of(self, target: Hashable) -> int | None:
        """The version a route target means now: a label's version, or the version itself."""
        return self.labels.get(target) if isinstance(target, str) else target  # type: ignore[return-value]

    def ready(self) -> list[int]:
        """The routable versions, ascending."""
        return sorted(
            v for v, loaded in self.versions.items() if loaded.state is VersionState.READY
        )

    def pinned(self) -> set[int]:
        """Versions a label or an int route target points to."""
        return set(self.labels.values()) | {
            target for target, _ in self.route or () if isinstance(target, int)
        }

    def status(self, name: str, loaded: LoadedVersion) -> VersionStatus:
        """A frozen snapshot of ``loaded``, a version of this entry."""
        weight = None
        if self.route is not None:
            total = sum(w for _, w in self.route)
            weight = (
                sum(w for target, w in self.route if self.version_of(target) == loaded.version)
                / total
            )
        return VersionStatus(
            name=name,
            version=loaded.version,
            state=loaded.state,
            default=self.default == loaded.version,
            labels=tuple(sorted(lb for lb, v in self.labels.items() if v == loaded.version)),
            weight=weight,
            leases=loaded.leases,
            bytes=loaded.nbytes,
            load_seconds=loaded.load_seconds,
            requests=loaded.requests,
            batching=batching_statistics(loaded.serve),
        )
