"""Restores that are checked first: CRCs, then an object-graph match, then the restore.

Restores go by object graph (mechanism D), so a checkpoint restores into a
model built under another name prefix and before its optimizer is built. They
are checked first — every tensor's CRC, every object matched, every shape
compared — and refused with a :class:`CheckpointError` before anything
changes.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import keras
import tensorflow as tf

from .. import _tf
from ..errors import CheckpointError

__all__ = ["checkpoint_items", "latest_checkpoint", "restore_checkpoint"]

# Root children that are bookkeeping, never model state.
_BOOKKEEPING = frozenset({"save_counter", "step"})


@attrs.frozen
class _Plan:
    """What a restore would do, worked out before it does anything."""

    prefix: str
    deferred: int


def latest_checkpoint(path: str | os.PathLike[str]) -> str:
    """The checkpoint prefix ``path`` names: itself, or the latest in a directory.

    Raises:
        CheckpointError: Nothing at ``path``, or a directory without a
            complete checkpoint.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        prefix = tf.train.latest_checkpoint(path)
        if prefix is None:
            raise CheckpointError(
                f"No complete checkpoint in directory {path!r}: it has no 'checkpoint' "
                "state file naming one (a save that never finished leaves none).",
                path=path,
            )
        return prefix
    if os.path.exists(path + ".index"):
        return path
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise CheckpointError(
            f"No checkpoint at {path!r}: directory {parent!r} does not exist.", path=path
        )
    raise CheckpointError(
        f"No checkpoint at {path!r}: neither a directory nor a checkpoint prefix "
        f"(no file {path + '.index'!r}).",
        path=path,
    )


def checkpoint_items(model: keras.Model, step: tf.Variable | None) -> dict[str, Any]:
    """What a checkpoint of ``model`` holds: the model, its optimizer if any, ``step``."""
    items: dict[str, Any] = {"model": model}
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        items["optimizer"] = optimizer
    if step is not None:
        items["step"] = step
    return items


def _plan(
    checkpoint: tf.train.Checkpoint, model: keras.Model, prefix: str, *, strict: bool, verify: bool
) -> _Plan:
    """Check ``prefix`` against ``checkpoint``'s objects; raise before any change."""
    try:
        reader = _tf.checkpoint.verify(prefix) if verify else tf.train.load_checkpoint(prefix)
        graph = _tf.checkpoint.object_graph(reader)
    except (tf.errors.OpError, ValueError, IndexError, OSError) as error:
        raise CheckpointError(
            f"Checkpoint {prefix!r} (files {prefix}.index and {prefix}.data-*) is truncated "
            f"or corrupt: {type(error).__name__}: {str(error).strip()[:300]}. Nothing was "
            "restored.",
            path=prefix,
        ) from error
    matched = _tf.checkpoint.match(checkpoint, graph)
    paths = _tf.checkpoint.node_paths(graph)
    optimizer = getattr(model, "optimizer", None)
    # Values that wait for an optimizer that is not built (or absent: a
    # weights-only restore). The optimizer hangs off the root and off the
    # model; the model's own variables are reachable without passing through it.
    ckpt = _tf.checkpoint
    models = ckpt.child_ids(graph, [0], "model")
    optimizers = ckpt.child_ids(graph, [0, *models], "optimizer")
    everything = ckpt.reachable(graph, [0])
    waiting: set[int] = set()
    if optimizer is None or not optimizer.built:
        waiting |= everything - ckpt.reachable(graph, [0], avoid=optimizers)
    valued = list(_tf.checkpoint.valued_nodes(graph))
    shapes = reader.get_variable_to_shape_map()
    conflicts = tuple(
        sorted(
            f"{_describe(obj)} (checkpoint {tuple(saved)}, model {tuple(obj.shape)})"
            for n in valued
            if (obj := matched.get(n)) is not None
            and isinstance(obj, (tf.Variable, keras.Variable))
            and (saved := shapes.get(graph.nodes[n].attributes[0].checkpoint_key)) is not None
            and tuple(saved) != tuple(obj.shape)
        )
    )
    if conflicts:
        raise CheckpointError(
            f"Checkpoint {prefix!r} does not fit {type(model).__name__} {model.name!r}: "
            f"{len(conflicts)} value(s) have another shape: {', '.join(conflicts[:20])}. "
            "Nothing was restored.",
            path=prefix,
            unexpected=conflicts,
        )
    unmatched = [n for n in valued if n not in matched]
    _refuse_unbuilt_layers(model, prefix, graph, matched, set(unmatched), optimizers, paths)
    deferred = [n for n in unmatched if n in waiting]
    if not strict:
        return _Plan(prefix=prefix, deferred=len(deferred))
    unexpected = tuple(
        sorted(
            paths.get(n, f"<node {n}>")
            for n in unmatched
            if n not in waiting and paths.get(n, "").split("/")[0] not in _BOOKKEEPING
        )
    )
    found = {id(obj) for obj in matched.values()}
    missing = tuple(
        sorted(
            _describe(obj)
            for name, obj in _tf.checkpoint.children(checkpoint).items()
            if name not in _BOOKKEEPING
            for obj in [obj, *_tf.checkpoint.descendants(obj)]
            if isinstance(obj, (tf.Variable, keras.Variable)) and id(obj) not in found
        )
    )
    if missing or unexpected:
        lines = []
        if missing:
            lines.append(f"missing from the checkpoint ({len(missing)}): {', '.join(missing[:20])}")
        if unexpected:
            lines.append(
                f"in the checkpoint but not in the model ({len(unexpected)}): "
                f"{', '.join(unexpected[:20])}"
            )
        raise CheckpointError(
            f"Checkpoint {prefix!r} does not match {type(model).__name__} {model.name!r}; "
            + "; ".join(lines)
            + ". Nothing was restored. Pass strict=False to restore what matches.",
            path=prefix,
            missing=missing,
            unexpected=unexpected,
        )
    return _Plan(prefix=prefix, deferred=len(deferred))


