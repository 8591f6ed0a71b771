"""Checkpoints a managed model owns: retention, async saves, strict restores.

A :class:`CheckpointKeeper` wraps ``tf.train.Checkpoint`` and
``tf.train.CheckpointManager`` around one model, its optimizer and a step
counter. It belongs to the model: ``dispose()`` flushes its pending write and
drops it, with the CPU copy an async save keeps.

Restores go by object graph (mechanism D), so a checkpoint restores into a
model built under another name prefix and before its optimizer is built. They
are checked first — every tensor's CRC, every object matched — and refused
with a :class:`CheckpointError` before anything changes.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import attrs
import keras
import tensorflow as tf

from . import _tf
from ._core import ModelState
from ._record import disposed_error, held
from .errors import CheckpointError

if TYPE_CHECKING:
    from ._record import ModelRecord

__all__ = ["CheckpointKeeper", "latest_checkpoint", "restore_checkpoint"]

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


def _items(model: keras.Model, step: tf.Variable | None) -> dict[str, Any]:
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
        CheckpointError: Missing, truncated or corrupt files, a mismatch
            under ``strict``, or values for layers that are not built yet
            (build the model first). Nothing was restored.
    """
    prefix = latest_checkpoint(path)
    checkpoint = tf.train.Checkpoint(**_items(model, step))
    plan = _plan(checkpoint, model, prefix, strict=strict, verify=verify)
    checkpoint.restore(plan.prefix).expect_partial()
    return plan.prefix


