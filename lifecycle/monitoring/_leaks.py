"""Leak reports: disposed models, variables and graphs that are still reachable, and who holds them.

A disposed model's buffers are released whoever holds it, but the Python
objects — the model, its layers, its variables, graphs that captured them —
stay until the last reference goes. A report names each survivor with the
shortest reference chain from a module (found with ``objgraph``)::

    module app.cache → .CACHE → dict['last'] → list[3] → Functional 'risk/v3' (disposed)
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from .. import _model_index, _tf
from .._core import ModelState

__all__ = ["Leak", "LeakReport", "check_disposed", "find_leaks", "live_models"]

_INSTALL = 'pip install "keras-lifecycle[leaks]"'
ARROW = " → "


def _objgraph() -> Any:
    try:
        import objgraph
    except ImportError as error:
        raise ImportError(f"Leak reports need objgraph, an optional extra: {_INSTALL}") from error
    return objgraph


@attrs.frozen
class Leak:
    """One object that should be gone and is not.

    Attributes:
        kind: ``"model"`` (a disposed model), ``"variable"`` (a variable of a
            disposed model whose model is gone), ``"graph"`` (a traced graph
            that captured a disposed model's variable) or ``"live"`` (a managed
            model never disposed).
        description: What it is, e.g. ``"Functional 'risk/v3' (disposed)"``.
        chain: The shortest reference chain from a module to it, root first,
            ending with ``description``; empty when no module reaches it.
        held_by: When ``chain`` is empty: what refers to it directly, a running
            function's local first (``"frame of train() → local 'model'"``), then
            other referrers by type; references among the object's own parts
            (Keras models keep closures over themselves) are left out.
    """

    kind: str
    description: str
    chain: tuple[str, ...] = ()
    held_by: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.chain:
            return ARROW.join(self.chain)
        held = ", ".join(self.held_by) or "nothing outside its own reference cycles"
        return f"{self.description}: no chain from a module (held by: {held})"


@attrs.frozen
class LeakReport:
    """What :func:`find_leaks` found; falsy when nothing leaked, iterable over the leaks.

    Attributes:
        leaks: Each leaked object with its chain.
        summarized: Leaked objects not listed one by one (for example the
            variables of a model already listed), by kind.
        pooled_bytes: Bytes freed into oneDNN's CPU pool and kept there rather
            than returned to the system (not a leak: the process reuses them),
            as ``lc.statistics().cpu_pooled_bytes``; ``None`` where unknown.
    """

    leaks: tuple[Leak, ...] = ()
    summarized: tuple[tuple[str, int], ...] = ()
    pooled_bytes: int | None = 0

    def __bool__(self) -> bool:
        return bool(self.leaks)

    def __len__(self) -> int:
        return len(self.leaks)

    def __iter__(self) -> Iterator[Leak]:
        return iter(self.leaks)

    def __str__(self) -> str:
        pooled = self._pooled_line()
        if not self.leaks:
            return "no leaks: nothing disposed is reachable, no managed model left live" + pooled
        counts: dict[str, int] = {}
        for leak in self.leaks:
            counts[leak.kind] = counts.get(leak.kind, 0) + 1
        head = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in counts.items())
        lines = [f"{len(self.leaks)} leak(s): {head}"]
        lines += [f"  [{leak.kind}] {leak}" for leak in self.leaks]
        lines += [f"  (and {n} more {kind}s, not listed)" for kind, n in self.summarized]
        return "\n".join(lines) + pooled

    def _pooled_line(self) -> str:
        if not self.pooled_bytes:
            return ""
        return (
            f"\nfreed memory kept by oneDNN's CPU pool, not returned to the system: "
            f"{self.pooled_bytes / 2**20:.1f} MiB (reused by this process; "
            "LIFECYCLE_ALLOCATOR=system before import lifecycle returns it)"
        )


def describe(obj: Any) -> str:
    """A short human name for an object in a chain."""
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    record = getattr(obj, "_lifecycle", None)
    if record is not None:
        state = {ModelState.LIVE: "live", ModelState.DISPOSING: "disposing"}.get(
            record.state, "disposed"
        )
        return f"{type(obj).__name__} {getattr(obj, 'name', record.name)!r} ({state})"
    path = getattr(obj, "path", None)
    if isinstance(path, str):
        return f"{type(obj).__name__} {path!r}"
    if isinstance(obj, types.FrameType):
        return f"frame of {obj.f_code.co_name}()"
    if isinstance(obj, types.FunctionType):
        return f"function {obj.__qualname__}()"
    name = getattr(obj, "name", None)
    if isinstance(name, str):
        return f"{type(obj).__name__} {name!r}"
    return type(obj).__name__


def _hop(parent: Any, child: Any, previous: Any) -> str | None:
    """How ``parent`` holds ``child``; ``None`` to skip a hop (a ``__dict__``)."""
    if isinstance(parent, dict):
        owner_dict = getattr(previous, "__dict__", None) if previous is not None else None
        if owner_dict is parent:
            return None  # obj -> obj.__dict__ -> child reads as obj.attr
        for key, value in parent.items():
            if value is child:
                return f"dict[{key!r}]"
    if isinstance(parent, (list, tuple)):
        for index, value in enumerate(parent):
            if value is child:
                return f"{type(parent).__name__}[{index}]"
    if isinstance(parent, types.FrameType):
        for name, value in parent.f_locals.items():
            if value is child:
                return f"frame of {parent.f_code.co_name}() local {name!r}"
    if isinstance(parent, types.CellType):
        return "closure cell"
    return None


def _render(chain: list[Any]) -> tuple[str, ...]:
    """``[module, ..., obj]`` as readable steps."""
    steps = [describe(chain[0])]
    previous: Any = None
    for index in range(1, len(chain)):
        parent, child = chain[index - 1], chain[index]
        how = _hop(parent, child, previous)
        attribute = None
        owner = chain[index - 2] if index >= 2 else None
        if (
            isinstance(parent, dict)
            and owner is not None
            and getattr(owner, "__dict__", None) is parent
        ):
            attribute = next((k for k, v in parent.items() if v is child), None)
        if attribute is not None:
            steps.append(f".{attribute}")
        elif how is not None:
            steps.append(how)
        previous = parent
    steps.append(describe(chain[-1]))
    # Keep each object once: the last step names the leaked object itself.
    return tuple(steps)


def _chain(objgraph: Any, obj: Any, max_depth: int, ignore: list[int]) -> list[Any]:
    return objgraph.find_backref_chain(
        obj, objgraph.is_proper_module, max_depth=max_depth, extra_ignore=ignore
    )


# Modules whose frames hold candidates while a report is built.
_MACHINERY = frozenset({__name__, "lifecycle.testing", "lifecycle.pytest_plugin"})
# Objects visited when telling a model's own reference cycles from outside holders.
_OWN_CYCLE_LIMIT = 20_000


def _caller_frames() -> list[types.FrameType]:
    """This thread's running frames, innermost first, without the report's own."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") not in _MACHINERY:
            frames.append(frame)
        frame = frame.f_back
    return frames


