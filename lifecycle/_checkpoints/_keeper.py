"""CheckpointKeeper: the checkpoints a managed model owns, saved, kept and restored.

A keeper wraps ``tf.train.Checkpoint`` and ``tf.train.CheckpointManager``
around one model, its optimizer and a step counter. It belongs to the model:
the model's record lists it, and ``dispose()`` flushes its pending write and
drops it, with the CPU copy an async save keeps.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, cast

import keras
import tensorflow as tf

from .. import _tf
from .._core import ModelState, check_optional_int
from .._disposal import disposed_error, held
from ..errors import CheckpointError, CompatibilityError
from ._restore import checkpoint_items, restore_checkpoint

if TYPE_CHECKING:
    from .._disposal import ModelRecord

__all__ = ["CheckpointKeeper", "keeper_of"]


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
        check_optional_int(max_to_keep, "max_to_keep", minimum=1)
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
        check_optional_int(step, "step")
        with self._using("save()"), self._lock:
            manager = self._managed()
            if self.async_save:
                # Only this keeper's variables, including any created since
                # the last save (an optimizer's slots), copy the fixed way.
                _tf.checkpoint.fix_async_copy(_tf.checkpoint.descendants(self._checkpoint))
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
                files, a mismatch, or a model that is not built yet; the model
                is unchanged.
            CompatibilityError: An internal the checks rely on has moved.
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
                except CompatibilityError:
                    raise
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
            record: ModelRecord | None = getattr(model, "_lifecycle", None)
            if record is not None:
                with record.keepers_lock:
                    if record.keepers.get(self.directory) is self:
                        del record.keepers[self.directory]
            _tf.release([self._step])

    def _managed(self) -> tf.train.CheckpointManager:
        model = self._require_model()
        optimizer = getattr(model, "optimizer", None)
        if self._manager is None or optimizer is not self._tracked_optimizer:
            if self._checkpoint is not None:
                _tf.checkpoint.shutdown_async(self._checkpoint)
            self._checkpoint = tf.train.Checkpoint(**checkpoint_items(model, self._step))
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
    with record.keepers_lock:
        if record.state is not ModelState.LIVE:
            raise disposed_error(model, "model.checkpoints()")
        key = os.path.abspath(os.fspath(directory))
        # The record knows its keepers as `Keeper`s; they are all this class.
        keeper = cast("CheckpointKeeper | None", record.keepers.get(key))
        created = keeper is None
        if keeper is None:
            keeper = CheckpointKeeper(
                model,
                directory,
                max_to_keep=max_to_keep,
                keep_every_n_hours=keep_every_n_hours,
                async_save=async_save,
            )
            record.keepers[key] = keeper
            record.dependents.add(keeper)
    if created:
        # dispose() marks the model before it drops its dependents: a keeper
        # added after that mark may have been missed, so it closes itself.
        if record.state is not ModelState.LIVE:
            keeper.close()
            raise disposed_error(model, "model.checkpoints()")
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
