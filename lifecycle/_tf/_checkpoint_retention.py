"""Which checkpoints a ``tf.train.CheckpointManager`` may delete: only its keeper's own.

A ``CheckpointManager`` created on a directory picks up every checkpoint the
directory's ``checkpoint`` state file lists, and its retention
(``max_to_keep``) deletes the oldest of them first, whoever wrote them. It
keeps those candidates in a private ordered mapping, ``_maybe_delete``
(``{prefix: timestamp}``, oldest first), read and written here only.

A checkpoint taken out of it stays on disk; it leaves the list the manager
writes to the state file at its next save, as the checkpoints TensorFlow keeps
for ``keep_checkpoint_every_n_hours`` do.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterable
from typing import Any

import tensorflow as tf

from ._internal import incompatible, internal

__all__ = ["add_candidates", "retain_only", "self_check"]

_WHAT = "tf.train.CheckpointManager._maybe_delete"


def _candidates(manager: tf.train.CheckpointManager) -> collections.OrderedDict[str, Any]:
    found = internal(manager, "_maybe_delete", _WHAT)
    if not isinstance(found, collections.OrderedDict):
        raise incompatible(_WHAT, TypeError(f"expected an OrderedDict, found {type(found)}"))
    return found


def retain_only(manager: tf.train.CheckpointManager, keep: Callable[[str], bool]) -> list[str]:
    """Take the checkpoints ``keep`` refuses out of ``manager``'s retention.

    Args:
        manager: A manager, typically just created on a directory.
        keep: Whether a checkpoint prefix (absolute) stays a candidate.

    Returns:
        The prefixes taken out; their files are untouched.

    Raises:
        CompatibilityError: TensorFlow no longer keeps the candidates as read here.
    """
    candidates = _candidates(manager)
    dropped = [prefix for prefix in candidates if not keep(os.path.abspath(prefix))]
    for prefix in dropped:
        del candidates[prefix]
    return dropped


def add_candidates(
    manager: tf.train.CheckpointManager, prefixes: Iterable[tuple[str, float]]
) -> list[str]:
    """Make checkpoints candidates of ``manager``'s retention, older than its own.

    Args:
        manager: The manager.
        prefixes: ``(prefix, timestamp)`` pairs, oldest first; those already
            candidates are skipped.

    Returns:
        The prefixes added.

    Raises:
        CompatibilityError: TensorFlow no longer keeps the candidates as read here.
    """
    candidates = _candidates(manager)
    known = {os.path.abspath(prefix) for prefix in candidates}
    added = [(p, t) for p, t in prefixes if os.path.abspath(p) not in known]
    mine = list(candidates.items())
    candidates.clear()
    candidates.update(added)  # retention deletes the oldest first: these
    candidates.update(mine)
    return [prefix for prefix, _ in added]


def self_check() -> None:
    """Fail loudly unless a new manager's candidates are the ordered mapping read here."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
        tf.train.CheckpointManager(checkpoint, directory, max_to_keep=1).save()
        manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=1)
        if list(_candidates(manager)) != [manager.latest_checkpoint]:
            raise incompatible(_WHAT, AssertionError("the directory's checkpoint is no candidate"))
