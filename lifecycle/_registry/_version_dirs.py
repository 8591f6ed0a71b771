"""Version directories under a base path (TensorFlow Serving's layout).

The layout is TensorFlow Serving's: ``<base>/<version>/`` holds one version,
``<version>`` a non-negative integer (any other name, ``.tmp-7`` say, is not a
version). A version directory holds, in this order of precedence:

* a SavedModel (``model.export(dir)``, ``tf.saved_model.save``): it counts once
  ``saved_model.pb`` and ``variables/variables.index`` are both there;
* one ``.keras`` archive: it counts once the file is a readable zip;
* checkpoints: they count once a ``checkpoint`` state file names one.

So a version still being written is never loaded. Which versions serve is a
:class:`~lifecycle.VersionPolicy` (``lifecycle/_core/_policies.py``, pure Python).
"""

from __future__ import annotations

import os
import zipfile
from typing import Literal

import attrs
import tensorflow as tf

from ..errors import CheckpointError

__all__ = [
    "VersionSource",
    "available_versions",
    "is_saved_model",
    "version_source",
]


@attrs.frozen
class VersionSource:
    """What a complete version directory holds.

    Attributes:
        kind: ``"saved_model"``, ``"keras"`` or ``"checkpoints"``.
        path: The SavedModel directory, the ``.keras`` file, or the directory
            of checkpoints.
    """

    kind: Literal["saved_model", "keras", "checkpoints"]
    path: str


def is_saved_model(path: str) -> bool:
    """Whether ``path`` is a complete SavedModel directory (graph and variables written)."""
    return os.path.isfile(os.path.join(path, "saved_model.pb")) and os.path.isfile(
        os.path.join(path, "variables", "variables.index")
    )


def version_source(directory: str) -> VersionSource | None:
    """What ``directory`` holds, or ``None`` while it holds no complete version.

    A directory with several ``.keras`` files is ambiguous and holds none.
    """
    if is_saved_model(directory):
        return VersionSource("saved_model", directory)
    archives = [
        entry.path
        for entry in os.scandir(directory)
        if entry.name.endswith(".keras") and entry.is_file()
    ]
    if len(archives) == 1 and _readable_zip(archives[0]):
        return VersionSource("keras", archives[0])
    if not archives and tf.train.latest_checkpoint(directory) is not None:
        return VersionSource("checkpoints", directory)
    return None


def _readable_zip(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())  # a zip still being written has no directory
    except (OSError, zipfile.BadZipFile):
        return False


def available_versions(base: str) -> list[int]:
    """Version numbers under ``base`` with a complete version directory, ascending.

    Raises:
        CheckpointError: ``base`` is not a directory.
    """
    if not os.path.isdir(base):
        raise CheckpointError(
            f"Base path {base!r} does not exist or is not a directory; expected "
            "<base>/<version>/ directories (SavedModels, .keras archives or checkpoints).",
            path=base,
        )
    found = []
    for entry in os.scandir(base):
        if entry.is_dir() and entry.name.isdigit() and version_source(entry.path) is not None:
            found.append(int(entry.name))
    return sorted(found)
