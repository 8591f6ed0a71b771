"""ModelRegistry: versions, leases, hot swap, A/B routing and a memory budget.

The registry is a coordinator. Every loaded version lives in a child session of
the registry's own session; the work is done by the modules beside this one:

* ``_building``: a source becomes a managed, restored, warmed-up version;
* ``_table``: the versions, and which one each request leases (labels, routes);
* ``_retiring``: retired versions drain, then are disposed, or come back
  when the load they made room for fails;
* ``_watching``: base paths of version directories, scanned and polled;
* ``_repository``: model repositories, each model a watched base path;
* ``lifecycle._core.plan_eviction``: which versions to evict for a load to fit.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import keras

from .. import _tf
from .._checkpoints import latest_checkpoint
from .._core import (
    BatchingPolicy,
    Loader,
    check_foreground_bytes,
    check_gil_share,
    check_label,
    check_model_name,
    check_nice,
    check_optional_int,
    check_timeout,
    check_version,
    plan_eviction,
)
from .._core._policies import SwapPolicy, VersionPolicy
from .._model import ManagedModel
from .._session import LifecycleSession, freeze_heap
from ..errors import (
    BudgetExceededError,
    CheckpointError,
    LifecycleError,
    LoadError,
    UnknownModelError,
)
from ._building import build_version, factory_of, warmup_of
from ._lease import ServingLease
from ._repository import Repository, RepositoryReport, members_of
from ._retiring import Retirement, SetAside, pins_of
from ._signature import Inference, ServingSignature
from ._status import RegistryStatistics, VersionState, VersionStatus
from ._table import VersionTable
from ._version_dirs import available_versions
from ._versions import LoadedVersion
from ._watching import ScanReport, Watch, Watcher, require_notifications

__all__ = ["ModelRegistry"]


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
            requests keep their latency. ``1.0`` (default): no pauses. The
            pauses come from a profile hook (``sys.setprofile``) installed on
            the loader thread only, for the length of each load: profilers of
            other threads are untouched, but a ``sys.setprofile`` profiler of
            the loader thread (one set with ``threading.setprofile``, say) is
            replaced during loads, so loads do not show in it, and is put back
            after each; a factory that sets its own profile function ends the
            pauses for the rest of its load.
            With either option set, loads run on the loader thread, in the
            calling thread's dtype policy, device scope, ``tf.distribute``
            strategy and context variables; ``load()`` still returns when the
            version is ready. With neither, loads run on the calling thread.
        loader_foreground_bytes: With ``loader_nice`` or ``loader_gil_share``,
            versions known before their load to hold at most this many bytes
            load in the foreground instead: on the calling thread, at its
            priority, unpaced. The size is a SavedModel's variables or a
            ``.keras`` archive's weights on disk, or ``estimated_bytes``; a
            factory of unknown size loads in the background. The background
            protects requests' latency from large loads, but holds a small
            model back, for seconds under load, and the profile hook alone
            slows a load's Python work (``benchmarks/first_response.py``,
            ``docs/benchmarks.md#swap-to-first-response``). ``0`` (default):
            every load runs in the background. ``lifecycle serve`` uses 40 MiB (Keras's
            ``model.export()`` writes each variable twice: 20 MiB of weights).
        freeze_heap: On creation, collect once and ``gc.freeze()`` every
            surviving object (imports, warm-up), so that each collection after a
            swap only scans objects created since, not all of TensorFlow's and
            Keras's (``docs/registry.md``, a serving process). Process-wide;
            create the registry before the models it serves.

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

    memory_budget: int | None = attrs.field(
        default=None,
        kw_only=True,
        converter=lambda v: check_optional_int(v, "memory_budget", minimum=1),
    )
    max_loaded: int | None = attrs.field(
        default=None,
        kw_only=True,
        converter=lambda v: check_optional_int(v, "max_loaded", minimum=1),
    )
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
    loader_foreground_bytes: int = attrs.field(
        default=0,
        kw_only=True,
        converter=lambda v: check_foreground_bytes(v, "loader_foreground_bytes"),
    )
    freeze_heap: bool = attrs.field(default=False, kw_only=True)
    # The owner of every version's session.
    _session: LifecycleSession = attrs.field(init=False, repr=False)
    # None: loads run on the calling thread.
    _loader: Loader | None = attrs.field(default=None, init=False, repr=False)
    _table: VersionTable = attrs.field(init=False, repr=False)
    _retirement: Retirement = attrs.field(init=False, repr=False)
    _watcher: Watcher = attrs.field(init=False, repr=False)
    # Watched model repositories by absolute path; their models are watches of `_watcher`.
    _repositories: dict[str, Repository] = attrs.field(factory=dict, init=False, repr=False)
    # Serialises load/unload/watch/close bookkeeping that spans a build.
    _admin: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._session = LifecycleSession(name=self.name)
        self._table = VersionTable(self.name)
        self._retirement = Retirement(
            self._table,
            self._session.cleaner.enqueue,
            self.drain_timeout,
            lambda build, nbytes: self._run_load(build, nbytes),
        )
        # The scans account for what they retired themselves: their loads do not
        # add "The registry is unchanged." to a failure.
        self._watcher = Watcher(
            self.name,
            self._table,
            self._retirement,
            functools.partial(self._load, scanning=True),
            self.swap_policy,
        )
        if self.loader_nice is not None or self.loader_gil_share < 1:
            table = self._table
            self._loader = Loader(
                self.name,
                nice=self.loader_nice,
                gil_share=self.loader_gil_share,
                busy=lambda: table.in_flight > 0,
                foreground_bytes=self.loader_foreground_bytes,
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
        batching: BatchingPolicy | None = None,
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
            source: A zero-argument callable returning a Keras model, the
                path of a ``.keras`` file, or a SavedModel directory
                (``model.export(dir)``, ``tf.saved_model.save``). A SavedModel
                is served through its ``serving_default`` signature, as a
                functional model with one ``keras.Input`` per signature input
                (named as in the signature) and a dict of the signature's
                named outputs; its variables are released at unload like any
                Keras model's.
            labels: Labels to point at this version once it is ready, in
                TensorFlow Serving's syntax, ``[a-zA-Z0-9_]+`` (one rule for the
                registry, the server and config files: ``_core._checks.check_label``).
            warmup: A sample input (batch of any size) that fixes the serving
                signature and is run once. Optional for models that know their
                inputs (functional, Sequential, SavedModels): they warm up on
                zeros of batch 1. A SavedModel with TensorFlow Serving's
                ``assets.extra/tf_serving_warmup_requests`` replays that file's
                predict requests instead (needs ``keras-lifecycle[serve]``).
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
            batching: Merge concurrent requests to this version into one call
                of its serving function (:class:`BatchingPolicy`); each caller
                still holds its own lease and gets exactly its own rows.
                ``None`` (the default): one call per request.

        Returns:
            The new version's :class:`VersionStatus`.

        A load that fails after evicting versions to make room (the
        resource-preserving policy evicts before it builds) brings them back
        before raising: a version still draining is made routable again, a
        disposed one is built again from its source. The error's message says
        which came back, and which could not and are no longer loaded.

        Raises:
            ValueError: A bad name or version, or the version is already loaded.
            FileNotFoundError: ``source`` is a path that does not exist, or a
                directory without a complete SavedModel.
            BudgetExceededError: The version cannot fit; the versions evicted
                for it were brought back, as the message says.
            CheckpointError: The checkpoint is missing, truncated, corrupt or
                does not match; the partial model was disposed and the versions
                evicted for it were brought back, as the message says.
            LoadError: The factory, the file or the warm-up failed; likewise.
                Also a warm-up file that cannot be read, before anything
                happens (its message names ``pip install "keras-lifecycle[serve]"``
                when ``tensorflow-serving-api`` is missing).

        Example:
            >>> import tempfile, keras, numpy as np
            >>> inputs = keras.Input((4,), name="features")
            >>> exported = keras.Model(inputs, keras.layers.Dense(1)(inputs))
            >>> path = tempfile.mkdtemp() + "/risk/1"
            >>> exported.export(path, verbose=False)
            >>> with lc.ModelRegistry() as registry:
            ...     _ = registry.load("risk", 1, path)
            ...     out = registry.predict("risk", {"features": np.zeros((2, 4), "float32")})
            >>> sorted(out)
            ['output_0']
        """
        return self._load(
            name,
            version,
            source,
            labels=labels,
            warmup=warmup,
            estimated_bytes=estimated_bytes,
            safe_mode=safe_mode,
            checkpoint=checkpoint,
            strict=strict,
            batching=batching,
            scanning=False,
        )

    def _load(
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
        batching: BatchingPolicy | None = None,
        scanning: bool,
        rollback: Callable[[], None] | None = None,
    ) -> VersionStatus:
        """:meth:`load`, for a scan too (the arguments are :meth:`load`'s, and two more).

        With ``scanning``, a failure does not claim the registry unchanged: the
        scan may have retired versions before the load (``RESOURCE_PRESERVING``)
        and says what became of them. ``rollback`` runs when the load fails,
        after the versions the load evicted are back and before requests
        waiting for the version wake: the scan brings back what it retired.
        """
        name, version = check_model_name(name), check_version(version)
        if batching is not None and not isinstance(batching, BatchingPolicy):
            raise TypeError(f"`batching` must be a BatchingPolicy or None. Received: {batching!r}")
        prefix = latest_checkpoint(checkpoint) if checkpoint is not None else None
        labels = tuple(check_label(label) for label in labels)
        factory, estimate = factory_of(source, safe_mode)
        if warmup is None:
            warmup = warmup_of(source, name, version)
        estimate = estimated_bytes if estimated_bytes is not None else estimate

        def build() -> LoadedVersion:
            built = build_version(
                self._session,
                name,
                version,
                factory,
                warmup=warmup,
                checkpoint=prefix,
                strict=strict,
                batching=batching,
            )
            built.rebuild = build
            return built

        with self._administering():
            self._table.check_open()
            self._watcher.release(name, version)
            self._table.begin_load(name, version)
            evicted = SetAside()
            try:
                evicted = self._make_room(name, estimate or 0)
                loaded = self._run_load(build, estimate)
                try:
                    self._make_room(name, loaded.nbytes)
                except BudgetExceededError:
                    loaded.session.close()
                    raise
            except LifecycleError as error:
                # Load, checkpoint and budget errors: undo what this load changed.
                account = self._bring_back(evicted)
                if rollback is not None:
                    rollback()
                if not account and isinstance(error, LoadError) and not scanning:
                    account = "The registry is unchanged."
                if account:
                    error.args = (f"{error.args[0]} {account}",)
                raise
            finally:
                self._table.end_load(name, version)
            return self._table.add_ready(loaded, labels)

    def _run_load(self, build: Callable[[], LoadedVersion], nbytes: int | None) -> LoadedVersion:
        """``build()`` on the loader thread in the caller's build scope, or here.

        ``nbytes``: the bytes the version will hold, if known; a small version
        loads here (see ``loader_foreground_bytes``).
        """
        loader = self._loader
        if loader is None:
            return build()
        if loader.in_foreground(nbytes):
            return loader.run(build, nbytes=nbytes)  # on this thread, in its own scope
        scope = _tf.capture_build_scope()

        def in_scope() -> LoadedVersion:
            with scope():
                return build()

        return loader.run(in_scope, nbytes=nbytes)

    def _make_room(self, name: str, nbytes: int) -> SetAside:
        """Evict least-recently-used versions so that one more of ``nbytes`` fits, or refuse.

        Returns:
            The versions evicted (retired and, once drained, disposed), and
            what pointed at their models before.
        """
        plan = plan_eviction(
            self._table.residents(),
            model=name,
            incoming_bytes=nbytes,
            incoming_versions=1,
            memory_budget=self.memory_budget,
            max_loaded=self.max_loaded,
            evict_own_default=self.swap_policy is SwapPolicy.RESOURCE_PRESERVING,
        )
        if not plan.fits:
            raise BudgetExceededError(
                f"Cannot load {name!r}: {plan.resident_bytes} bytes in "
                f"{plan.versions} versions would exceed the registry's limits "
                f"(memory_budget={self.memory_budget}, max_loaded={self.max_loaded}), and "
                f"evicting every version the {self.swap_policy.name} policy allows frees "
                f"only {plan.freeable_bytes} bytes. Nothing changed: unload a version or "
                "raise the budget."
            )
        victims: list[LoadedVersion] = list(plan.victims)  # type: ignore[arg-type]
        aside = SetAside(tuple(victims), pins_of(self._table, (v.name for v in victims)))
        for victim in victims:
            self._retirement.retire(victim, wait=True)
        return aside

    def _bring_back(self, evicted: SetAside) -> str:
        """Restore the versions evicted for a load that failed; what happened, in words.

        A version still draining is made routable again; a disposed one is
        built again from its source; the default of its model is put back.
        Returns ``""`` when nothing was evicted.
        """
        if not evicted.versions:
            return ""
        comeback = self._retirement.bring_back(evicted)
        back = [f"{name!r} version {version}" for name, version in comeback.back]
        lost = [f"{name!r} version {version} ({why})" for name, version, why in comeback.lost]
        words = ""
        if back:
            words = f"The versions evicted to make room were loaded again: {', '.join(back)}."
        if lost:
            words += (
                f"{' ' if words else ''}Evicted to make room and could not be loaded again, "
                f"so no longer loaded: {'; '.join(lost)}."
            )
        if comeback.unrestored:
            words += f" Not put back: {', '.join(comeback.unrestored)}."
        return words

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
        """Hold a version of a model for the duration of a ``with`` block; yields the model.

        The lease of :meth:`serving`, handing out the model itself for any
        Keras call; a request runs on :meth:`serving`. The version is chosen
        by, in order: ``version``, ``label``, the model's route (sticky for a
        ``key``), its default. It is not disposed while the lease is held, even
        if it is unloaded meanwhile. Taking and returning a lease are safe
        points of the registry's session.

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

        The lease of :meth:`serving` around the function called with ``inputs``
        as they are (a tensor, an array or a dict): returns its output tensors,
        unchecked. :meth:`infer` checks named inputs and returns NumPy arrays.
        """
        loaded = self._acquire(name, version, label, key)
        try:
            return loaded.serve(inputs)  # type: ignore[misc]
        finally:
            self._release(loaded)

    def infer(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        key: str | bytes | int | None = None,
        version: int | None = None,
        label: str | None = None,
    ) -> Inference:
        """Run a version's serving function on named inputs; get named outputs.

        :meth:`serving` and its lease's ``infer`` in one call. The names are
        the version's :meth:`signature`. Each input is checked against it
        (name, dtype, shape) before anything runs.

        Args:
            name: The model.
            inputs: ``{input name: array-like}``; every input of the signature.
            key: A sticky routing key (see :meth:`route`).
            version: Serve this version.
            label: Serve the version this label points to.

        Returns:
            An :class:`Inference` with the outputs as NumPy arrays.

        Raises:
            ValueError: An input is missing, unknown, or of the wrong shape.
            TypeError: An input's values do not convert to its dtype.
            UnknownModelError: No such model, version or label.
            UnavailableError: No routable version appeared within ``lease_timeout``.

        Example:
            >>> import keras, lifecycle as lc
            >>> def factory():
            ...     x = keras.Input((2,), name="x")
            ...     return keras.Model(x, keras.layers.Dense(1)(x))
            >>> with lc.ModelRegistry() as registry:
            ...     _ = registry.load("risk", 1, factory)
            ...     registry.infer("risk", {"x": [[1.0, 2.0]]}).outputs["output_0"].shape
            (1, 1)
        """
        if not isinstance(inputs, Mapping):
            raise TypeError(
                f"`inputs` must be a mapping of input names to values. Received: {inputs!r}"
            )
        with self.serving(name, version=version, label=label, key=key) as lease:
            return lease.infer(inputs)

    @contextlib.contextmanager
    def serving(
        self,
        name: str,
        *,
        version: int | None = None,
        label: str | None = None,
        key: str | bytes | int | None = None,
    ) -> Iterator[ServingLease]:
        """Hold the version a request resolves to, for decoding, running and answering it.

        The one way to run a request (:meth:`infer`, :meth:`predict` and
        :meth:`lease` are its shorthands). The version is chosen once, as
        :meth:`lease` chooses it; the lease's
        ``signature`` is that version's, and its ``infer`` runs on that
        version. A server decodes a request against ``lease.signature`` and
        runs it with ``lease.infer`` in one ``with`` block, so that a route
        between versions whose inputs differ never decodes against one version
        and runs on another.

        Raises:
            UnknownModelError: No such model, version or label.
            UnavailableError: No routable version appeared within ``lease_timeout``.

        Example:
            >>> import keras, lifecycle as lc
            >>> def factory():
            ...     x = keras.Input((2,), name="x")
            ...     return keras.Model(x, keras.layers.Dense(1)(x))
            >>> with lc.ModelRegistry() as registry:
            ...     _ = registry.load("risk", 1, factory)
            ...     with registry.serving("risk") as lease:
            ...         names = [spec.name for spec in lease.signature.inputs]
            ...         answer = lease.infer({names[0]: [[1.0, 2.0]]})
            ...     (lease.version, answer.outputs["output_0"].shape)
            (1, (1, 1))
        """
        loaded = self._acquire(name, version, label, key)
        try:
            assert loaded.signature is not None
            lease = ServingLease(name, loaded.version, loaded.signature, loaded=loaded)
            try:
                yield lease
            finally:
                lease._return()
        finally:
            self._release(loaded)

    def peek(
        self, name: str, *, version: int | None = None, label: str | None = None
    ) -> tuple[int, dict[str, ServingSignature]]:
        """The version a request would get now, and its signatures, read together (no lease).

        For metadata: the version number and the signatures come from one
        resolution. Chooses the version as :meth:`lease` does, without a route key.

        Returns:
            The version, and its signatures by name, ``serving_default`` first
            (a SavedModel's every signature; one for other models).

        Raises:
            UnknownModelError: No such model, version or label.
            UnavailableError: No version is routable yet.
        """
        loaded = self._table.peek(name, version, label)
        return loaded.version, loaded.signatures

    def signature(
        self, name: str, *, version: int | None = None, label: str | None = None
    ) -> ServingSignature:
        """The serving signature of the version a request would get (no lease taken).

        Chooses the version as :meth:`lease` does, without a route key.

        Raises:
            UnknownModelError: No such model, version or label.
            UnavailableError: No version is routable yet.
        """
        signature = self._table.peek(name, version, label).signature
        assert signature is not None
        return signature

    def _acquire(
        self, name: str, version: int | None, label: str | None, key: Any
    ) -> LoadedVersion:
        self._session.cleaner.safe_point()
        return self._table.acquire(name, version, label, key, self.lease_timeout)

    def _release(self, loaded: LoadedVersion) -> None:
        self._retirement.lease_returned(loaded)
        self._session.cleaner.safe_point()

    # -- swaps, labels, routes ------------------------------------------------------

    def promote(self, name: str, version: int) -> None:
        """Make a ready version the model's default (where unrouted requests go).

        Raises:
            UnknownModelError: No such model or ready version.
        """
        self._table.promote(name, version)

    def set_label(self, name: str, label: str, version: int) -> None:
        """Point ``label`` (e.g. ``"stable"``, ``"canary"``) at a ready version.

        Raises:
            ValueError: ``label`` is not TensorFlow Serving's ``[a-zA-Z0-9_]+``.
            UnknownModelError: No such model or ready version.
        """
        self._table.set_label(name, check_label(label), version)

    def remove_label(self, name: str, label: str) -> None:
        """Remove ``label`` from ``name``; its version stays loaded and keeps its other labels.

        Requests that name the label fail with :class:`UnknownModelError` from
        then on. A version no label or route points to any more can be unloaded.

        Raises:
            UnknownModelError: No such model or label.
            ValueError: The model's route sends traffic through the label:
                change or remove the route first.

        Example:
            >>> import keras, lifecycle as lc
            >>> def factory():
            ...     x = keras.Input((2,))
            ...     return keras.Model(x, keras.layers.Dense(1)(x))
            >>> with lc.ModelRegistry() as registry:
            ...     _ = registry.load("risk", 1, factory, labels=["canary"])
            ...     registry.remove_label("risk", "canary")
            ...     registry.status("risk")[0].labels
            ()
        """
        self._table.remove_label(name, check_label(label))

    def route(self, name: str, weights: Mapping[str | int, float] | None) -> None:
        """Split a model's unpinned traffic by weight among labels and versions.

        Requests with the same ``key`` always go to the same target (a stable
        hash, the same in every process). ``None`` removes the route.

        Raises:
            TypeError, ValueError: Bad weights (negative, not numbers, no
                positive total).
            UnknownModelError: A target that is not a label or ready version.
        """
        self._table.route(name, weights)

    def unload(self, name: str, version: int, *, wait: bool = False) -> None:
        """Retire a version: no new leases; disposed once its leases drain.

        An unload holds: if ``name`` is watched, its scans do not load this
        version again until :meth:`load` loads it by hand (or the model is
        watched anew).

        Args:
            name: The model.
            version: The version to retire.
            wait: Block until the version is disposed (up to ``drain_timeout``).

        Raises:
            UnknownModelError: No such model or version.
            ValueError: The version is the default while others are ready, or a
                label or route points to it: re-point them first.
        """
        loaded = self._table.check_unloadable(name, version)
        self._watcher.hold(name, version)
        self._retirement.retire(loaded, wait=wait)

    # -- version directories ---------------------------------------------------------

    def watch(
        self,
        name: str,
        base_path: str | os.PathLike[str],
        factory: Callable[[], keras.Model] | None = None,
        *,
        policy: VersionPolicy | None = None,
        warmup: Any = None,
        strict: bool = True,
        poll_interval: float | None = None,
        batching: BatchingPolicy | None = None,
        notify: bool = False,
    ) -> ScanReport:
        """Serve the versions of ``name`` found under ``base_path``, and scan it now.

        ``base_path`` holds one directory per version, ``<base_path>/<version>/``
        (TensorFlow Serving's layout), with a SavedModel (``model.export(dir)``),
        one ``.keras`` archive, or checkpoints (a :class:`CheckpointKeeper`
        writing to ``<base_path>/7`` makes version 7). A version counts once it
        is complete, so a directory still being written (or written as
        ``.tmp-7`` and renamed) is never loaded half-way; names that are not
        integers are ignored. Each :meth:`scan` loads the versions the policy
        wants and does not have yet (a SavedModel or archive as :meth:`load`
        does; for checkpoints the factory builds the model and the version's
        latest checkpoint is restored into it), makes the newest wanted
        version the default when it loaded one (a default chosen with
        :meth:`promote`, a rollback say, stays until a newer version arrives),
        and retires the versions this watch loaded that left the policy,
        through the normal drain (a version of ``name`` loaded already when
        the watch starts, whose directory is under ``base_path``, counts as
        loaded by it: a model watched anew does not keep its old versions).
        A version unloaded by hand (:meth:`unload`) stays unloaded, and a
        version that failed to load is not tried again until a file in its
        directory changes: polling never loads a broken version at every
        interval. Failed loads and failed polls are logged (logger
        ``lifecycle.registry``), once each.

        Args:
            name: The model's name.
            base_path: The directory of version directories.
            factory: Builds a fresh, untrained model of the right architecture,
                for versions of checkpoints. ``None`` for directories of
                SavedModels and ``.keras`` archives: a version holding only
                checkpoints is then reported in :attr:`ScanReport.failed`.
            policy: Which versions to serve; :meth:`VersionPolicy.latest` by default.
            warmup: Sample input for the serving path (see :meth:`load`).
            strict: Refuse checkpoints that do not match the model.
            poll_interval: Also scan every this many seconds, on a thread of
                the registry's, until :meth:`unwatch` or :meth:`close`
                (TensorFlow Serving's file-system polling). ``None``: scan only
                when :meth:`scan` is called. :meth:`last_scan` has the latest
                report.
            batching: Batch each version's concurrent requests (see :meth:`load`).
            notify: Also scan as soon as an entry of ``base_path`` changes (a
                version directory created, renamed into place or removed), as
                the operating system reports it (inotify on Linux), rather than
                at the next poll: a new version is found in milliseconds, not
                up to ``poll_interval`` later. Polling goes on beside it (file
                systems that report nothing, NFS say). Needs ``watchfiles``
                (the ``serve`` extra).

        Returns:
            The first scan's :class:`ScanReport`.

        Raises:
            CheckpointError: ``base_path`` is not a directory; nothing changed.
            ValueError: ``name`` is already watched, or a bad argument.
            ImportError: ``notify`` without ``watchfiles``; the message names
                the ``pip install``.
        """
        name = check_model_name(name)
        if factory is not None and not callable(factory):
            raise TypeError(
                f"`factory` must be a zero-argument callable or None. Received: {factory!r}"
            )
        policy = VersionPolicy.latest() if policy is None else policy
        if not isinstance(policy, VersionPolicy):
            raise TypeError(f"`policy` must be a VersionPolicy. Received: {policy!r}")
        if poll_interval is not None:
            poll_interval = check_timeout(poll_interval, "poll_interval")
            if not poll_interval:
                raise ValueError("`poll_interval` must be > 0 seconds or None.")
        base = os.path.abspath(os.fspath(base_path))
        available_versions(base)  # fail now on a missing directory
        if batching is not None and not isinstance(batching, BatchingPolicy):
            raise TypeError(f"`batching` must be a BatchingPolicy or None. Received: {batching!r}")
        if notify:
            require_notifications()
        watch = Watch(
            base, factory, policy, warmup, strict, poll_interval, batching=batching, notify=notify
        )
        with self._administering():
            self._table.check_open()
            self._watcher.add(name, watch)
        report = self.scan(name)
        if poll_interval is not None or notify:
            self._watcher.start_polling(name, watch)
        return report

    def last_scan(self, name: str) -> ScanReport | None:
        """The report of the latest scan of ``name``'s base path (``None`` before one).

        Raises:
            UnknownModelError: ``name`` is not watched.
        """
        return self._watcher.get(name).last

    def unwatch(self, name: str, *, retire: bool = False) -> None:
        """Stop watching ``name``'s base path; its loaded versions stay loaded.

        A model of a watched repository (:meth:`watch_repository`) also
        leaves the repository's models: its scans leave it alone until
        :meth:`scan_repository` names it again.

        Args:
            name: The watched model.
            retire: Also retire every version of ``name`` (the labels, route
                and default on them go too); each drains, then is disposed.

        Raises:
            UnknownModelError: ``name`` is not watched.
        """
        with self._administering():
            watch = self._watcher.remove(name)
            for repository in list(members_of(self._repositories, name)):
                repository.forget(name)
            if retire:
                self._watcher.retire_all(name, watch)
        watch.polling.halt()

    # -- model repositories ----------------------------------------------------------

    def watch_repository(
        self,
        path: str | os.PathLike[str],
        *,
        models: Iterable[str] | None = None,
        poll_interval: float | None = None,
        notify: bool = False,
        batching: BatchingPolicy | None = None,
    ) -> RepositoryReport:
        """Serve the models of a model repository, ``<path>/<model>/<version>/``, and scan it now.

        The layout is Triton's and KServe's: each directory of ``path`` is a
        model named after it (dot-directories and files are ignored, so a
        model written aside as ``.new-risk`` and renamed in appears whole), and
        a base path of version directories as :meth:`watch` reads one, each
        version a SavedModel or a ``.keras`` archive. The latest version serves.
        Each scan (:meth:`scan_repository`, or each poll) starts watching the
        model directories that appeared, stops watching those that disappeared
        and retires every version of them (labels and routes on them go too;
        they drain, then are disposed), and scans every model it watches: new
        versions swap in under the registry's :class:`SwapPolicy`, a failed
        swap leaves what served serving, and a version that failed to load is
        not tried again until a file in its directory changes. Each model is a
        watch of the registry: :meth:`last_scan` has its report, and
        :meth:`unwatch` stops watching it (scans then leave it alone until
        :meth:`scan_repository` names it). One thread polls the whole repository.

        Args:
            path: The repository.
            models: Watch only these models (Triton's explicit mode), now and
                when :meth:`scan_repository` names more; ``None`` (default):
                every model directory, as they come and go.
            poll_interval: Also scan every this many seconds, on a thread of
                the registry's, until :meth:`unwatch_repository` or
                :meth:`close`. ``None``: scan only when :meth:`scan_repository`
                is called.
            notify: Also scan as soon as the operating system reports a change
                under ``path`` (see :meth:`watch`); needs ``watchfiles``.
            batching: Batch each version's concurrent requests (see :meth:`load`).

        Returns:
            The first scan's report; each model's :class:`ScanReport` is in it.

        Raises:
            CheckpointError: ``path`` is not a directory; nothing changed.
            UnknownModelError: A name of ``models`` is not a directory of
                ``path``; nothing changed.
            ValueError: ``path`` is watched already, or a bad argument.
            ImportError: ``notify`` without ``watchfiles``; the message names
                the ``pip install``.

        Example:
            >>> import tempfile, keras, numpy as np, lifecycle as lc
            >>> inputs = keras.Input((4,), name="features")
            >>> exported = keras.Model(inputs, keras.layers.Dense(1)(inputs))
            >>> repository = tempfile.mkdtemp()
            >>> exported.export(repository + "/risk/1", verbose=False)
            >>> with lc.ModelRegistry() as registry:
            ...     report = registry.watch_repository(repository)
            ...     served = [(s.name, s.version) for s in registry.status()]
            >>> (report.models, served)
            (('risk',), [('risk', 1)])
        """
        if models is not None:
            if isinstance(models, str):
                raise TypeError(
                    f"`models` must be a collection of model names or None, not one string. "
                    f"Received: {models!r}; pass [{models!r}]."
                )
            models = {check_model_name(name) for name in models}
        if poll_interval is not None:
            poll_interval = check_timeout(poll_interval, "poll_interval")
            if not poll_interval:
                raise ValueError("`poll_interval` must be > 0 seconds or None.")
        if batching is not None and not isinstance(batching, BatchingPolicy):
            raise TypeError(f"`batching` must be a BatchingPolicy or None. Received: {batching!r}")
        if notify:
            require_notifications()
        root = os.path.abspath(os.fspath(path))
        if not os.path.isdir(root):
            raise CheckpointError(
                f"Model repository {root!r} does not exist or is not a directory; expected "
                "<repository>/<model>/<version>/ directories (SavedModels or .keras archives).",
                path=root,
            )
        repository = Repository(
            root, self._watcher, models, poll_interval, notify=notify, batching=batching
        )
        with self._administering():
            self._table.check_open()
            if root in self._repositories:
                raise ValueError(
                    f"The repository {root!r} is watched already; unwatch_repository() it first."
                )
            # UnknownModelError for a name that is not there, before anything is watched.
            report = repository.scan(tuple(sorted(models or ())))
            self._repositories[root] = repository
        if poll_interval is not None or notify:
            repository.start_polling(functools.partial(self._scan_repository, repository))
        return report

    def scan_repository(
        self, path: str | os.PathLike[str], *, models: Iterable[str] = ()
    ) -> RepositoryReport:
        """Scan a watched repository now: models join, leave and swap (:meth:`watch_repository`).

        Args:
            path: The watched repository.
            models: Models to read anew (Triton's explicit load): each is
                watched from now on if it was not, or watched afresh (its
                failed versions are tried again), and swaps to its newest
                version.

        Returns:
            The scan's report.

        Raises:
            UnknownModelError: ``path`` is not watched, or a name of ``models``
                is not a directory of it.
        """
        names = (models,) if isinstance(models, str) else tuple(models)
        repository = self._repository(path)
        return self._scan_repository(repository, tuple(check_model_name(n) for n in names))

    def last_repository_scan(self, path: str | os.PathLike[str]) -> RepositoryReport | None:
        """The report of the latest scan of a watched repository (``None`` before one).

        Raises:
            UnknownModelError: ``path`` is not watched.
        """
        return self._repository(path).last

    def unwatch_repository(self, path: str | os.PathLike[str], *, retire: bool = False) -> None:
        """Stop watching a repository and its models; their versions stay loaded.

        Args:
            path: The watched repository.
            retire: Also retire every version of its models (see :meth:`unwatch`).

        Raises:
            UnknownModelError: ``path`` is not watched.
        """
        repository = self._repository(path)
        repository.polling.halt()  # outside the lock: a scan in progress needs it
        with self._administering():
            self._repositories.pop(repository.path, None)
            for name in sorted(repository.members):
                if retire:
                    repository.retire(name)
                else:
                    self._watcher.remove(name)
            repository.members.clear()

    def _repository(self, path: str | os.PathLike[str]) -> Repository:
        root = os.path.abspath(os.fspath(path))
        repository = self._repositories.get(root)
        if repository is None:
            raise UnknownModelError(
                f"The repository {root!r} is not watched. Watched: {sorted(self._repositories)}"
            )
        return repository

    def _scan_repository(
        self, repository: Repository, names: tuple[str, ...] = ()
    ) -> RepositoryReport:
        with self._administering():
            self._table.check_open()
            if self._repositories.get(repository.path) is not repository:
                raise UnknownModelError(f"The repository {repository.path!r} is not watched.")
            return repository.scan(names)

    def scan(self, name: str) -> ScanReport:
        """Bring ``name``'s loaded versions in line with its watched base path.

        Under ``AVAILABILITY_PRESERVING``, new versions load before old ones
        retire, and old ones retire only once a wanted version is ready (if
        every new version fails, the old ones keep serving); under
        ``RESOURCE_PRESERVING``, versions that left the policy retire first,
        and if no wanted version is ready after the loads they are loaded
        back, with their labels, route and default
        (:attr:`ScanReport.restored`); requests in the gap wait. Either way a
        failed swap leaves the model serving what it served, and its warning
        (logger ``lifecycle.registry``) says what became of each version.
        A version that fails to load (a corrupt checkpoint or SavedModel, a
        failing factory, checkpoints without a factory)
        is reported in :attr:`ScanReport.failed` and does not stop the others.

        Raises:
            UnknownModelError: ``name`` is not watched.
            CheckpointError: The base path disappeared; nothing changed.
        """
        with self._administering():
            self._table.check_open()
            return self._watcher.scan(name)

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
            watched=len(self._watcher),
            load_pauses=self._loader.pauses if self._loader is not None else 0,
            session=self._session.statistics(),
            foreground_loads=self._loader.foreground_runs if self._loader is not None else 0,
        )

    def status(self, name: str | None = None) -> tuple[VersionStatus, ...]:
        """Frozen status of every loaded or loading version (of ``name``), by name and version.

        Raises:
            UnknownModelError: ``name`` is given and nothing of it is loaded or loading.
        """
        return self._table.status(name)

    def close(self) -> None:
        """Unload every version (waiting for leases up to ``drain_timeout``) and close.

        Safe to call twice. Afterwards loads, leases and requests raise
        :class:`~lifecycle.errors.ClosedError`.
        """
        # Outside the lock: a scan in progress needs it.
        for repository in list(self._repositories.values()):
            repository.polling.halt()
        self._watcher.halt_all()
        with self._administering():
            if self._table.closed:
                return
            self._table.unpin_all()
            self._repositories.clear()
            self._watcher.clear()
            for loaded in self._table.versions():
                self._retirement.retire(loaded, wait=True)
            self._table.close()
            self._session.close()
            if self._loader is not None:
                self._loader.close()

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
