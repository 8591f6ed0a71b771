"""Mechanism D: object-graph checkpoints, and the internals they need.

Three things ``tf.train.Checkpoint`` does not do for Keras 3 models:

- **Async saves past the first.** Keras's ``Variable._copy_trackable_to_cpu``
  creates a new ``tf.Variable`` on every call; TensorFlow calls it inside a
  ``tf.function`` on every save after the first, which refuses to create
  variables twice. ``fix_async_copy(variables)`` gives the variables it is
  handed (an async keeper's, nobody else's) a hook of their own that reuses
  the CPU copy of the inner variable, which TensorFlow already keeps up to
  date. Keras's class is left as it is.
- **Letting go of an async checkpointer.** The helper behind async saves keeps
  a CPU copy of every variable, a thread, and an ``atexit`` hook that holds it
  (and so the model) until the process exits. ``shutdown_async()`` flushes,
  stops the thread, unregisters the hook and releases the copies.
- **Restoring only what is sound.** ``Checkpoint.restore`` does not check the
  stored CRCs (a flipped byte restores silently) and applies what it matched
  before anyone can look at what it did not. ``verify()`` reads every tensor
  through the checkpoint reader, which does check them, and ``match()`` pairs
  the checkpoint's object graph with Python objects without restoring
  anything, so a caller can refuse a mismatch before the model changes.

``self_check()`` exercises every internal this relies on; a moved one raises
``CompatibilityError`` naming it, here and wherever the module reads it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import tempfile
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import core as keras_tf_core
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.checkpoint import async_checkpoint_helper
from tensorflow.python.ops import resource_variable_ops

from ._internal import incompatible, internal
from ._release import is_released, release

__all__ = [
    "OBJECT_GRAPH_KEY",
    "child_ids",
    "children",
    "descendants",
    "fix_async_copy",
    "match",
    "node_paths",
    "object_graph",
    "reachable",
    "self_check",
    "shutdown_async",
    "valued_nodes",
    "verify",
]

#: Key of the serialized object graph inside a TF2 checkpoint.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

# The name TensorFlow's async helper calls on each trackable, on the instance.
_HOOK = "_copy_trackable_to_cpu"


def _internal(obj: Any, name: str, owner: str) -> Any:
    """``obj.<name>``, or a CompatibilityError naming ``<owner>.<name>`` and the versions."""
    return internal(obj, name, f"{owner}.{name}")


class _HostCopy:
    """A Keras variable's own host-copy hook, called by TensorFlow's async helper.

    The inner tf.Variable creates its CPU copy once and refreshes it on each
    save; the Keras variable shares it instead of wrapping it anew. The hook
    holds its variable weakly, so it adds no reference cycle.
    """

    __slots__ = ("_variable",)

    def __init__(self, variable: Any) -> None:
        self._variable = weakref.ref(variable)

    def __call__(self, object_map: Any) -> None:
        variable = self._variable()  # alive: it is what the hook was looked up on
        variable.value._copy_trackable_to_cpu(object_map)
        object_map[variable] = object_map[variable.value]


def fix_async_copy(variables: Iterable[Any]) -> int:
    """Make async saves of these Keras 3 variables work past the first.

    Each Keras variable among ``variables`` gets, on the instance, a host-copy
    hook that reuses the CPU copy TensorFlow keeps of its inner
    ``tf.Variable``. Other objects are skipped; other variables keep Keras's
    hook. Idempotent.

    Returns:
        How many variables got the hook now.
    """
    fixed = 0
    for variable in variables:
        if isinstance(variable, keras_tf_core.Variable) and _HOOK not in vars(variable):
            setattr(variable, _HOOK, _HostCopy(variable))
            fixed += 1
    return fixed


def shutdown_async(checkpoint: tf.train.Checkpoint) -> int:
    """Flush and dismantle ``checkpoint``'s async helper, if it has one.

    Waits for the save in progress, stops the helper's thread, unregisters its
    ``atexit`` hook and releases its CPU copies of the variables.

    Returns:
        Bytes of CPU copies released.

    Raises:
        CompatibilityError: TensorFlow moved an attribute this reads.
        Exception: Whatever the last async save raised, after the cleanup.
    """
    helper = _internal(checkpoint, "_async_checkpointer_impl", "tf.train.Checkpoint")
    if helper is None:
        return 0
    owner = "AsyncCheckpointHelper"
    join = _internal(helper, "_join_async_save_thread", owner)
    initialized = _internal(helper, "_initialized", owner)
    copies = _internal(helper, "_object_map", owner)
    checkpoint._async_checkpointer_impl = None
    atexit.unregister(join)
    try:
        if initialized:
            join()  # waits for the save in progress, then ends the thread
    finally:
        copies = copies or {}
        variables = {id(v): v for v in copies.values() if isinstance(v, tf.Variable)}
        released, _ = release(variables.values())
        if copies:
            copies.clear()
    return released


def self_check() -> None:
    """Exercise every TensorFlow/Keras internal this module relies on.

    Saves a Keras variable asynchronously through TensorFlow's helper with the
    host-copy hook, reads the helper's state, dismantles it and checks that it
    can be collected; then writes a checkpoint and matches its object graph.

    Raises:
        CompatibilityError: An internal moved; the message names it and the
            installed TensorFlow and Keras versions.
    """
    if _HOOK not in vars(resource_variable_ops.BaseResourceVariable):
        raise incompatible(
            f"tf.Variable.{_HOOK}", AttributeError(f"tf.Variable defines no {_HOOK}")
        )
    join = "_join_async_save_thread"
    if not callable(getattr(async_checkpoint_helper.AsyncCheckpointHelper, join, None)):
        raise incompatible(f"AsyncCheckpointHelper.{join}", AttributeError(f"no method {join}"))
    _check_async_save()
    _check_object_graph()


def _check_async_save() -> None:
    variable = keras.Variable([1.0, 2.0])
    fix_async_copy([variable])
    checkpoint = tf.train.Checkpoint(kept=variable)
    if _internal(checkpoint, "_async_checkpointer_impl", "tf.train.Checkpoint") is not None:
        raise incompatible(
            "tf.train.Checkpoint._async_checkpointer_impl",
            AssertionError("set before any async save"),
        )
    options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    with tempfile.TemporaryDirectory() as directory:
        checkpoint.save(os.path.join(directory, "c"), options=options)
        try:
            helper_ref, copy = _check_async_helper(checkpoint, variable)
        except BaseException:
            # The save thread must finish before its directory is removed; the
            # internal that moved may be needed by either step.
            with contextlib.suppress(Exception):
                checkpoint.sync()
            with contextlib.suppress(Exception):
                shutdown_async(checkpoint)
            raise
        if shutdown_async(checkpoint) <= 0 or not is_released(copy):
            raise incompatible(
                "AsyncCheckpointHelper._object_map",
                AssertionError("the host copy was not released"),
            )
    del copy
    if helper_ref() is not None:
        gc.collect()  # only if a cycle holds it; a collection is slow with TF loaded
    if helper_ref() is not None:
        raise incompatible(
            "the atexit hook of AsyncCheckpointHelper",
            AssertionError("the helper is still referenced after shutdown_async()"),
        )


def _check_async_helper(checkpoint: tf.train.Checkpoint, variable: Any) -> tuple[Any, Any]:
    """Check the helper after one async save of ``variable``: (weak ref to it, the copy)."""
    owner = "AsyncCheckpointHelper"
    helper = _internal(checkpoint, "_async_checkpointer_impl", "tf.train.Checkpoint")
    if not isinstance(helper, async_checkpoint_helper.AsyncCheckpointHelper):
        raise incompatible(
            "tf.train.Checkpoint._async_checkpointer_impl",
            AssertionError(f"holds {type(helper).__name__}, not an {owner}"),
        )
    if _internal(helper, "_initialized", owner) is not True:
        raise incompatible(f"{owner}._initialized", AssertionError("not True after a save"))
    copies = _internal(helper, "_object_map", owner)
    try:
        copy = copies[variable]
    except (KeyError, TypeError) as error:
        raise incompatible(f"{owner}._object_map", error) from error
    if copies.get(variable.value) is not copy:
        raise incompatible(
            f"{owner} calling {_HOOK} on each variable",
            AssertionError("the Keras variable's host copy is not its inner variable's"),
        )
    # Later saves refresh the same copy, inside a tf.function.
    variable.assign([3.0, 4.0])
    getattr(variable, _HOOK)(object_map=copies)
    if copies[variable] is not copy or copy.numpy().tolist() != [3.0, 4.0]:
        raise incompatible(
            f"tf.Variable.{_HOOK}", AssertionError("the host copy is not refreshed in place")
        )
    return weakref.ref(helper), copy


def _check_object_graph() -> None:
    variable = tf.Variable([1.0, 2.0])
    with tempfile.TemporaryDirectory() as directory:
        prefix = tf.train.Checkpoint(kept=variable).write(os.path.join(directory, "c"))
        reader = verify(prefix)
        if not reader.has_tensor(OBJECT_GRAPH_KEY):
            raise incompatible(f"checkpoint key {OBJECT_GRAPH_KEY!r}", KeyError(OBJECT_GRAPH_KEY))
        graph = object_graph(reader)
    matched = match(tf.train.Checkpoint(kept=variable), graph)
    if not any(obj is variable for obj in matched.values()):
        raise incompatible("tf.train.TrackableView.children", AssertionError("no match by name"))


def verify(prefix: str) -> tf.train.CheckpointReader:
    """Read every tensor of the checkpoint at ``prefix``, checking its CRC.

    Returns:
        The checkpoint reader.

    Raises:
        tf.errors.OpError, ValueError, IndexError: the files are missing,
            truncated or corrupt (TensorFlow's own error).
    """
    reader = tf.train.load_checkpoint(prefix)
    for key in reader.get_variable_to_dtype_map():
        reader.get_tensor(key)
    return reader


def object_graph(
    reader: tf.train.CheckpointReader,
) -> trackable_object_graph_pb2.TrackableObjectGraph:
    """The object graph a TF2 checkpoint was saved with."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    return graph


def children(obj: Any) -> dict[str, Any]:
    """The named trackable children of ``obj``, as a checkpoint sees them."""
    return dict(tf.train.TrackableView.children(obj))


def descendants(obj: Any) -> list[Any]:
    """Every trackable reachable from ``obj`` (``obj`` first)."""
    return list(tf.train.TrackableView(obj).descendants())


def match(root: Any, graph: trackable_object_graph_pb2.TrackableObjectGraph) -> dict[int, Any]:
    """Pair checkpoint nodes with Python objects the way a restore would, restoring nothing.

    Node 0 is ``root``; a child node matches the parent's Python child of the
    same local name. A node reachable by several paths matches once.

    Returns:
        ``{node id: Python object}`` for every matched node.
    """
    matched: dict[int, Any] = {0: root}
    queue = deque([0])
    while queue:
        node_id = queue.popleft()
        named = children(matched[node_id])
        for reference in graph.nodes[node_id].children:
            child = named.get(reference.local_name)
            if child is not None and reference.node_id not in matched:
                matched[reference.node_id] = child
                queue.append(reference.node_id)
    return matched


def node_paths(graph: trackable_object_graph_pb2.TrackableObjectGraph) -> dict[int, str]:
    """A readable ``a/b/c`` path for every node.

    Paths go through the root's ``model`` child, and around optimizers, where
    they can: ``model/layers/1/bias`` rather than ``optimizer/_variables/3``.
    """
    models = child_ids(graph, [0], "model")
    optimizers = child_ids(graph, [0, *models], "optimizer")
    paths = {0: ""}
    for first_pass in (True, False):
        visited = {0}
        queue = deque([0])
        while queue:
            node_id = queue.popleft()
            for reference in graph.nodes[node_id].children:
                child = reference.node_id
                if child in visited or (
                    first_pass and (child in optimizers or (node_id == 0 and child not in models))
                ):
                    continue
                visited.add(child)
                if child not in paths:
                    parent = paths[node_id]
                    paths[child] = (
                        f"{parent}/{reference.local_name}" if parent else reference.local_name
                    )
                queue.append(child)
    return paths


def child_ids(
    graph: trackable_object_graph_pb2.TrackableObjectGraph, node_ids: Iterable[int], name: str
) -> set[int]:
    """Ids of the children called ``name`` of the given nodes."""
    return {
        reference.node_id
        for node_id in node_ids
        for reference in graph.nodes[node_id].children
        if reference.local_name == name
    }


def reachable(
    graph: trackable_object_graph_pb2.TrackableObjectGraph,
    starts: Iterable[int],
    avoid: Iterable[int] = (),
) -> set[int]:
    """Nodes reachable from ``starts`` (included) without entering ``avoid``."""
    blocked = set(avoid)
    seen = {n for n in starts if n not in blocked}
    queue = deque(seen)
    while queue:
        for reference in graph.nodes[queue.popleft()].children:
            if reference.node_id not in seen and reference.node_id not in blocked:
                seen.add(reference.node_id)
                queue.append(reference.node_id)
    return seen


def valued_nodes(graph: trackable_object_graph_pb2.TrackableObjectGraph) -> Iterator[int]:
    """Ids of the nodes that carry saved values."""
    return (i for i, node in enumerate(graph.nodes) if node.attributes)
