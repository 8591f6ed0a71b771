"""Mechanism B: selectively purge TensorFlow's gradient registry.

Every trace of a Keras training step registers ``CustomGradient-N`` functions in
``ops._gradient_registry``. Their closures hold graph tensors, hence the
``FuncGraph``, hence its captured resource handles: the model's variables stay
pinned forever. Deleting every entry would break ``tape.gradient`` through live
models' functions, so only entries whose graph captured a handle of the model
being disposed are deleted, plus entries pinned to Keras's shape-inference
``scratch_graph`` graphs (they capture nothing and are never differentiated).
"""

from __future__ import annotations

import contextlib
import gc
import types
from collections.abc import Iterable, Iterator
from typing import Any

from tensorflow.python.framework import func_graph as func_graph_lib
from tensorflow.python.framework import ops

from ._resources import BaseResourceVariable

FuncGraph = func_graph_lib.FuncGraph

# Custom-gradient closures nest a few functions deep (internal_grad_fn ->
# tape_grad_fn -> result tensors); deeper walks only find unrelated objects.
_MAX_DEPTH = 4
_CUSTOM_GRADIENT_PREFIX = "CustomGradient-"
_SCRATCH_GRAPH_PREFIX = "scratch_graph"


def registry() -> dict[str, dict[str, Any]]:
    """The gradient registry's underlying dict: name -> {"type": fn, ...}."""
    return ops._gradient_registry._registry


def _closure_objects(root: Any) -> Iterator[Any]:
    """Objects reachable from a function's closure, a few levels deep."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    seen: set[int] = set()
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if depth >= _MAX_DEPTH:
            continue
        if isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                with contextlib.suppress(ValueError):  # an empty cell
                    stack.append((cell.cell_contents, depth + 1))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend((item, depth + 1) for item in obj)
        elif isinstance(obj, dict):
            stack.extend((item, depth + 1) for item in obj.values())


def _graphs_of(entry_fn: Any) -> tuple[list[FuncGraph], list[Any]]:
    """The func graphs and the variables an entry's closure refers to."""
    graphs: dict[int, FuncGraph] = {}
    variables = []
    for obj in _closure_objects(entry_fn):
        if isinstance(obj, BaseResourceVariable):
            variables.append(obj)
            continue
        graph = getattr(obj, "graph", None) if hasattr(obj, "op") else None
        if isinstance(graph, FuncGraph):
            graphs[id(graph)] = graph
    return list(graphs.values()), variables


def _graph_chain(graph: FuncGraph) -> Iterator[FuncGraph]:
    """The graph and the func graphs it is nested in, innermost first."""
    while isinstance(graph, FuncGraph):
        yield graph
        graph = graph.outer_graph


def purge_gradient_registry(handles: Iterable[Any]) -> int:
    """Delete registry entries that pin the given resource handles, and scratch entries.

    Args:
        handles: Handle tensors (``variable.handle``) of the buffers being
            released. They are held strongly for the duration of the call, so
            matching them by ``id()`` is sound.

    Returns:
        How many entries were deleted.
    """
    handles = list(handles)
    handle_ids = {id(handle) for handle in handles}
    entries = registry()
    doomed = []
    for name, entry in list(entries.items()):
        if not name.startswith(_CUSTOM_GRADIENT_PREFIX):
            continue
        graphs, closure_variables = _graphs_of(entry.get("type"))
        if any(id(v.handle) in handle_ids for v in closure_variables) or any(
            _pins(graph, handle_ids) for graph in graphs
        ):
            doomed.append(name)
    for name in doomed:
        entries.pop(name, None)
    return len(doomed)


def _pins(graph: FuncGraph, handle_ids: set[int]) -> bool:
    for level in _graph_chain(graph):
        if level.name.startswith(_SCRATCH_GRAPH_PREFIX):
            return True
        if any(id(t) in handle_ids for t in level.external_captures):
            return True
    return False


def custom_gradient_entries() -> int:
    """How many ``CustomGradient-*`` entries the registry holds right now."""
    return sum(1 for name in list(registry()) if name.startswith(_CUSTOM_GRADIENT_PREFIX))


def live_func_graphs() -> int:
    """Traced graphs (``FuncGraph`` objects) alive in the process; walks the GC heap."""
    return sum(1 for obj in gc.get_objects() if isinstance(obj, FuncGraph))


def func_graphs() -> list[FuncGraph]:
    """The traced graphs (``FuncGraph`` objects) alive in the process; walks the GC heap."""
    return [obj for obj in gc.get_objects() if isinstance(obj, FuncGraph)]