def _frame_holders(obj: Any, frames: list[types.FrameType]) -> list[str]:
    """``"frame of f() → local 'x'"`` for each running frame whose local ``x`` is ``obj``.

    A running frame's locals are invisible to ``gc.get_referrers``, so they are
    read from ``f_locals``.
    """
    found = []
    for frame in frames:
        for name, value in frame.f_locals.items():
            if value is obj:
                found.append(f"frame of {frame.f_code.co_name}(){ARROW}local {name!r}")
    return found


def _collect() -> None:
    """``gc.collect()``, after refreshing the callers' ``f_locals`` snapshots.

    Before Python 3.13, reading a frame's ``f_locals`` (as a report does) leaves
    a dict on the frame that keeps the values of that moment; a local deleted
    since would live on in it. Reading ``f_locals`` again re-syncs the dict.
    """
    for frame in _caller_frames():
        frame.f_locals  # noqa: B018 (the read re-syncs the snapshot)
    gc.collect()


def _own_cycle(obj: Any) -> set[int]:
    """Ids of objects ``obj`` reaches within a few hops (its own reference cycles).

    Keras models keep bound methods and closures over themselves (wrapped
    ``build``, ``quantize``); those refer to the model but do not hold it.
    """
    seen = {id(obj)}
    layer = [obj]
    for _ in range(4):
        following = []
        for item in layer:
            for referent in gc.get_referents(item):
                if id(referent) not in seen:
                    seen.add(id(referent))
                    following.append(referent)
        layer = following
        if len(seen) > _OWN_CYCLE_LIMIT:
            break
    return seen


def _referrers(obj: Any, ignore: set[int]) -> tuple[str, ...]:
    """What holds ``obj`` when no module reaches it: running frames, then the rest by type."""
    frames = _caller_frames()
    found = _frame_holders(obj, frames)
    # f_locals of a frame (before Python 3.13) is a dict cached on the frame; it
    # mirrors locals already named above.
    ignore = ignore | {id(frame.f_locals) for frame in frames} | {id(sys._getframe())}
    own = _own_cycle(obj)
    for referrer in gc.get_referrers(obj):
        if id(referrer) in ignore or id(referrer) in own or isinstance(referrer, types.FrameType):
            continue
        found.append(describe(referrer))
    return tuple(dict.fromkeys(found))[:5]


def _graphs_holding(handles: set[int]) -> list[Any]:
    """Traced graphs alive that captured one of ``handles``."""
    graphs = []
    for graph in _tf.func_graphs():
        if any(id(capture) in handles for capture in _tf.external_captures(graph)):
            graphs.append(graph)
    return graphs


