"""Ray Serve: multiplexed models disposed once the requests that hold them are done.

Needs Ray (extra ``ray``). A drop-in for ``ray.serve.multiplexed``: change the
import, nothing else::

    from ray import serve
    from lifecycle.integrations.ray import multiplexed

    @serve.deployment
    class Models:
        @multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id: str) -> keras.Model:
            return build_or_load(model_id)  # a Keras model, or a .keras / SavedModel path

        async def __call__(self, request):
            model = await self.get_model(serve.get_multiplexed_model_id())
            return model(features_of(request))

Ray's own decorator caches at most ``max_num_models_per_replica`` models per
replica and evicts the least recently used one by dropping its reference. A
Keras model is not freed by that, and a request that obtained the model before
its eviction may still be calling it.

This decorator keeps Ray's cache, its routing of a model id to the replicas that
hold it, its arguments and its metrics, and puts each replica's models in a
:class:`~lifecycle.ModelRegistry` of the replica's own:

* the loader's result (a Keras model, or a path the registry can load) is
  loaded into the registry: managed, isolated, warmed up;
* every ``await self.get_model(model_id)`` takes a lease of the model for the
  asyncio task that awaited it (the request), returned when that task ends;
* an evicted model is handed out no more; the requests holding it finish on it
  as they would with plain Ray, and it is disposed (its variables, optimizer
  state and traced functions released) once the last of them has ended;
* with ``memory_budget``, loads also evict least recently used models until the
  models held come within that many bytes.

A model is held by the task that awaited it: keep using it within that task (a
request handler, a ``@serve.batch`` batch, a streaming generator); a reference
kept beyond the task's end may be disposed under it, and then raises
:class:`~lifecycle.DisposedError`.

:func:`multiplexed_statistics` reports a replica's models; the same figures are
Ray metrics (``lifecycle_multiplexed_*``, tagged with the deployment and replica
as Ray tags its own), exported wherever Ray exports metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import os
import threading
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import keras

from ..._core import check_optional_int
from ..._model import ManagedModel
from ..._registry import ModelRegistry, VersionState
from ...errors import BudgetExceededError, UnknownModelError

try:
    import ray
    from ray import serve
    from ray.serve import metrics as serve_metrics
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "lifecycle.integrations.ray needs Ray, an optional extra: "
        'pip install "keras-lifecycle[ray]"'
    ) from error

from ._internals import RAY_MULTIPLEXER_ATTRIBUTE, check_ray_internals, is_ray_multiplexer

# At import, rather than at a replica's first eviction, when Ray moved something.
check_ray_internals(tune=False)

__all__ = ["MultiplexStatistics", "multiplexed", "multiplexed_statistics"]

_Loader = TypeVar("_Loader", bound=Callable[..., Awaitable[Any]])

# Ray Serve's multiplexer (its cache ``models``, least recently used first, and
# ``unload_model_lru()``) is read through ``_internals``, which checks all three.
_RAY_MULTIPLEXER = RAY_MULTIPLEXER_ATTRIBUTE
# Where this module keeps its own state, beside Ray's.
_STATE = "__lifecycle_multiplex"
# The options a decorated loader was given, for statistics before its first load.
_OPTIONS = "_lifecycle_multiplex_options"


@attrs.frozen
class MultiplexStatistics:
    """One replica's multiplexed models (:func:`multiplexed_statistics`).

    Attributes:
        model_ids: The model ids loaded and handed out now, least recently used first.
        max_models: ``max_num_models_per_replica`` (-1: no limit).
        memory_budget: The byte budget, or ``None``.
        bytes_held: Bytes of the models in ``model_ids``.
        models_loaded: Loads so far.
        models_evicted: Models evicted so far (by count, by budget, or at shutdown).
        models_draining: Evicted models still held by requests in flight.
        bytes_draining: Bytes of those.
        models_disposed: Evicted models disposed so far.
        leases: Requests holding a model now.
    """

    model_ids: tuple[str, ...]
    max_models: int
    memory_budget: int | None
    bytes_held: int
    models_loaded: int
    models_evicted: int
    models_draining: int
    bytes_draining: int
    models_disposed: int
    leases: int


@attrs.frozen
class _Options:
    max_models: int
    memory_budget: int | None
    warmup: Any
    safe_mode: bool


class _Entry:
    """What Ray's cache holds for one model id: the registry's version of it.

    Ray calls ``__del__`` when it evicts an entry (on a thread of its executor)
    and then sets an instance attribute of that name; Python calls it when the
    entry is collected. Either retires the version, once.
    """

    def __init__(self, multiplex: _Multiplex, model_id: str, name: str, version: int) -> None:
        self.multiplex = multiplex
        self.model_id = model_id
        self.name = name
        self.version = version
        self.retired = False

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to free
            self.multiplex.retire(self)


class _Metrics:
    """The replica's figures as Ray Serve metrics (tagged with deployment and replica)."""

    def __init__(self) -> None:
        self.bytes_held = serve_metrics.Gauge(
            "lifecycle_multiplexed_bytes_held",
            description="Bytes of the multiplexed models loaded and handed out on this replica.",
        )
        self.bytes_draining = serve_metrics.Gauge(
            "lifecycle_multiplexed_bytes_draining",
            description="Bytes of evicted models still held by requests in flight.",
        )
        self.models_draining = serve_metrics.Gauge(
            "lifecycle_multiplexed_models_draining",
            description="Evicted models still held by requests in flight.",
        )
        self.models_evicted = serve_metrics.Counter(
            "lifecycle_multiplexed_models_evicted",
            description="Multiplexed models evicted on this replica.",
        )
        self.models_disposed = serve_metrics.Counter(
            "lifecycle_multiplexed_models_disposed",
            description="Evicted multiplexed models disposed on this replica.",
        )
        self._disposed = 0

    def update(self, statistics: MultiplexStatistics, evicted: int = 0) -> None:
        self.bytes_held.set(statistics.bytes_held)
        self.bytes_draining.set(statistics.bytes_draining)
        self.models_draining.set(statistics.models_draining)
        if evicted:
            self.models_evicted.inc(evicted)
        newly_disposed = statistics.models_disposed - self._disposed
        if newly_disposed > 0:
            self._disposed = statistics.models_disposed
            self.models_disposed.inc(newly_disposed)


