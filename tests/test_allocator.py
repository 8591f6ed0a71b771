"""tune_allocator(): a fixed glibc mmap threshold and trimming after collections."""

from __future__ import annotations

import pytest

import lifecycle as lc
from lifecycle._core import _malloc


@pytest.fixture
def restore_settings():
    saved = _malloc._settings
    yield
    _malloc._settings = saved


def test_tune_allocator_sets_glibc_and_cleaners_trim(restore_settings, monkeypatch):
    settings = lc.tune_allocator(mmap_threshold=128 * 1024)
    assert settings == lc.AllocatorSettings(True, 128 * 1024, True)  # Linux, glibc
    trims = []
    monkeypatch.setattr(_malloc, "trim", lambda: trims.append(1) or True)
    with lc.LifecycleSession(
        cleanup=lc.CleanupStrategy.ON_SAFE_POINTS, pressure_threshold=1, collector=lambda: None
    ) as session:
        session.cleaner.note_released(10)
        session.safe_point()
    assert trims, "the cleaner's collection did not trim"

    assert lc.tune_allocator(mmap_threshold=None, trim_after_collect=False).mmap_threshold is None
    assert not _malloc.trimming()


def test_tune_allocator_rejects_bad_thresholds():
    for bad in (0, -1, 1.5, True, "64k"):
        with pytest.raises(ValueError, match="mmap_threshold"):
            lc.tune_allocator(mmap_threshold=bad)