def _report(
    candidates: Iterable[tuple[str, Any]],
    *,
    max_depth: int,
    max_chains: int,
    require_chain: bool = False,
) -> LeakReport:
    objgraph = _objgraph()
    items = list(candidates)
    ignore_ids = [id(items), *(id(pair) for pair in items)]
    leaks, summarized = [], {}
    for kind, obj in items:
        if len(leaks) >= max_chains:
            summarized[kind] = summarized.get(kind, 0) + 1
            continue
        chain = _chain(objgraph, obj, max_depth, [*ignore_ids, id(sys._getframe())])
        if len(chain) > 1:
            leaks.append(Leak(kind, describe(obj), _render(chain)))
        elif not require_chain:
            # The failed search's chain is [obj]: a holder of the report's own.
            held = _referrers(obj, {*ignore_ids, id(chain)})
            leaks.append(Leak(kind, describe(obj), (), held))
    return LeakReport(tuple(leaks), tuple(summarized.items()), _tf.memory.cpu_pooled_bytes())


def live_models(models: Iterable[Any] | None = None) -> list[Any]:
    """Managed models (of ``models``, or all) that were never disposed."""
    pool = _model_index.managed_models() if models is None else list(models)
    return [m for m in pool if m._lifecycle.state is ModelState.LIVE]


def _disposed_candidates(models: list[Any] | None) -> list[tuple[str, Any]]:
    disposed = _model_index.disposed_models() if models is None else models
    # Variables reachable through a model listed anyway are not listed again.
    through_models = {id(v) for m in disposed for v in _tf.keras_variables(m)}
    candidates: list[tuple[str, Any]] = [("model", m) for m in disposed]
    candidates += [
        ("variable", variable)
        for variable in _model_index.disposed_variables()
        if id(variable) not in through_models
    ]
    if models is None:
        handles = {id(handle) for handle in _model_index.disposed_handles()}
    else:
        handles = {id(leaf.handle) for m in models for leaf in _tf.model_leaves(m)}
    if handles:
        candidates += [("graph", graph) for graph in _graphs_holding(handles)]
    if models is not None:  # nothing but these models and their graphs
        candidates = [(k, o) for k, o in candidates if k != "variable"]
    return candidates


def find_leaks(
    *, include_live: bool = False, max_depth: int = 25, max_chains: int = 20
) -> LeakReport:
    """Disposed models, their variables and traced graphs that are still reachable.

    Each is reported with the shortest reference chain from a module
    (``objgraph.find_backref_chain``), or, when no module reaches it, with what
    refers to it directly (a running function's frame, for a local variable).
    A variable is reported on its own only when its model is gone; a model's
    graphs when they captured its variables.

    Args:
        include_live: Also report managed models that were never disposed.
        max_depth: Longest chain searched.
        max_chains: Objects reported one by one; the rest are counted.

    Returns:
        A :class:`LeakReport`: falsy when nothing leaked; ``str()`` is readable.

    Raises:
        ImportError: objgraph is not installed; the message says how to install it.

    Example:
        >>> import lifecycle as lc
        >>> print(lc.find_leaks())  # doctest: +SKIP
        1 leak(s): 1 model
          [model] module app.cache → .CACHE → dict['last'] → Functional 'risk/v3' (disposed)
    """
    _objgraph()
    _collect()
    candidates = _disposed_candidates(None)
    if include_live:
        candidates = [("live", m) for m in live_models()] + candidates
    return _report(candidates, max_depth=max_depth, max_chains=max_chains)


def check_disposed(model: Any, *, max_depth: int = 25) -> LeakReport:
    """Whether a disposed ``model``, or a graph that captured it, is reachable from a module.

    The caller necessarily holds the model while calling, so only holders
    reachable from a module count: a cache, a registry of your own, a global
    list. Use it right after ``dispose()`` to catch a reference that would
    keep the model's Python objects for the life of the process.

    Raises:
        ValueError: ``model`` is not a managed model.
    """
    if getattr(model, "_lifecycle", None) is None:
        raise ValueError(f"check_disposed() takes a managed model. Received: {model!r:.80}")
    _objgraph()
    _collect()
    return _report(
        _disposed_candidates([model]), max_depth=max_depth, max_chains=20, require_chain=True
    )


def leaks_among(models: Iterable[Any]) -> LeakReport:
    """Which of ``models`` leaked: still live, or disposed and reachable from a module.

    For checks around a block of code (``lifecycle.testing.no_leaks``): a
    disposed model held only by locals of the finished code is not a leak.

    Raises:
        ImportError: objgraph is not installed; the message says how to install it.
    """
    models = list(models)
    live = live_models(models)
    disposed = [m for m in models if m not in live]
    candidates = [("live", m) for m in live] + _disposed_candidates(disposed)
    report = _report(candidates, max_depth=25, max_chains=20, require_chain=False)
    leaks = tuple(leak for leak in report.leaks if leak.kind == "live" or leak.chain)
    return LeakReport(leaks, report.summarized if leaks else ())