class CheckpointKeeper:
    """The checkpoints of one managed model: save, keep, restore.

    Get one with :meth:`ManagedModel.checkpoints` (or ``model.checkpoints(...)``
    on a model passed through :func:`manage`). It tracks the model, its
    optimizer (looked up at each save, so compiling later is fine) and
    :attr:`step`, a counter saved with them that numbers the files
    (``ckpt-<step>``).

    Thread-safe. ``dispose()`` of the model flushes a pending async write and
    closes the keeper; so does :meth:`close`.

    Example:
        >>> keeper = model.checkpoints("/tmp/ckpts", max_to_keep=3)  # doctest: +SKIP
        >>> keeper.save()  # doctest: +SKIP
        '/tmp/ckpts/ckpt-1'
        >>> keeper.restore()  # latest  # doctest: +SKIP
        '/tmp/ckpts/ckpt-1'
    """

    def __init__(
        self,
        model: keras.Model,
        directory: str | os.PathLike[str],
        *,
        max_to_keep: int | None = 5,
        keep_every_n_hours: float | None = None,
        async_save: bool = False,
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"`directory` must be a path. Received: {directory!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise CheckpointError(
                f"Checkpoint directory {self.directory!r} exists and is not a directory.",
                path=self.directory,
            )
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1
        ):
            raise ValueError(
                f"`max_to_keep` must be a positive int or None (keep all). "
                f"Received: max_to_keep={max_to_keep!r}"
            )
        if keep_every_n_hours is not None and (
            isinstance(keep_every_n_hours, bool)
            or not isinstance(keep_every_n_hours, (int, float))
            or not keep_every_n_hours > 0
        ):
            raise ValueError(
                "`keep_every_n_hours` must be a positive number or None. "
                f"Received: keep_every_n_hours={keep_every_n_hours!r}"
            )
        self.max_to_keep = max_to_keep
        self.keep_every_n_hours = keep_every_n_hours
        self.async_save = bool(async_save)
        self._model: keras.Model | None = model
        self._lock = threading.RLock()
        with tf.init_scope(), tf.device("/CPU:0"):
            self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self._checkpoint: tf.train.Checkpoint | None = None
        self._manager: tf.train.CheckpointManager | None = None
        self._tracked_optimizer: Any = None
        self._options = None
        if self.async_save:
            _tf.checkpoint.fix_async_copy()
            self._options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)

    # -- queries ------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step counter saved with each checkpoint."""
        return int(self._step.numpy())

    @property
    def latest(self) -> str | None:
        """Prefix of the newest complete checkpoint in :attr:`directory`, or ``None``."""
        with self._lock:
            if self._manager is not None:
                self._manager.sync()
            return tf.train.latest_checkpoint(self.directory)

    def list(self) -> list[str]:
        """Prefixes of the checkpoints kept, oldest first."""
        with self._lock:
            return list(self._managed().checkpoints)

    # -- save / restore -----------------------------------------------------------

    def save(self, step: int | None = None) -> str:
        """Save the model, its optimizer and the step counter.

        Args:
            step: Set the counter to this value first; by default it grows by one.

        Returns:
            The prefix written (``<directory>/ckpt-<step>``). With
            ``async_save`` the write may still be in progress; :meth:`sync`
            waits for it.

        Raises:
            DisposedError: The model was disposed.
            ValueError: ``step`` is not an int >= 0.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"`step` must be an int >= 0. Received: step={step!r}")
        with self._using("save()"), self._lock:
            manager = self._managed()
            if step is None:
                self._step.assign_add(1)
            else:
                self._step.assign(step)
            return manager.save(checkpoint_number=self.step, options=self._options)

    def restore(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        strict: bool = True,
        verify: bool = True,
    ) -> str:
        """Restore the model, its optimizer and the step counter.

        Args:
            path: A checkpoint prefix or a directory (its latest checkpoint);
                defaults to the latest in :attr:`directory`. Any checkpoint of
                the same architecture works, whatever its name prefix.
            strict: Refuse a checkpoint that does not match the model object
                for object; see :func:`restore_checkpoint`.
            verify: Check every tensor's CRC first.

        Returns:
            The prefix restored.

        Raises:
            CheckpointError: Nothing to restore, missing, truncated or corrupt
                files, or a mismatch; the model is unchanged.
            DisposedError: The model was disposed.
        """
        with self._using("restore()"), self._lock:
            self.sync()
            model = self._require_model()
            prefix = restore_checkpoint(
                model,
                self.directory if path is None else path,
                strict=strict,
                verify=verify,
                step=self._step,
            )
            model._lifecycle.refresh(model)
            return prefix

    def sync(self) -> None:
        """Wait until a pending async write is on disk (no-op otherwise)."""
        with self._lock:
            if self._manager is not None:
                self._manager.sync()

    def close(self) -> None:
        """Flush a pending write and let go of the model; idempotent."""
        with self._lock:
            if self._model is None:
                return
            try:
                self._flush()
            finally:
                self._drop()

    # -- ownership ----------------------------------------------------------------

    def _flush(self) -> None:
        """Wait for a pending write; stop the async helper (model's dispose, step 1)."""
        with self._lock:
            if self._checkpoint is not None:
                try:
                    _tf.checkpoint.shutdown_async(self._checkpoint)
                except Exception as error:
                    raise CheckpointError(
                        f"The last async save to {self.directory!r} failed: "
                        f"{type(error).__name__}: {error}",
                        path=self.directory,
                    ) from error

    def _drop(self) -> None:
        """Let go of everything (model's dispose, after its buffers are released)."""
        with self._lock:
            model, self._model = self._model, None
            self._checkpoint = self._manager = self._tracked_optimizer = None
            if model is not None:
                keepers = getattr(model, "_lifecycle_keepers", {})
                if keepers.get(self.directory) is self:
                    del keepers[self.directory]
            _tf.release([self._step])

    def _managed(self) -> tf.train.CheckpointManager:
        model = self._require_model()
        optimizer = getattr(model, "optimizer", None)
        if self._manager is None or optimizer is not self._tracked_optimizer:
            if self._checkpoint is not None:
                _tf.checkpoint.shutdown_async(self._checkpoint)
            self._checkpoint = tf.train.Checkpoint(**_items(model, self._step))
            self._manager = tf.train.CheckpointManager(
                self._checkpoint,
                self.directory,
                max_to_keep=self.max_to_keep,
                keep_checkpoint_every_n_hours=self.keep_every_n_hours,
            )
            self._tracked_optimizer = optimizer
        return self._manager

    def _require_model(self) -> keras.Model:
        if self._model is None:
            raise CheckpointError(
                f"This checkpoint keeper of {self.directory!r} is closed (its model was "
                "disposed or close() was called). Get a new one from model.checkpoints().",
                path=self.directory,
            )
        return self._model

    def _using(self, what: str) -> Any:
        return held(self._require_model(), f"the checkpoint keeper's {what}")


def keeper_of(
    model: keras.Model,
    directory: str | os.PathLike[str],
    *,
    max_to_keep: int | None,
    keep_every_n_hours: float | None,
    async_save: bool,
) -> CheckpointKeeper:
    """The keeper of ``model`` for ``directory``: the existing one, or a new one."""
    record: ModelRecord = model._lifecycle
    if record.state is not ModelState.LIVE:
        raise disposed_error(model, "model.checkpoints()")
    keepers: dict[str, CheckpointKeeper] = model.__dict__.setdefault("_lifecycle_keepers", {})
    key = os.path.abspath(os.fspath(directory))
    with record.accounting_lock:
        keeper = keepers.get(key)
        if keeper is None:
            keeper = CheckpointKeeper(
                model,
                directory,
                max_to_keep=max_to_keep,
                keep_every_n_hours=keep_every_n_hours,
                async_save=async_save,
            )
            keepers[key] = keeper
            record.dependents.add(keeper)
            return keeper
    wanted = (max_to_keep, keep_every_n_hours, bool(async_save))
    have = (keeper.max_to_keep, keeper.keep_every_n_hours, keeper.async_save)
    if wanted != have:
        raise ValueError(
            f"{record.describe()} already has a checkpoint keeper for {key!r} with "
            f"max_to_keep={have[0]}, keep_every_n_hours={have[1]}, async_save={have[2]}; "
            f"received {wanted[0]}, {wanted[1]}, {wanted[2]}. Close it first to change them."
        )
    return keeper
