"""The models of a model repository, ``<repository>/<model>/<version>/``, by name.

Pure Python, no TensorFlow: the registry's repository watch reads it at every
scan, and the server's flag checks read it before TensorFlow is imported.
"""

from __future__ import annotations

import os

__all__ = ["repository_models"]


def repository_models(path: str) -> list[str]:
    """The model names of a repository: its directories, but dot-directories, sorted.

    A name is a directory's name, so never empty and never with ``/``: a
    valid model name. Files and dot-directories (``.git``, a model being
    written aside and renamed into place) are ignored.

    Args:
        path: The repository.

    Returns:
        The names, or ``[]`` when ``path`` is not a readable directory (removed
        meanwhile, say): the caller that needs it to exist checks that first.
    """
    try:
        entries = list(os.scandir(path))
    except OSError:
        return []
    return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())
