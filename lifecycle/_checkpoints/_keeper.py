"""CheckpointKeeper: the checkpoints a managed model owns, saved, kept and restored.

A keeper wraps ``tf.train.Checkpoint`` and ``tf.train.CheckpointManager``
around one model, its optimizer and a step counter. It belongs to the model:
the model's record lists it, and ``dispose()`` flushes its pending write and
drops it, with the CPU copy an async save keeps.

Nothing another run wrote is lost. A keeper never writes a checkpoint name
that exists in its directory: it numbers after the highest one there. Its
retention deletes only the checkpoints it wrote (or adopted with
:meth:`CheckpointKeeper.adopt_existing`). From its first save until it closes
it holds an exclusive lock on the directory (``flock`` on a file in it, which
the kernel releases if the process dies), so a second keeper, in this process
or another, cannot save there meanwhile.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import TYPE_CHECKING, Any, cast

import keras
import tensorflow as tf

from .. import _tf
from .._core import ModelState, check_optional_int
from .._disposal import disposed_error, held
from .._tf import checkpoint_retention as retention
from ..errors import CheckpointError, ClosedError, CompatibilityError
from ._restore import checkpoint_items, restore_checkpoint

if TYPE_CHECKING:
    from .._disposal import ModelRecord

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, no refusal
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "CheckpointKeeper", "keeper_of"]

_log = logging.getLogger("lifecycle.checkpoints")

#: The file in a checkpoint directory a saving keeper holds an exclusive lock on.
LOCK_FILE = ".keeper.lock"
# The files of checkpoint N as tf.train.CheckpointManager names them, and the
# directory a save in progress (or killed) writes first: a number never reused.
_NUMBERED = re.compile(r"ckpt-(\d+)(?:\.index|\.data-\d+-of-\d+|_temp)\Z")


class CheckpointKeeper:
    """The checkpoints of one managed model: save, keep, restore.

    Get one with :meth:`ManagedModel.checkpoints` (or ``model.checkpoints(...)``
    on a model passed through :func:`manage`). It tracks the model, its
    optimizer (looked up at each save, so compiling later is fine) and
    :attr:`step`, a counter saved with them that numbers the files
    (``ckpt-<step>``).

    A directory that already holds checkpoints (an earlier run's) loses none:
    saves number after the highest checkpoint there, and an explicit ``step``
    that names an existing checkpoint is refused. Retention (``max_to_keep``)
    deletes only this keeper's checkpoints, unless it continues the run: a
    keeper that restored a checkpoint of its own directory (:meth:`restore`),
    or was told to with :meth:`adopt_existing`, counts the directory's
    checkpoints as its own, as ``tf.train.CheckpointManager`` does. From its
    first save until it closes, the keeper holds an exclusive lock on the
    directory: another keeper saving there, in this process or another, gets
    a :class:`CheckpointError` naming the holder's process id.

    Thread-safe. ``dispose()`` of the model flushes a pending async write and
    closes the keeper (releasing the lock); so does :meth:`close`.

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
        # Absolute prefixes this keeper wrote or adopted: the only ones its
        # retention may delete. Numbers of its saves, pending async ones too.
        self._own: set[str] = set()
        self._numbers: set[int] = set()
        # Restored from its own directory: the first save adopts the run's checkpoints.
        self._continuing = False
        # The open lock file, from the first save until the keeper closes.
        self._held: int | None = None
        self._options = None
        if self.async_save:
            self._options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)

    # -- queries ------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step counter saved with each checkpoint.

        Raises:
            ClosedError: The keeper is closed: the counter was released with it.
        """
        with self._lock:  # close() releases the counter under the same lock
            self._require_model()
            return int(self._step.numpy())

    @property
    def latest(self) -> str | None:
        """Prefix of the newest complete checkpoint in :attr:`directory`, or ``None``."""
        with self._lock:
            if self._manager is not None:
                self._manager.sync()
            return tf.train.latest_checkpoint(self.directory)

    def list(self) -> list[str]:
        """Prefixes of this keeper's checkpoints kept (written or adopted), oldest first."""
        with self._lock:
            return list(self._managed().checkpoints)

    # -- save / restore -----------------------------------------------------------

    def save(self, step: int | None = None) -> str:
        """Save the model, its optimizer and the step counter.

        Args:
            step: Set the counter to this value first; by default it grows by
                one, and past the highest checkpoint number in the directory
                (another run's), so that no checkpoint is overwritten.

        Returns:
            The prefix written (``<directory>/ckpt-<step>``). With
            ``async_save`` the write may still be in progress; :meth:`sync`
            waits for it.

        Raises:
            ClosedError: The keeper is closed (:meth:`close`, or its model's dispose).
            ValueError: ``step`` is not an int >= 0.
            CheckpointError: ``<directory>/ckpt-<step>`` exists already, or
                another keeper is saving to the directory (the message names
                its process); nothing was written.
        """
        check_optional_int(step, "step")
        with self._using("save()"), self._lock:
            self._hold_directory()
            manager = self._managed()
            if self._continuing:
                self._adopt(manager)
            taken = self._taken()
            highest = max(taken, default=0)
            if step is None:
                number = max(self.step, highest) + 1
                if number > self.step + 1:
                    _log.info(
                        "Checkpoint directory %r holds checkpoints up to ckpt-%d that this "
                        "keeper did not write; saving ckpt-%d after them (they are kept).",
                        self.directory,
                        highest,
                        number,
                    )
            elif step in taken:
                raise CheckpointError(
                    f"Checkpoint {os.path.join(self.directory, f'ckpt-{step}')!r} exists "
                    "already, and a keeper never overwrites a checkpoint (it may be another "
                    f"run's). Received: step={step}. Save with step=None to number after "
                    f"the highest (ckpt-{highest}), or with a step not taken.",
                    path=self.directory,
                )
            else:
                number = step
            if self.async_save:
                # Only this keeper's variables, including any created since
                # the last save (an optimizer's slots), copy the fixed way.
                _tf.checkpoint.fix_async_copy(_tf.checkpoint.descendants(self._checkpoint))
            self._step.assign(number)
            self._numbers.add(number)
            prefix = manager.save(checkpoint_number=number, options=self._options)
            self._own.add(os.path.abspath(prefix))
            return prefix

    def adopt_existing(self) -> list[str]:
        """Make the checkpoints already in :attr:`directory` this keeper's, for retention.

        By default retention (``max_to_keep``) deletes only the checkpoints
        this keeper wrote: an earlier run's stay (a keeper that restored a
        checkpoint of its directory adopts them at its next save). After this
        call the complete checkpoints in the directory count as this keeper's
        too, older than its own, as ``tf.train.CheckpointManager`` counts
        every checkpoint its directory lists: the following saves delete the
        oldest once more than ``max_to_keep`` are kept.

        Returns:
            The prefixes adopted now, oldest first.

        Raises:
            ClosedError: The keeper is closed (:meth:`close`, or its model's dispose).
            CheckpointError: Another keeper is saving to the directory (the
                message names its process).

        Example:
            >>> keeper = model.checkpoints("runs/risk", max_to_keep=3)  # doctest: +SKIP
            >>> keeper.adopt_existing()  # an earlier run's, pruned from now on  # doctest: +SKIP
            ['runs/risk/ckpt-6', 'runs/risk/ckpt-7']
            >>> keeper.save()  # doctest: +SKIP
            'runs/risk/ckpt-8'
        """
        with self._using("adopt_existing()"), self._lock:
            self._hold_directory()
            return self._adopt(self._managed())

    def _adopt(self, manager: tf.train.CheckpointManager) -> list[str]:
        """:meth:`adopt_existing`, with the lock held."""
        self._continuing = False
        found = {
            os.path.join(self.directory, f"ckpt-{number}")
            for number in self._taken()
            if os.path.exists(os.path.join(self.directory, f"ckpt-{number}.index"))
        }
        state = tf.train.get_checkpoint_state(self.directory)
        if state is not None:  # listed under another name prefix, say
            found |= {
                os.path.abspath(p)
                for p in state.all_model_checkpoint_paths
                if os.path.exists(p + ".index")
            }
        others = sorted(
            ((p, os.path.getmtime(p + ".index")) for p in found - self._own),
            key=lambda pair: (pair[1], _number(pair[0])),  # oldest first
        )
        adopted = retention.add_candidates(manager, others)
        self._own.update(os.path.abspath(p) for p in adopted)
        return adopted

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
            ClosedError: The keeper is closed (:meth:`close`, or its model's dispose).
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
            if os.path.dirname(os.path.abspath(prefix)) == self.directory:
                # Continuing the run found here: its checkpoints become this
                # keeper's at the next save (which takes the directory's lock).
                self._continuing = True
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
            self._release_directory()

    def _hold_directory(self) -> None:
        """Take the directory's exclusive lock (once), or refuse naming its holder.

        ``flock`` locks belong to an open file description: another keeper of
        this process opens its own and is refused like one of another
        process. The kernel releases the lock when the process dies.

        Raises:
            CheckpointError: Another keeper holds the lock, or the file system
                refuses locks.
        """
        if self._held is not None or fcntl is None:
            return
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, LOCK_FILE)
        held = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(held, 64, 0).decode("ascii", "replace").strip()
            os.close(held)
            if holder == str(os.getpid()):
                holder += ", this process"
            raise CheckpointError(
                f"Checkpoint directory {self.directory!r} is being saved to by another "
                f"checkpoint keeper (process {holder or 'unknown'}); two keepers saving "
                "to one directory would overwrite and delete each other's checkpoints. "
                "Close that keeper (or dispose its model) first, or save to another "
                "directory.",
                path=self.directory,
            ) from None
        except OSError as error:  # a file system without locks, say
            os.close(held)
            raise CheckpointError(
                f"Cannot lock checkpoint directory {self.directory!r} ({error}): a keeper "
                "saves only where no other keeper can save meanwhile. Save to a directory "
                "on a file system with flock().",
                path=self.directory,
            ) from error
        except BaseException:
            os.close(held)
            raise
        os.ftruncate(held, 0)
        os.pwrite(held, f"{os.getpid()}\n".encode("ascii"), 0)
        self._held = held

    def _release_directory(self) -> None:
        """Let go of the directory's lock, if held (idempotent)."""
        held, self._held = self._held, None
        if held is not None:
            os.ftruncate(held, 0)  # before unlocking: a next holder writes its own id
            os.close(held)  # releases the lock

    def _taken(self) -> set[int]:
        """Checkpoint numbers in use: files in the directory, and this keeper's saves."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            names = []
        found = {int(m.group(1)) for name in names if (m := _NUMBERED.match(name))}
        return found | self._numbers  # a pending async save has no file yet

    def _managed(self) -> tf.train.CheckpointManager:
        model = self._require_model()
        optimizer = getattr(model, "optimizer", None)
        if self._manager is None or optimizer is not self._tracked_optimizer:
            if self._checkpoint is not None:
                _tf.checkpoint.shutdown_async(self._checkpoint)
            self._checkpoint = tf.train.Checkpoint(**checkpoint_items(model, self._step))
            manager = tf.train.CheckpointManager(
                self._checkpoint,
                self.directory,
                max_to_keep=self.max_to_keep,
                keep_checkpoint_every_n_hours=self.keep_every_n_hours,
            )
            # The manager picked up every checkpoint the directory lists; its
            # retention deletes only this keeper's (written or adopted). Not
            # used unless that worked.
            own = self._own
            retention.retain_only(manager, lambda prefix: prefix in own)
            self._manager, self._tracked_optimizer = manager, optimizer
        return self._manager

    def _require_model(self) -> keras.Model:
        if self._model is None:
            raise ClosedError(
                f"This checkpoint keeper of {self.directory!r} is closed (its model was "
                "disposed or close() was called). Open a new one with model.checkpoints() on a "
                "live model."
            )
        return self._model

    def _using(self, what: str) -> Any:
        return held(self._require_model(), f"the checkpoint keeper's {what}")


def _number(prefix: str) -> int:
    """The number a checkpoint prefix ends with (``ckpt-7``: 7), or -1."""
    found = re.search(r"-(\d+)\Z", prefix)
    return int(found.group(1)) if found else -1


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