class _Multiplex:
    """One replica's registry of multiplexed models, beside Ray's cache."""

    def __init__(self, owner: Any, options: _Options) -> None:
        self.owner = owner
        self.options = options
        self.registry = ModelRegistry(name=f"multiplexed-{os.getpid()}-{id(owner):x}")
        self.metrics = _Metrics()
        self._lock = threading.Lock()
        # Version numbers, one per load, never reused: a model id loaded again
        # while its evicted version drains gets a new one. One counter for every
        # id, not a map keyed by the ids clients send (which would only grow).
        self._versions = itertools.count(1)
        self._loaded = 0
        self._evicted = 0
        # The replica's event loop, known from the first load: Ray's cache and the
        # metrics are read there only (an eviction runs on Ray's executor threads).
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- loading and budget (on the event loop, under Ray's cache lock) -------------------

    async def load(self, model_id: str, source: Any) -> _Entry:
        """Load ``source`` for ``model_id`` into the registry, then keep within the budget."""
        if not isinstance(source, (keras.Model, str, os.PathLike)):
            raise TypeError(
                "A multiplexed loader must return a Keras model or the path of a .keras file "
                f"or SavedModel directory. The loader for model id {model_id!r} returned "
                f"{type(source).__qualname__}"
            )
        self._loop = asyncio.get_running_loop()
        # Model ids are any string; a registry name has no '/': quoting is one-to-one.
        name = urllib.parse.quote(model_id, safe="")
        with self._lock:
            version = next(self._versions)
        origin = source if isinstance(source, (str, os.PathLike)) else (lambda: source)
        load = functools.partial(
            self.registry.load,
            name,
            version,
            origin,
            warmup=self.options.warmup,
            safe_mode=self.options.safe_mode,
        )
        # Off the event loop: other requests go on while the model is managed and warmed up.
        await self._loop.run_in_executor(None, load)
        entry = _Entry(self, model_id, name, version)
        with self._lock:
            self._loaded += 1
        await self._keep_within_budget(entry)
        # Ray adds the entry to its cache once this returns: count it as held already.
        self.metrics.update(self.statistics(loading=entry))
        return entry

    def _publish(self, evicted: int = 0) -> None:
        """Update the metrics on the event loop, from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(
                lambda: self.metrics.update(self.statistics(), evicted=evicted)
            )

    async def _keep_within_budget(self, entry: _Entry) -> None:
        budget = self.options.memory_budget
        if budget is None:
            return
        nbytes = self._bytes_of(entry)
        if nbytes > budget:
            self.retire(entry)
            raise BudgetExceededError(
                f"Model id {entry.model_id!r} holds {nbytes} bytes, more than the replica's "
                f"memory_budget of {budget} bytes on its own; it was unloaded, and no other "
                "model was evicted for it"
            )
        ray_multiplexer = _ray_multiplexer(self.owner)
        while ray_multiplexer.models and self.statistics(loading=entry).bytes_held > budget:
            await ray_multiplexer.unload_model_lru()

    # -- leases (on the event loop) ------------------------------------------------------

    def lease(self, entry: _Entry) -> keras.Model:
        """The entry's model, held until the current asyncio task ends."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - a coroutine awaited outside asyncio
            raise RuntimeError("A multiplexed model must be awaited inside an asyncio task")
        held = self.registry.lease(entry.name, version=entry.version)
        model = held.__enter__()
        task.add_done_callback(lambda _task: self._release(entry, held))
        return model

    def _release(self, entry: _Entry, held: contextlib.AbstractContextManager[Any]) -> None:
        held.__exit__(None, None, None)
        if entry.retired:
            self._publish()

    # -- eviction (Ray's executor thread, or a collection) --------------------------------

    def retire(self, entry: _Entry) -> None:
        """Hand the entry's model out no more; dispose it once no request holds it."""
        with self._lock:
            if entry.retired:
                return
            entry.retired = True
            self._evicted += 1
        with contextlib.suppress(UnknownModelError):  # the registry was closed
            self.registry.unload(entry.name, entry.version)
        self._publish(evicted=1)

    # -- figures ------------------------------------------------------------------------

    def _bytes_of(self, entry: _Entry) -> int:
        return sum(s.bytes for s in self.registry.status(entry.name) if s.version == entry.version)

    def statistics(self, loading: _Entry | None = None) -> MultiplexStatistics:
        ray_multiplexer = getattr(self.owner, _RAY_MULTIPLEXER, None)
        models = _copy_cache(ray_multiplexer) if ray_multiplexer is not None else {}
        if loading is not None:
            models[loading.model_id] = loading
        held = {(e.name, e.version) for e in models.values() if isinstance(e, _Entry)}
        # One snapshot of the registry: its versions are this replica's models.
        versions = self.registry.status()
        draining = [s for s in versions if s.state is VersionState.RETIRING]
        with self._lock:
            evicted, loaded = self._evicted, self._loaded
        return MultiplexStatistics(
            model_ids=tuple(models),
            max_models=self.options.max_models,
            memory_budget=self.options.memory_budget,
            bytes_held=sum(
                s.bytes
                for s in versions
                if s.state is VersionState.READY and (s.name, s.version) in held
            ),
            models_loaded=loaded,
            models_evicted=evicted,
            models_draining=len(draining),
            bytes_draining=sum(s.bytes for s in draining),
            models_disposed=evicted - len(draining),
            leases=sum(s.leases for s in versions),
        )


def _ray_multiplexer(owner: Any) -> Any:
    """Ray's multiplexer of ``owner``; fails loudly if Ray no longer keeps it as we read it."""
    found = getattr(owner, _RAY_MULTIPLEXER, None)
    if not is_ray_multiplexer(found):
        raise RuntimeError(
            "lifecycle.integrations.ray.multiplexed no longer recognises Ray Serve's "
            f"multiplexer (ray {ray.__version__}): expected a _ModelMultiplexWrapper at "
            f"{_RAY_MULTIPLEXER!r} with `models` and `unload_model_lru()`. It is tested with "
            "the Ray releases keras-lifecycle[ray] pins."
        )
    return found


def _copy_cache(ray_multiplexer: Any) -> dict[str, Any]:
    """Ray's cache, copied; again if the event loop changed it meanwhile.

    A sync deployment method reading statistics may run on another thread.
    """
    for _ in range(10):
        with contextlib.suppress(RuntimeError):  # mutated during the copy
            return dict(ray_multiplexer.models)
    return dict(ray_multiplexer.models)


def _state(owner: Any, options: _Options) -> _Multiplex:
    """The owner's multiplex state, created on first use (on the event loop)."""
    state = owner.__dict__.get(_STATE)
    if state is None:
        state = _Multiplex(owner, options)
        owner.__dict__[_STATE] = state
    return state


def multiplexed(
    func: _Loader | None = None,
    max_num_models_per_replica: int = 3,
    *,
    memory_budget: int | None = None,
    warmup: Any = None,
    safe_mode: bool = True,
) -> Any:
    """``ray.serve.multiplexed`` whose evicted models are disposed once their requests end.

    Used exactly as Ray's decorator, on an ``async`` loader (a deployment's
    method or a function) that takes one model id and returns a Keras model or
    the path of a ``.keras`` file or SavedModel directory. Awaiting the
    decorated loader returns the model: a managed model, held for the asyncio
    task (the request) that awaited it.

    Args:
        func: The loader, when the decorator is used without arguments.
        max_num_models_per_replica: Models kept per replica, least recently
            used evicted first, as with Ray (-1: no limit).
        memory_budget: Bytes the models kept on a replica may hold together;
            a load evicts least recently used models until they fit. A model
            bigger than the budget on its own is unloaded again and its load
            raises :class:`~lifecycle.BudgetExceededError`. Models evicted but
            still held by requests are not counted: they are freed as soon as
            their requests end. ``None`` (default): no byte limit.
        warmup: A sample input for models that do not know their inputs
            (subclassed models): the registry traces and warms up each model
            on it before any request gets it. Functional and Sequential models,
            and SavedModels, warm up on zeros of their input shapes.
        safe_mode: Keras ``safe_mode`` for ``.keras`` paths.

    Returns:
        The decorated loader, or a decorator when called with arguments only.

    Raises:
        TypeError: Ray's own checks (the loader is not async, or does not take
            one model id; ``max_num_models_per_replica`` is not an int).
        ValueError: ``memory_budget`` is not an int >= 1.

    Example:
        >>> from ray import serve  # doctest: +SKIP
        >>> from lifecycle.integrations.ray import multiplexed  # doctest: +SKIP
        >>> @serve.deployment  # doctest: +SKIP
        ... class Models:
        ...     @multiplexed(max_num_models_per_replica=2, memory_budget=256 << 20)
        ...     async def get_model(self, model_id: str):
        ...         return f"/models/{model_id}.keras"
        ...     async def __call__(self, request):
        ...         model = await self.get_model(serve.get_multiplexed_model_id())
        ...         return model.predict(await request.json(), verbose=0).tolist()
    """
    options = _Options(
        max_models=max_num_models_per_replica,
        memory_budget=check_optional_int(memory_budget, "memory_budget", minimum=1),
        warmup=warmup,
        safe_mode=bool(safe_mode),
    )

    def decorate(loader: _Loader) -> _Loader:
        if not inspect.iscoroutinefunction(loader):
            # Ray's message, before Ray would see our (async) wrapper instead.
            raise TypeError(
                "@serve.multiplexed can only be used to decorate async functions or methods."
            )

        # What Ray decorates: its name and signature are the loader's (Ray tells a
        # method from a function by them), its result the registry's entry.
        @functools.wraps(loader)
        async def load_entry(*args: Any) -> _Entry:
            owner = args[0] if len(args) == 2 else load_entry
            source = await loader(*args)
            return await _state(owner, options).load(args[-1], source)

        ray_loader = serve.multiplexed(load_entry, max_num_models_per_replica)

        @functools.wraps(ray_loader)
        async def get_model(*args: Any) -> ManagedModel:
            entry = await ray_loader(*args)
            return entry.multiplex.lease(entry)

        # Ray finds `self` by `getattr(self, name).__wrapped__ is <what it decorated>`.
        get_model.__wrapped__ = load_entry  # type: ignore[attr-defined]
        setattr(get_model, _OPTIONS, options)
        setattr(load_entry, _OPTIONS, options)
        return get_model  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate


def multiplexed_statistics(owner: Any) -> MultiplexStatistics:
    """This replica's multiplexed models: loaded, evicted, draining, disposed, bytes.

    Args:
        owner: The deployment instance whose method is decorated with
            :func:`multiplexed` (``self``), or the decorated function.

    Raises:
        TypeError: ``owner`` has no loader decorated with :func:`multiplexed`.
    """
    if callable(owner) and hasattr(owner, _OPTIONS):  # a decorated function
        owner = owner.__wrapped__
        options = getattr(owner, _OPTIONS)
    else:
        options = next(
            (
                getattr(value, _OPTIONS)
                for value in vars(type(owner)).values()
                if hasattr(value, _OPTIONS)
            ),
            None,
        )
        if options is None:
            raise TypeError(
                "multiplexed_statistics() takes a deployment instance with a loader decorated "
                "with lifecycle.integrations.ray.multiplexed, or such a function. "
                f"Received: {owner!r:.80}"
            )
    return _state(owner, options).statistics()