def _refuse_unbuilt_layers(
    model: keras.Model,
    prefix: str,
    graph: Any,
    matched: dict[int, Any],
    unmatched: set[int],
    optimizers: set[int],
    paths: dict[int, str],
) -> None:
    """Refuse values that would wait for the variables of a layer not built yet.

    TensorFlow restores a value whose variable does not exist yet when the
    variable is tracked (a deferred restore). That is exact for optimizer
    slots, but not for layers: Keras builds a layer without a ``build()`` of
    its own (a subclassed model, a custom layer) by tracing its ``call()``
    symbolically, where a new variable has no storage yet. The restore fails
    there, Keras swallows the error and builds the inner layers again with
    fresh variables that nothing restores any more, and the first ones stay
    in ``weights``. The model then computes with initial values.
    """
    pending: dict[str, list[str]] = {}
    for node, obj in matched.items():
        if isinstance(obj, keras.Layer) and not obj.built:
            waiting = _tf.checkpoint.reachable(graph, [node], avoid=optimizers) & unmatched
            if waiting:
                pending[obj.name] = sorted(paths.get(n, f"<node {n}>") for n in waiting)
    if not pending:
        return
    values = tuple(sorted({path for waiting in pending.values() for path in waiting}))
    raise CheckpointError(
        f"Checkpoint {prefix!r} has {len(values)} value(s) for layers of "
        f"{type(model).__name__} {model.name!r} that are not built yet "
        f"({', '.join(sorted(pending)[:10])}): their variables do not exist, and "
        "Keras would create them where TensorFlow cannot restore into them, so the "
        "model would compute with initial values. Build the model first (call it on a "
        "sample input, or model.build(input_shape)), then restore; "
        "ModelRegistry.load() does this with its warmup= sample. Nothing was restored.",
        path=prefix,
        unexpected=values,
    )


def _describe(obj: Any) -> str:
    return str(getattr(obj, "path", None) or getattr(obj, "name", None) or repr(obj))


def restore_checkpoint(
    model: keras.Model,
    path: str | os.PathLike[str],
    *,
    strict: bool = True,
    verify: bool = True,
    step: tf.Variable | None = None,
) -> str:
    """Restore ``model`` (and its optimizer) from a checkpoint, checked first.

    Args:
        model: The model to restore into, built (its variables exist). Its
            optimizer, if it has one, is restored too — at once if built,
            otherwise when it builds.
        path: A checkpoint prefix, or a directory (its latest checkpoint).
        strict: Refuse a checkpoint with values for objects the model lacks, or
            without values for objects it has (values for an optimizer that is
            absent or not built yet are not a mismatch).
        verify: Read every tensor first and check its CRC; without it a corrupt
            file can restore garbage silently.
        step: A step counter to restore alongside, if the checkpoint has one.

    Returns:
        The prefix restored.

    Raises:
        CompatibilityError: The installed TensorFlow or Keras moved an
            internal the check relies on (see :func:`check_compatibility`).
        CheckpointError: Missing, truncated or corrupt files, a mismatch
            under ``strict``, or values for layers that are not built yet
            (build the model first). Nothing was restored.
    """
    _tf.check_compatibility()
    prefix = latest_checkpoint(path)
    checkpoint = tf.train.Checkpoint(**checkpoint_items(model, step))
    plan = _plan(checkpoint, model, prefix, strict=strict, verify=verify)
    checkpoint.restore(plan.prefix).expect_partial()
    return plan.prefix
