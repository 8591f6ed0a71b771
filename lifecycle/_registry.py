"""ModelRegistry: versions, leases, hot swap, A/B routing and a memory budget.

Every loaded version lives in a child session of the registry's own session, is
built under isolated names (``name/v<version>/...``) and has its serving path
traced before it becomes routable. Leases keep a version alive while they are
held; a retired version is disposed when its last lease is returned.
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
import time
import zipfile
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import attrs
import keras
import tensorflow as tf

from . import _tf
from ._checkpoints import latest_checkpoint, restore_checkpoint
from ._core import CleanupStrategy, check_timeout
from ._core._loader import Loader, check_gil_share, check_nice
from ._core._routing import check_key, check_weights, pick
from ._model import ManagedModel, manage
from ._serving import ServingFunction, serving_function
from ._session import LifecycleSession, SessionStatistics, freeze_heap
from ._sources import ScanReport, Source, VersionPolicy, available_versions
from .errors import (
    BudgetExceededError,
    CheckpointError,
    LifecycleError,
    LoadError,
    UnavailableError,
    UnknownModelError,
)

__all__ = [
    "ModelRegistry",
    "RegistryStatistics",
    "ScanReport",
    "SwapPolicy",
    "VersionPolicy",
    "VersionState",
    "VersionStatus",
]


class SwapPolicy(enum.Enum):
    """What a load does when the new version does not fit next to the old ones."""

    #: Load the new version first, then retire old ones: no gap in serving,
    #: but old and new are resident together. Never evicts a default version.
    AVAILABILITY_PRESERVING = "availability_preserving"
    #: Retire old versions first (the model's default included), then load:
    #: memory never holds both, and requests in the gap wait for the new one.
    RESOURCE_PRESERVING = "resource_preserving"


class VersionState(enum.Enum):
    """Where a loaded version is in its life."""

    #: Being built and warmed up; not routable.
    LOADING = "loading"
    #: Routable.
    READY = "ready"
    #: Unloaded: refuses new leases, disposed when its last lease returns.
    RETIRING = "retiring"
    #: Disposed.
    UNLOADED = "unloaded"


@attrs.frozen
class VersionStatus:
    """A snapshot of one loaded version.

    Attributes:
        name: The model's name.
        version: The version number.
        state: ``LOADING``, ``READY``, ``RETIRING`` or ``UNLOADED``.
        default: Whether unrouted requests go to it.
        labels: Labels pointing to it, sorted.
        weight: Its share of the model's routed traffic (0 to 1), or ``None``
            when the model has no route.
        leases: Leases held right now.
        bytes: Bytes of its buffers.
        load_seconds: Time its load took (build and warm-up).
        requests: Leases taken (requests served) so far.
    """

    name: str
    version: int
    state: VersionState
    default: bool
    labels: tuple[str, ...]
    weight: float | None
    leases: int
    bytes: int
    load_seconds: float
    requests: int


@attrs.frozen
class RegistryStatistics:
    """A snapshot of a whole registry (``registry.statistics()``).

    Attributes:
        name: The registry's name.
        models: Model names with a loaded or loading version.
        versions: Versions loaded (ready or retiring).
        loading: Versions being loaded.
        bytes: Bytes the loaded versions hold.
        memory_budget: The budget, or ``None``.
        leases: Leases held right now.
        requests: Requests served by the loaded versions so far.
        watched: Base paths watched.
        load_pauses: Times background loads paused for requests in flight
            (``loader_gil_share``); 0 when loads run on the calling thread.
        session: The registry's own session (its children are the versions).
    """

    name: str
    models: int
    versions: int
    loading: int
    bytes: int
    memory_budget: int | None
    leases: int
    requests: int
    watched: int
    load_pauses: int
    session: SessionStatistics


@attrs.define(eq=False)
class _Version:
    name: str
    version: int
    session: LifecycleSession
    model: ManagedModel | None = None
    serve: ServingFunction | None = None
    state: VersionState = VersionState.LOADING
    nbytes: int = 0
    load_seconds: float = 0.0
    # Guarded by the registry's lock.
    leases: int = 0
    requests: int = 0
    last_used: float = attrs.field(factory=time.monotonic)


@attrs.define(eq=False)
class _Entry:
    versions: dict[int, _Version] = attrs.field(factory=dict)
    default: int | None = None
    labels: dict[str, int] = attrs.field(factory=dict)
    # (label or version, weight) pairs, or None without a route.
    route: list[tuple[Hashable, float]] | None = None

    def version_of(self, target: Hashable) -> int | None:
        """The version a route target means now: a label's version, or the version itself."""
        return self.labels.get(target) if isinstance(target, str) else target  # type: ignore[return-value]


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(
            f"A model name must be a non-empty string without `/`. Received: name={name!r}"
        )
    return name


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"A version must be an int >= 0. Received: version={version!r}")
    return version


