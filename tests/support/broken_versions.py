"""Version directories that look complete and fail to load: failed swaps in tests."""

from __future__ import annotations

import zipfile
from pathlib import Path


def publish_broken(base: Path, version: int) -> None:
    """Publish ``version`` under ``base`` as a readable zip named ``model.keras`` that is no model.

    The registry counts it as a complete version (a readable archive) and its
    load fails (Keras finds no ``config.json``). Written aside, then renamed
    into place, as a deploy does.
    """
    aside = base / f".writing-{version}"
    aside.mkdir(parents=True)
    with zipfile.ZipFile(aside / "model.keras", "w") as archive:
        archive.writestr("notes.txt", "not a Keras archive")
    aside.rename(base / str(version))
