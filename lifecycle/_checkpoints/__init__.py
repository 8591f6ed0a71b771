"""Checkpoints a managed model owns: retention, async saves, strict restores.

- ``_restore``: checked restores (CRCs, object-graph match, shapes) and
  :func:`restore_checkpoint` / :func:`latest_checkpoint`.
- ``_keeper``: :class:`CheckpointKeeper`, the keeper a model owns, and
  :func:`keeper_of`, which finds or opens it through the model's record.
"""

from __future__ import annotations

from ._keeper import CheckpointKeeper as CheckpointKeeper
from ._keeper import keeper_of as keeper_of
from ._restore import latest_checkpoint as latest_checkpoint
from ._restore import restore_checkpoint as restore_checkpoint

__all__ = ["CheckpointKeeper", "keeper_of", "latest_checkpoint", "restore_checkpoint"]
