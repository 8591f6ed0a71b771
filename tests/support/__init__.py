"""Helpers shared by the test modules: models, servers, waits.

Test modules import from here (``from support.models import constant``), never
from one another; fixtures shared by several modules live in ``conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root: child processes run there."""
