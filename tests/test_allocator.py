"""tune_allocator(): a fixed glibc mmap threshold and trimming after collections."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
        session.cleaner.note_allocated(10)  # a collection is due
        session.safe_point()
    assert trims, "the cleaner's collection did not trim"

    assert lc.tune_allocator(mmap_threshold=None, trim_after_collect=False).mmap_threshold is None
    assert not _malloc.trimming()


def test_tune_allocator_rejects_bad_thresholds():
    for bad in (0, -1, 1.5, True, "64k"):
        with pytest.raises(ValueError, match="mmap_threshold"):
            lc.tune_allocator(mmap_threshold=bad)


def big_model(units=8192):
    """A managed Dense model whose weights (32 MiB + bias) pass the default trim threshold."""
    import keras

    inputs = keras.Input((1024,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(units)(inputs))
    assert model.owned_bytes >= lc.DEFAULT_TRIM_THRESHOLD
    return model


def test_a_large_dispose_trims_by_default_on_the_cleaner_thread():
    with lc.LifecycleSession() as session:
        assert session.trim_threshold == lc.DEFAULT_TRIM_THRESHOLD
        big_model().dispose()
        assert session.cleaner.wait_idle(30)
        stats = session.cleaner.statistics()
        # Well under the pressure threshold: a trim without a collection.
        assert (stats.trims, stats.collections) == (1, 0)
    assert lc.current_session().cleaner.trim_threshold == lc.DEFAULT_TRIM_THRESHOLD


@pytest.mark.parametrize("collect", [None, True, False])
def test_no_trim_when_turned_off(collect):
    with lc.LifecycleSession(trim_threshold=None) as session:
        big_model().dispose(collect=collect)
        assert session.cleaner.wait_idle(30)
        assert session.cleaner.statistics().trims == 0


@pytest.mark.parametrize("collect", [None, True, False])
def test_safe_points_trim_at_the_next_safe_point_whatever_collect_says(collect):
    with lc.LifecycleSession(cleanup=lc.CleanupStrategy.ON_SAFE_POINTS) as session:
        big_model().dispose(collect=collect)
        assert session.cleaner.statistics().trims == 0
        session.safe_point()
        assert session.cleaner.statistics().trims == 1


def test_trim_threshold_is_checked():
    for bad in (0, -1, 1.5, "32M"):
        with pytest.raises((TypeError, ValueError), match="trim_threshold"):
            lc.LifecycleSession(trim_threshold=bad)


# A child process: a warm-up model, then a model of many ~88 KiB buffers (below
# glibc's mmap threshold, so they live in the heap), each followed by a small
# live block so that glibc cannot shrink the heap's top by itself. Prints the
# RSS returned between the model built and the model disposed, and its bytes.
RSS_CHILD = """
import sys
import keras
import lifecycle as lc
from lifecycle._tf import memory

keep = []


def build():
    inputs = keras.Input((150,))
    x = inputs
    for _ in range(300):
        x = keras.layers.Dense(150)(x)
        keep.append(bytearray(8192))
    return lc.ManagedModel(inputs, x)


threshold = lc.DEFAULT_TRIM_THRESHOLD if sys.argv[1] == "on" else None
with lc.LifecycleSession(trim_threshold=threshold) as session:
    build().dispose(collect=True)
    session.cleaner.wait_idle(60)
    model = build()
    nbytes, built = model.owned_bytes, memory.rss_bytes()
    model.dispose(collect=True)
    session.cleaner.wait_idle(60)
    print("RESULT", built - memory.rss_bytes(), nbytes)
"""


def returned_by_dispose(trim: str) -> tuple[int, int]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(lc.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    result = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, trim],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULT"))
    returned, nbytes = map(int, line.split()[1:])
    return returned, nbytes


@pytest.mark.subprocess
@pytest.mark.slow
def test_rss_goes_back_to_the_system_after_dispose_by_default():
    # Measured (2 runs each, model 27.2 MB): with the default trim, 34.1 MB went
    # back (the model and the warm-up's heap); with trim_threshold=None, -0.6 MB
    # (glibc kept it all). The bounds sit at half and a quarter of the model.
    returned, nbytes = returned_by_dispose("on")
    assert returned >= nbytes // 2, (returned, nbytes)
    returned, nbytes = returned_by_dispose("off")
    assert returned < nbytes // 4, (returned, nbytes)


# A child process: with oneDNN on, allocates a 64 MiB tensor, drops it and prints
# how many of its bytes glibc still has mapped (``mallinfo2().hblkhd``).
POOL_CHILD = """
import ctypes, ctypes.util
import tensorflow as tf
from tensorflow.python.util import _pywrap_util_port


class MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL(ctypes.util.find_library("c"))
if not _pywrap_util_port.IsMklEnabled() or not hasattr(libc, "mallinfo2"):
    print("RESULT skip")
    raise SystemExit
libc.mallinfo2.restype = MallInfo2
before = libc.mallinfo2().hblkhd
tensor = tf.ones([16 * 1024 * 1024], dtype=tf.float32)
del tensor
print("RESULT", libc.mallinfo2().hblkhd - before)
"""


def mapped_after_drop(**settings: str) -> int:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"):
        env.pop(name, None)
    env.update(settings)
    result = subprocess.run(
        [sys.executable, "-c", POOL_CHILD], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULT"))
    if line == "RESULT skip":
        pytest.skip("oneDNN is off in this TensorFlow build, or glibc has no mallinfo2")
    return int(line.split()[1])


@pytest.mark.subprocess
def test_onednn_pools_released_blocks_unless_told_to_use_the_system_allocator():
    # What docs/sweeps.md tells sweep users, checked against TensorFlow itself:
    # with oneDNN on (the default on x86 Linux), TensorFlow's CPU allocator keeps a
    # dropped 64 MiB block mapped; TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 frees it.
    block = 64 * 1024 * 1024
    assert mapped_after_drop() >= block
    assert mapped_after_drop(TF_ONEDNN_USE_SYSTEM_ALLOCATOR="1") < block // 16