def _weights_bytes(path: str) -> int | None:
    """The size of a ``.keras`` archive's weights, read before loading it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.getinfo("model.weights.h5").file_size
    except (KeyError, zipfile.BadZipFile):
        return None


def _specs(sample: Any) -> Any:
    """A TensorSpec nest with a free batch dimension, from a sample input."""

    def spec(value: Any) -> tf.TensorSpec:
        tensor = tf.convert_to_tensor(value)
        return tf.TensorSpec([None, *tensor.shape[1:]], tensor.dtype)

    return tf.nest.map_structure(spec, sample)


def _sample_from_inputs(model: keras.Model) -> Any:
    """Zeros of batch 1 for a model that knows its inputs (functional, Sequential)."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs:
        return None
    samples = [
        tf.zeros([1, *(d or 1 for d in tensor.shape[1:])], tensor.dtype) for tensor in inputs
    ]
    return samples[0] if len(samples) == 1 else samples


@attrs.define(eq=False)
class ModelRegistry:
    """Serves versions of named models in one process: isolation, leases, swaps, routing.

    Args:
        memory_budget: Bytes the registry's versions may hold together; ``None``
            for no limit.
        max_loaded: How many versions may be loaded at once; ``None`` for no limit.
        swap_policy: What a load does when the new version does not fit; see
            :class:`SwapPolicy`.
        lease_timeout: Seconds a request waits for a routable version (during a
            swap gap, or while the first version loads) before
            :class:`UnavailableError`.
        drain_timeout: Seconds ``close()`` waits for leases in flight.
        name: The registry's name; its session is named after it.
        loader_nice: Run loads (factory, checkpoint restore, trace, warm-up) on
            the registry's loader thread, whose ``nice`` value is this much
            higher (1-19, Linux only), so that the scheduler prefers request
            threads. ``None`` (default): no change of priority.
        loader_gil_share: While requests are in flight, the share of time a
            load's Python work may hold the GIL (0-1]: it pauses after each
            0.5 ms slice, so a request thread waiting for the GIL gets it at
            once instead of after the 5 ms switch interval. Loads take longer;
            requests keep their latency. ``1.0`` (default): no pauses.
            With either option set, loads run on the loader thread, in the
            calling thread's dtype policy, device scope, ``tf.distribute``
            strategy and context variables; ``load()`` still returns when the
            version is ready. With neither, loads run on the calling thread.
        freeze_heap: On creation, collect once and ``gc.freeze()`` every
            surviving object (imports, warm-up), so that each collection after a
            swap only scans objects created since: about 20 ms instead of 170 ms
            with TensorFlow and Keras imported (measured). Process-wide; create
            the registry before the models it serves.

    Raises:
        ValueError: An option is out of range.
        NotImplementedError: ``loader_nice`` outside Linux.

    Example:
        >>> import keras, numpy as np, lifecycle as lc
        >>> def factory():
        ...     inputs = keras.Input((4,))
        ...     return keras.Model(inputs, keras.layers.Dense(1)(inputs))
        >>> with lc.ModelRegistry() as registry:
        ...     _ = registry.load("risk", 1, factory, warmup=np.zeros((1, 4), "float32"))
        ...     registry.predict("risk", np.ones((2, 4), "float32")).shape
        TensorShape([2, 1])
    """

    memory_budget: int | None = attrs.field(default=None, kw_only=True)
    max_loaded: int | None = attrs.field(default=None, kw_only=True)
    swap_policy: SwapPolicy = attrs.field(
        default=SwapPolicy.AVAILABILITY_PRESERVING,
        kw_only=True,
        validator=attrs.validators.instance_of(SwapPolicy),
    )
    lease_timeout: float | None = attrs.field(
        default=30.0, kw_only=True, converter=lambda v: check_timeout(v, "lease_timeout")
    )
    drain_timeout: float | None = attrs.field(
        default=30.0, kw_only=True, converter=lambda v: check_timeout(v, "drain_timeout")
    )
    name: str = attrs.field(default="registry", kw_only=True)
    loader_nice: int | None = attrs.field(
        default=None, kw_only=True, converter=lambda v: check_nice(v, "loader_nice")
    )
    loader_gil_share: float = attrs.field(
        default=1.0, kw_only=True, converter=lambda v: check_gil_share(v, "loader_gil_share")
    )
    freeze_heap: bool = attrs.field(default=False, kw_only=True)
    _session: LifecycleSession = attrs.field(init=False, repr=False)
    _loader: Loader | None = attrs.field(default=None, init=False, repr=False)
    # Leases held across all versions; read without the lock by the loader.
    _in_flight: int = attrs.field(default=0, init=False, repr=False)
    # Guards _entries and every _Version's state, leases and counters; its
    # condition wakes requests waiting for a routable version.
    _cond: threading.Condition = attrs.field(
        factory=lambda: threading.Condition(threading.RLock()), init=False, repr=False
    )
    _entries: dict[str, _Entry] = attrs.field(factory=dict, init=False, repr=False)
    # Serialises load/unload/promote bookkeeping that spans a build.
    _admin: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)
    _closed: bool = attrs.field(default=False, init=False, repr=False)
    # (name, version) of loads in progress: requests for them wait, not fail.
    _loading: set[tuple[str, int]] = attrs.field(factory=set, init=False, repr=False)
    # Watched base paths by model name.
    _sources: dict[str, Source] = attrs.field(factory=dict, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for field in ("memory_budget", "max_loaded"):
            value = getattr(self, field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise ValueError(
                    f"`{field}` must be a positive int or None. Received: {field}={value!r}"
                )
        self._session = LifecycleSession(name=self.name)
        if self.loader_nice is not None or self.loader_gil_share < 1:
            self._loader = Loader(
                self.name,
                nice=self.loader_nice,
                gil_share=self.loader_gil_share,
                busy=lambda: self._in_flight > 0,
            )
        if self.freeze_heap:
            freeze_heap()

    def __enter__(self) -> ModelRegistry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- loading ------------------------------------------------------------------

    def load(
        self,
        name: str,
        version: int,
        source: Callable[[], keras.Model] | str | os.PathLike[str],
        *,
        labels: tuple[str, ...] | list[str] = (),
        warmup: Any = None,
        estimated_bytes: int | None = None,
        safe_mode: bool = True,
        checkpoint: str | os.PathLike[str] | None = None,
        strict: bool = True,
    ) -> VersionStatus:
        """Load a version, isolated and warmed up, and make it routable.

        The model is built in a child session of its own, under fresh layer
        names and the scopes ``name/v<version>``, so variables get the paths
        ``name/v<version>/<layer>/...``, identical across versions. Its serving
        path is traced and called once before any request can reach it. The
        first version of a name becomes its default.

        Args:
            name: The model's name (no ``/``).
            version: A version number not loaded yet.
            source: A zero-argument callable returning a Keras model, or the
                path of a ``.keras`` file.
            labels: Labels to point at this version once it is ready.
            warmup: A sample input (batch of any size) that fixes the serving
                signature and is run once. Optional for models that know their
                inputs (functional, Sequential).
            estimated_bytes: The bytes the version will hold, if known, to check
                the budget before building. Read from the archive for files.
            safe_mode: Keras ``safe_mode`` for files (refuses arbitrary code in
                lambdas); turn off only for files you trust.
            checkpoint: A checkpoint prefix, or a directory (its latest
                checkpoint), to restore into the built model before warm-up.
                A model that is not built yet (subclassed, or ``Sequential``
                without an ``Input``) is first called once on ``warmup``.
                Checked first (CRCs, object match; see
                :func:`restore_checkpoint`); an optimizer's values are skipped
                when the factory's model has none.
            strict: Refuse a checkpoint that does not match the model.

        Returns:
            The new version's :class:`VersionStatus`.

        Raises:
            ValueError: A bad name or version, or the version is already loaded.
            FileNotFoundError: ``source`` is a path that does not exist.
            BudgetExceededError: The version cannot fit; nothing changed.
            CheckpointError: The checkpoint is missing, truncated, corrupt or
                does not match; the partial model was disposed and nothing else
                changed.
            LoadError: The factory, the file or the warm-up failed; the partial
                model was disposed and nothing else changed.
        """
        name, version = _check_name(name), _check_version(version)
        prefix = latest_checkpoint(checkpoint) if checkpoint is not None else None
        labels = tuple(labels)
        for label in labels:
            _check_label(label)
        factory, estimate = self._factory(source, safe_mode)
        estimate = estimated_bytes if estimated_bytes is not None else estimate
        with self._administering():
            self._check_open()
            entry = self._entries.get(name)
            if entry is not None and version in entry.versions:
                raise ValueError(
                    f"{name!r} version {version} is already loaded; unload it first or "
                    "load another version number."
                )
            with self._cond:
                self._loading.add((name, version))
            try:
                self._make_room(name, estimate or 0, extra_versions=1)
                loaded = self._run_load(
                    lambda: self._build(name, version, factory, warmup, prefix, strict)
                )
                try:
                    self._make_room(name, 0, extra_versions=0, exclude=loaded)
                except BudgetExceededError:
                    loaded.session.close()
                    raise
            finally:
                with self._cond:
                    self._loading.discard((name, version))
                    self._cond.notify_all()
            with self._cond:
                entry = self._entries.setdefault(name, _Entry())
                entry.versions[version] = loaded
                loaded.state = VersionState.READY
                if entry.default is None or entry.default not in _ready(entry):
                    entry.default = version
                for label in labels:
                    entry.labels[label] = version
                self._cond.notify_all()
            return self._status(name, entry, loaded)

    def _factory(
        self, source: Any, safe_mode: bool
    ) -> tuple[Callable[[], keras.Model], int | None]:
        if callable(source):
            return source, None
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"No saved model at {path!r}: nothing was loaded.")

            def from_file() -> keras.Model:
                return keras.models.load_model(path, compile=False, safe_mode=safe_mode)

            return from_file, _weights_bytes(path)
        raise TypeError(
            "`source` must be a zero-argument callable returning a Keras model or the "
            f"path of a .keras file. Received: {source!r}"
        )

    def _run_load(self, build: Callable[[], _Version]) -> _Version:
        """``build()`` on the loader thread in the caller's build scope, or here."""
        if self._loader is None:
            return build()
        scope = _tf.capture_build_scope()

        def in_scope() -> _Version:
            with scope():
                return build()

        return self._loader.run(in_scope)

    def _build(
        self,
        name: str,
        version: int,
        factory: Callable[[], keras.Model],
        warmup: Any,
        checkpoint: str | None,
        strict: bool,
    ) -> _Version:
        session = LifecycleSession(
            cleanup=CleanupStrategy.ON_SESSION_CLOSE,
            name=f"{self.name}/{name}/v{version}",
            parent=self._session,
            clear_session=False,
        )
        loaded = _Version(name=name, version=version, session=session)
        started = time.perf_counter()
        stage = "factory"
        try:
            with session.activate(), _tf.isolated_names(name, f"v{version}"):
                model = factory()
                if not isinstance(model, keras.Model):
                    raise TypeError(
                        f"the factory returned {type(model).__qualname__}, not a keras.Model"
                    )
                model = manage(model, session=session)
                sample = warmup if warmup is not None else _sample_from_inputs(model)
                if checkpoint is not None:
                    if not model.built:
                        # A checkpoint restores only into variables that exist.
                        stage = "build"
                        if sample is None:
                            raise ValueError(
                                "the model is not built and does not know its inputs: pass "
                                "warmup=<a sample input> to build it before the restore"
                            )
                        model(sample)
                    stage = "checkpoint restore"
                    restore_checkpoint(model, checkpoint, strict=strict)
                stage = "warm-up"
                if sample is None:
                    raise ValueError(
                        "the model does not know its inputs: pass warmup=<a sample input>"
                    )
                serve = serving_function(model, _specs(sample))
                serve(sample)
        except CheckpointError:
            session.close()
            raise
        except Exception as error:
            session.close()
            raise LoadError(
                f"Loading {name!r} version {version} failed in its {stage}: "
                f"{type(error).__name__}: {error}. The partial model was disposed; the "
                "registry is unchanged."
            ) from error
        loaded.model, loaded.serve = model, serve
        loaded.nbytes = model.owned_bytes
        loaded.load_seconds = time.perf_counter() - started
        return loaded

    # -- budget --------------------------------------------------------------------

    def _make_room(
        self, name: str, nbytes: int, *, extra_versions: int, exclude: _Version | None = None
    ) -> None:
        """Evict least-recently-used versions so that a load fits, or refuse it."""
        with self._cond:
            loaded = [v for e in self._entries.values() for v in e.versions.values()]
            resident = sum(v.nbytes for v in loaded) + (exclude.nbytes if exclude else 0)
            count = len(loaded) + extra_versions + (1 if exclude else 0)
            budget, cap = self.memory_budget, self.max_loaded

            def fits(freed_bytes: int, freed_versions: int) -> bool:
                return (budget is None or resident + nbytes - freed_bytes <= budget) and (
                    cap is None or count - freed_versions <= cap
                )

            if fits(0, 0):
                return
            plan: list[_Version] = []
            freed = 0
            for candidate in sorted(self._evictable(name), key=lambda v: v.last_used):
                plan.append(candidate)
                freed += candidate.nbytes
                if fits(freed, len(plan)):
                    break
            else:
                raise BudgetExceededError(
                    f"Cannot load {name!r}: {resident + nbytes} bytes in "
                    f"{count} versions would exceed the registry's limits "
                    f"(memory_budget={budget}, max_loaded={cap}), and evicting every "
                    f"version the {self.swap_policy.name} policy allows frees only "
                    f"{freed} bytes. Nothing changed: unload a version or raise the budget."
                )
        for victim in plan:
            self._retire(victim, wait=True)

    def _evictable(self, name: str) -> list[_Version]:
        """Ready versions no label or route points to (defaults only if resource-preserving)."""
        found = []
        for entry_name, entry in self._entries.items():
            pinned = set(entry.labels.values()) | {
                target for target, _ in entry.route or () if isinstance(target, int)
            }
            for version in entry.versions.values():
                if version.state is not VersionState.READY or version.version in pinned:
                    continue
                if version.version == entry.default and not (
                    self.swap_policy is SwapPolicy.RESOURCE_PRESERVING and entry_name == name
                ):
                    continue
                found.append(version)
        return found

    # -- serving -------------------------------------------------------------------

    @contextlib.contextmanager
    def lease(
        self,
        name: str,
        *,
        version: int | None = None,
        label: str | None = None,
        key: str | bytes | int | None = None,
    ) -> Iterator[ManagedModel]:
        """Hold a version of a model for the duration of a ``with`` block.

        The version is chosen by, in order: ``version``, ``label``, the model's
        route (sticky for a ``key``), its default. It is not disposed while the
        lease is held, even if it is unloaded meanwhile. Taking and returning a
        lease are safe points of the registry's session.

        Raises:
            UnknownModelError: No such model, version or label.
            UnavailableError: No routable version appeared within ``lease_timeout``.
        """
        loaded = self._acquire(name, version, label, key)
        try:
            yield loaded.model  # type: ignore[misc]
        finally:
            self._release(loaded)

    def predict(
        self,
        name: str,
        inputs: Any,
        *,
        key: str | bytes | int | None = None,
        version: int | None = None,
        label: str | None = None,
    ) -> Any:
        """Run a version's traced serving function on ``inputs`` (thread-safe, fast).

        Chooses the version as :meth:`lease` does; returns the model's output
        tensors.
        """
        loaded = self._acquire(name, version, label, key)
        try:
            return loaded.serve(inputs)  # type: ignore[misc]
        finally:
            self._release(loaded)

    def _acquire(self, name: str, version: int | None, label: str | None, key: Any) -> _Version:
        if key is not None:
            check_key(key)
        self._session.safe_point()
        deadline = None
        with self._cond:
            while True:
                loaded = self._resolve(name, version, label, key)
                if loaded is not None:
                    loaded.leases += 1
                    self._in_flight += 1
                    loaded.requests += 1
                    loaded.last_used = time.monotonic()
                    return loaded
                if deadline is None:
                    timeout = self.lease_timeout
                    deadline = None if timeout is None else time.monotonic() + timeout
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise UnavailableError(
                        f"No routable version of {name!r} appeared within "
                        f"{self.lease_timeout} s (a swap may be in progress). Retry later."
                    )
                self._cond.wait(remaining)

    def _resolve(
        self, name: str, version: int | None, label: str | None, key: Any
    ) -> _Version | None:
        """The routable version for a request, None to wait, or raise if unknown."""
        self._check_open()
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
            chosen = pick(entry.route, key)
            target = entry.version_of(chosen)
        else:
            target = entry.default
        loaded = entry.versions.get(target) if target is not None else None
        if loaded is not None and loaded.state is VersionState.READY:
            return loaded
        if version is not None and (name, version) not in self._loading:
            # An explicit version is waited for only while it loads.
            raise UnknownModelError(
                f"{name!r} has no version {version} ready to serve. Ready: {_ready(entry)}"
            )
        return None

    def _release(self, loaded: _Version) -> None:
        with self._cond:
            loaded.leases -= 1
            self._in_flight -= 1
            drained = loaded.state is VersionState.RETIRING and loaded.leases == 0
            if drained:
                self._cond.notify_all()
        if drained:
            # The last lease of a retired version: dispose it off this request.
            self._session.cleaner.enqueue(lambda: self._dispose(loaded))
        self._session.safe_point()

    # -- swaps, labels, routes ------------------------------------------------------

    def promote(self, name: str, version: int) -> None:
        """Make a ready version the model's default (where unrouted requests go).

        Raises:
            UnknownModelError: No such model or ready version.
        """
        with self._cond:
            entry, _ = self._ready_version(name, version)
            entry.default = version
            self._cond.notify_all()

    def set_label(self, name: str, label: str, version: int) -> None:
        """Point ``label`` (e.g. ``"stable"``, ``"canary"``) at a ready version.

        Raises:
            ValueError: A bad label.
            UnknownModelError: No such model or ready version.
        """
        _check_label(label)
        with self._cond:
            entry, _ = self._ready_version(name, version)
            entry.labels[label] = version
            self._cond.notify_all()

    def route(self, name: str, weights: Mapping[str | int, float] | None) -> None:
        """Split a model's unpinned traffic by weight among labels and versions.

        Requests with the same ``key`` always go to the same target (a stable
        hash, the same in every process). ``None`` removes the route.

        Raises:
            TypeError, ValueError: Bad weights (negative, not numbers, no
                positive total).
            UnknownModelError: A target that is not a label or ready version.
        """
        with self._cond:
            entry = self._entry(name)
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
                    self._ready_version(name, _check_version(target))
            entry.route = pairs
            self._cond.notify_all()

    def unload(self, name: str, version: int, *, wait: bool = False) -> None:
        """Retire a version: no new leases; disposed once its leases drain.

        Args:
            name: The model.
            version: The version to retire.
            wait: Block until the version is disposed (up to ``drain_timeout``).

        Raises:
            UnknownModelError: No such model or version.
            ValueError: The version is the default while others are ready, or a
                label or route points to it: re-point them first.
        """
        with self._cond:
            entry = self._entry(name)
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
            others = [v for v in _ready(entry) if v != version]
            if version == entry.default and others:
                raise ValueError(
                    f"{name!r} version {version} is the default; promote another version "
                    f"({others}) before unloading it."
                )
        self._retire(loaded, wait=wait)

    def _retire(self, loaded: _Version, *, wait: bool) -> None:
        with self._cond:
            drained = False
            if loaded.state is VersionState.READY:
                loaded.state = VersionState.RETIRING
                entry = self._entries[loaded.name]
                if entry.default == loaded.version:
                    entry.default = None
                drained = loaded.leases == 0
        if drained:
            self._dispose(loaded)
        elif wait:
            # Also when an earlier unload already retired it: wait for the drain.
            with self._cond:
                self._cond.wait_for(
                    lambda: loaded.state is VersionState.UNLOADED, self.drain_timeout
                )

    def _dispose(self, loaded: _Version) -> None:
        loaded.session.close()
        with self._cond:
            loaded.state = VersionState.UNLOADED
            entry = self._entries.get(loaded.name)
            if entry is not None and entry.versions.get(loaded.version) is loaded:
                del entry.versions[loaded.version]
                if not entry.versions:
                    del self._entries[loaded.name]
            loaded.model = loaded.serve = None
            self._cond.notify_all()

    # -- version directories ---------------------------------------------------------

    def watch(
        self,
        name: str,
        base_path: str | os.PathLike[str],
        factory: Callable[[], keras.Model],
        *,
        policy: VersionPolicy | None = None,
        warmup: Any = None,
        strict: bool = True,
        poll_interval: float | None = None,
    ) -> ScanReport:
        """Serve the versions of ``name`` found under ``base_path``, and scan it now.

        ``base_path`` holds one directory of checkpoints per version,
        ``<base_path>/<version>/`` (TensorFlow Serving's layout; a
        :class:`CheckpointKeeper` writing to ``<base_path>/7`` makes version 7).
        Each :meth:`scan` loads the versions the policy wants and does not have
        yet (the factory builds the model, the version's latest checkpoint is
        restored into it), makes the newest wanted version the default, and
        retires the versions this watch loaded that left the policy, through
        the normal drain.

        Args:
            name: The model's name.
            base_path: The directory of version directories.
            factory: Builds a fresh, untrained model of the right architecture.
            policy: Which versions to serve; :meth:`VersionPolicy.latest` by default.
            warmup: Sample input for the serving path (see :meth:`load`).
            strict: Refuse checkpoints that do not match the model.
            poll_interval: Also scan every this many seconds, on a thread of
                the registry's, until :meth:`unwatch` or :meth:`close`
                (TensorFlow Serving's file-system polling). ``None``: scan only
                when :meth:`scan` is called. :meth:`last_scan` has the latest
                report.

        Returns:
            The first scan's :class:`ScanReport`.

        Raises:
            CheckpointError: ``base_path`` is not a directory; nothing changed.
            ValueError: ``name`` is already watched, or a bad argument.
        """
        name = _check_name(name)
        if not callable(factory):
            raise TypeError(f"`factory` must be a zero-argument callable. Received: {factory!r}")
        policy = VersionPolicy.latest() if policy is None else policy
        if not isinstance(policy, VersionPolicy):
            raise TypeError(f"`policy` must be a VersionPolicy. Received: {policy!r}")
        if poll_interval is not None:
            poll_interval = check_timeout(poll_interval, "poll_interval")
            if not poll_interval:
                raise ValueError("`poll_interval` must be > 0 seconds or None.")
        base = os.path.abspath(os.fspath(base_path))
        available_versions(base)  # fail now on a missing directory
        with self._administering():
            self._check_open()
            if name in self._sources:
                raise ValueError(
                    f"{name!r} already watches {self._sources[name].base!r}; unwatch() it first."
                )
            source = Source(base, factory, policy, warmup, strict, poll_interval)
            self._sources[name] = source
        report = self.scan(name)
        if poll_interval is not None:
            source.thread = threading.Thread(
                target=self._poll,
                args=(name, source),
                name=f"lifecycle-watch-{self.name}-{name}",
                daemon=True,
            )
            source.thread.start()
        return report

    def _poll(self, name: str, source: Source) -> None:
        assert source.poll_interval is not None
        while not source.stop.wait(source.poll_interval):
            try:
                self.scan(name)
            except (UnknownModelError, LifecycleError) as error:
                if self._closed or self._sources.get(name) is not source:
                    return  # unwatched or closed meanwhile
                source.last_error = f"{type(error).__name__}: {error}"
            except Exception as error:  # keep polling: the next scan may succeed
                source.last_error = f"{type(error).__name__}: {error}"

    def last_scan(self, name: str) -> ScanReport | None:
        """The report of the latest scan of ``name``'s base path (``None`` before one).

        Raises:
            UnknownModelError: ``name`` is not watched.
        """
        source = self._sources.get(name)
        if source is None:
            raise UnknownModelError(f"{name!r} is not watched. Watched: {sorted(self._sources)}")
        return source.last

    def unwatch(self, name: str) -> None:
        """Stop watching ``name``'s base path; its loaded versions stay loaded.

        Raises:
            UnknownModelError: ``name`` is not watched.
        """
        with self._administering():
            source = self._sources.pop(name, None)
            if source is None:
                raise UnknownModelError(
                    f"{name!r} is not watched. Watched: {sorted(self._sources)}"
                )
        source.halt()

    def scan(self, name: str) -> ScanReport:
        """Bring ``name``'s loaded versions in line with its watched base path.

        Under ``AVAILABILITY_PRESERVING``, new versions load before old ones
        retire, and old ones retire only once a wanted version is ready (if
        every new version fails, the old ones keep serving); under
        ``RESOURCE_PRESERVING``, versions that left the policy retire first.
        A version that fails to load (a corrupt checkpoint, a failing factory)
        is reported in :attr:`ScanReport.failed` and does not stop the others.

        Raises:
            UnknownModelError: ``name`` is not watched.
            CheckpointError: The base path disappeared; nothing changed.
        """
        with self._administering():
            self._check_open()
            source = self._sources.get(name)
            if source is None:
                raise UnknownModelError(
                    f"{name!r} is not watched. Watched: {sorted(self._sources)}"
                )
            available = available_versions(source.base)
            wanted = source.policy.select(available)
            with self._cond:
                entry = self._entries.get(name)
                present = set(entry.versions) if entry is not None else set()
            # A version unloaded by hand is the registry's business, not ours.
            source.served &= present
            leaving = sorted(source.served - wanted)
            retired: list[int] = []
            if self.swap_policy is SwapPolicy.RESOURCE_PRESERVING:
                retired += self._retire_leaving(name, leaving, wanted)
            loaded, failed = [], []
            for version in sorted(wanted - present):
                try:
                    self.load(
                        name,
                        version,
                        source.factory,
                        warmup=source.warmup,
                        checkpoint=os.path.join(source.base, str(version)),
                        strict=source.strict,
                    )
                except (LoadError, CheckpointError, BudgetExceededError) as error:
                    failed.append((version, f"{type(error).__name__}: {error}"))
                else:
                    loaded.append(version)
                    source.served.add(version)
            with self._cond:
                entry = self._entries.get(name)
                ready = [v for v in sorted(wanted) if entry and v in _ready(entry)]
                if ready and (entry.default is None or entry.default < ready[-1]):
                    entry.default = ready[-1]
                    self._cond.notify_all()
            if self.swap_policy is SwapPolicy.AVAILABILITY_PRESERVING and ready:
                # Only once a wanted version serves: if every new one failed,
                # the old ones keep serving until a later scan succeeds.
                retired += self._retire_leaving(name, leaving, wanted)
            with self._cond:
                entry = self._entries.get(name)
                default = entry.default if entry is not None else None
            source.last = ScanReport(
                name=name,
                available=tuple(available),
                wanted=tuple(sorted(wanted)),
                loaded=tuple(loaded),
                retired=tuple(retired),
                failed=tuple(failed),
                default=default,
            )
            source.last_error = None
            return source.last

    def _retire_leaving(self, name: str, leaving: list[int], wanted: frozenset[int]) -> list[int]:
        """Retire versions that left a watch's policy; labels and routes on them go too."""
        source = self._sources[name]
        retired = []
        for version in leaving:
            with self._cond:
                entry = self._entries.get(name)
                loaded = entry.versions.get(version) if entry is not None else None
                if loaded is None or loaded.state is not VersionState.READY:
                    source.served.discard(version)
                    continue
                for label in [k for k, v in entry.labels.items() if v == version]:
                    del entry.labels[label]
                if entry.route is not None and any(
                    entry.version_of(target) == version for target, _ in entry.route
                ):
                    entry.route = None
                if entry.default == version:
                    others = [v for v in _ready(entry) if v in wanted]
                    entry.default = others[-1] if others else None
            self._retire(loaded, wait=False)
            source.served.discard(version)
            retired.append(version)
        return retired

    # -- status and close ------------------------------------------------------------

    def statistics(self) -> RegistryStatistics:
        """A frozen snapshot of the whole registry (per version: :meth:`status`)."""
        versions = self.status()
        resident = [v for v in versions if v.state is not VersionState.LOADING]
        return RegistryStatistics(
            name=self.name,
            models=len({v.name for v in versions}),
            versions=len(resident),
            loading=len(versions) - len(resident),
            bytes=sum(v.bytes for v in resident),
            memory_budget=self.memory_budget,
            leases=sum(v.leases for v in resident),
            requests=sum(v.requests for v in resident),
            watched=len(self._sources),
            load_pauses=self._loader.pauses if self._loader is not None else 0,
            session=self._session.statistics(),
        )

    def status(self, name: str | None = None) -> tuple[VersionStatus, ...]:
        """Frozen status of every loaded or loading version (of ``name``), by name and version.

        Raises:
            UnknownModelError: ``name`` is given and nothing of it is loaded or loading.
        """
        with self._cond:
            if name is not None and not any(n == name for n, _ in self._loading):
                self._entry(name)  # raises for an unknown name
            loaded = [
                self._status(n, entry, v)
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

    def close(self) -> None:
        """Unload every version (waiting for leases up to ``drain_timeout``) and close.

        Safe to call twice.
        """
        for source in list(self._sources.values()):
            source.halt()  # outside the lock: a scan in progress needs it
        with self._administering():
            if self._closed:
                return
            with self._cond:
                versions = [v for e in self._entries.values() for v in e.versions.values()]
                for entry in self._entries.values():
                    entry.labels.clear()
                    entry.route = None
            self._sources.clear()
            for loaded in versions:
                self._retire(loaded, wait=True)
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._session.close()
            if self._loader is not None:
                self._loader.close()

    # -- helpers -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _administering(self) -> Iterator[None]:
        """The admin lock, refused on the loader thread (its caller holds the lock)."""
        if self._loader is not None and self._loader.on_thread():
            raise LifecycleError(
                f"ModelRegistry {self.name!r}: code running in a load (a factory, a "
                "checkpoint restore or a warm-up) cannot load, unload, watch or close "
                "versions of the registry loading it; do that after load() returns."
            )
        with self._admin:
            yield

    def _check_open(self) -> None:
        if self._closed:
            raise LifecycleError(f"ModelRegistry {self.name!r} is closed.")

    def _entry(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownModelError(
                f"No model named {name!r} is loaded. Loaded: {sorted(self._entries)}"
            )
        return entry

    def _ready_version(self, name: str, version: int) -> tuple[_Entry, _Version]:
        entry = self._entry(name)
        loaded = entry.versions.get(version)
        if loaded is None or loaded.state is not VersionState.READY:
            raise UnknownModelError(
                f"{name!r} has no ready version {version}. Ready: {_ready(entry)}"
            )
        return entry, loaded

    def _status(self, name: str, entry: _Entry, loaded: _Version) -> VersionStatus:
        weight = None
        if entry.route is not None:
            total = sum(w for _, w in entry.route)
            weight = (
                sum(w for target, w in entry.route if entry.version_of(target) == loaded.version)
                / total
            )
        return VersionStatus(
            name=name,
            version=loaded.version,
            state=loaded.state,
            default=entry.default == loaded.version,
            labels=tuple(sorted(lb for lb, v in entry.labels.items() if v == loaded.version)),
            weight=weight,
            leases=loaded.leases,
            bytes=loaded.nbytes,
            load_seconds=loaded.load_seconds,
            requests=loaded.requests,
        )


def _ready(entry: _Entry) -> list[int]:
    return sorted(v for v, loaded in entry.versions.items() if loaded.state is VersionState.READY)


def _check_label(label: Any) -> str:
    if not isinstance(label, str) or not label:
        raise ValueError(f"A label must be a non-empty string. Received: label={label!r}")
    return label
