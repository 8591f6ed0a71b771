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
    settings = lc.tuning.tune_allocator(mmap_threshold=128 * 1024)
    assert settings == lc.tuning.AllocatorSettings(True, 128 * 1024, True)  # Linux, glibc
    trims = []
    monkeypatch.setattr(_malloc, "trim", lambda: trims.append(1) or True)
    with lc.LifecycleSession(
        cleanup=lc.CleanupStrategy.ON_SAFE_POINTS, pressure_threshold=1, collector=lambda: None
    ) as session:
        session.cleaner.note_allocated(10)  # a collection is due
        session.safe_point()
    assert trims, "the cleaner's collection did not trim"

    untuned = lc.tuning.tune_allocator(mmap_threshold=None, trim_after_collect=False)
    assert untuned.mmap_threshold is None
    assert not _malloc.trimming()


def test_tune_allocator_rejects_bad_thresholds():
    for bad in (0, -1, 1.5, True, "64k"):
        with pytest.raises(ValueError, match="mmap_threshold"):
            lc.tuning.tune_allocator(mmap_threshold=bad)


def big_model(units=8192):
    """A managed Dense model whose weights (32 MiB + bias) pass the default trim threshold."""
    import keras

    inputs = keras.Input((1024,))
    model = lc.ManagedModel(inputs, keras.layers.Dense(units)(inputs))
    assert model.owned_bytes >= lc.tuning.DEFAULT_TRIM_THRESHOLD
    return model


def test_a_large_dispose_trims_by_default_on_the_cleaner_thread():
    with lc.LifecycleSession() as session:
        assert session.trim_threshold == lc.tuning.DEFAULT_TRIM_THRESHOLD
        big_model().dispose()
        assert session.cleaner.wait_idle(30)
        stats = session.cleaner.statistics()
        # Well under the pressure threshold: a trim without a collection.
        assert (stats.trims, stats.collections) == (1, 0)
    assert lc.current_session().cleaner.trim_threshold == lc.tuning.DEFAULT_TRIM_THRESHOLD


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


threshold = lc.tuning.DEFAULT_TRIM_THRESHOLD if sys.argv[1] == "on" else None
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
@pytest.mark.slow  # the fast lane keeps an allocator child
def test_onednn_pools_released_blocks_unless_told_to_use_the_system_allocator():
    # What docs/sweeps.md tells sweep users, checked against TensorFlow itself:
    # with oneDNN on (the default on x86 Linux), TensorFlow's CPU allocator keeps a
    # dropped 64 MiB block mapped; TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 frees it.
    block = 64 * 1024 * 1024
    assert mapped_after_drop() >= block
    assert mapped_after_drop(TF_ONEDNN_USE_SYSTEM_ALLOCATOR="1") < block // 16


# -- the allocator choice (LIFECYCLE_ALLOCATOR, --allocator) -------------------------------


def test_a_choice_after_tensorflow_started_changes_nothing_and_says_why(monkeypatch):
    from lifecycle._core import _allocator

    monkeypatch.setattr(_allocator, "_choice", _allocator._choice)
    environ: dict[str, str] = {}
    choice = _allocator.use_allocator("system", environ=environ)
    assert not choice.applied and environ == {}
    assert "TensorFlow has allocated already" in choice.reason
    assert lc.tuning.allocator_choice() == choice
    choice = _allocator.use_allocator("no-onednn", environ=environ, tensorflow_allocated=bool)
    assert not choice.applied and "reads TF_ENABLE_ONEDNN_OPTS when imported" in choice.reason
    assert environ == {}
    # Keeping TensorFlow's defaults needs nothing of it.
    assert _allocator.use_allocator("tensorflow", environ=environ).applied


def test_an_unknown_choice_is_refused_naming_the_choices():
    from lifecycle._core import _allocator

    for bad in ("jemalloc", "", None, 1):
        with pytest.raises(ValueError, match="tensorflow, system, no-onednn"):
            _allocator.use_allocator(bad, environ={})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="LIFECYCLE_ALLOCATOR: allocator must be one of"):
        _allocator.apply_from_environment({"LIFECYCLE_ALLOCATOR": "pool"})
    assert _allocator.apply_from_environment({}) is None


# A fresh interpreter: LIFECYCLE_ALLOCATOR (and the user's own variables) as given.
CHOICE_CHILD = """
import json, os
import lifecycle as lc
choice = lc.tuning.allocator_choice()
print("RESULT", json.dumps({
    "choice": None if choice is None else [choice.name, choice.applied,
        dict(choice.tensorflow_settings), dict(choice.glibc_settings), list(choice.kept)],
    "allocator": lc.statistics(count_graphs=False).cpu_allocator,
    "env": os.environ.get("TF_ONEDNN_USE_SYSTEM_ALLOCATOR"),
}))
"""


def choice_in_child(run_child, **env: str) -> dict:
    import json

    clean = {name: "" for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR")}
    output = run_child(f"import os\n{UNSET}\n{CHOICE_CHILD}", env={**clean, **env}, timeout=120)
    return json.loads(output.split("RESULT", 1)[1])


# Variables the parent's environment may hold are cleared in the child (empty in
# env, then removed before anything reads them), unless the test sets them.
UNSET = "[os.environ.pop(k) for k in list(os.environ) if os.environ[k] == '']"


@pytest.mark.subprocess
def test_lifecycle_allocator_system_is_applied_before_tensorflow_starts(run_child):
    result = choice_in_child(run_child, LIFECYCLE_ALLOCATOR="system")
    name, applied, tensorflow, glibc, kept = result["choice"]
    assert (name, applied, kept) == ("system", True, [])
    assert (
        tensorflow
        == {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"}
        == {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": result["env"]}
    )
    assert glibc == {"arena_max": 1, "mmap_max": 0, "trim_threshold": 1 << 30}
    # TensorFlow runs with it (oneDNN is on by default on this build's x86 CPUs).
    assert result["allocator"] in ("onednn-system", "tensorflow")


# Two children, ~10 s; a choice made in a child stays in the fast lane
# (test_lifecycle_allocator_system_is_applied_before_tensorflow_starts).
@pytest.mark.subprocess
@pytest.mark.slow
def test_keras_imported_first_leaves_time_for_the_choice_but_a_tensor_does_not(run_child):
    import json

    clean = {name: "" for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR")}
    env = {**clean, "LIFECYCLE_ALLOCATOR": "system"}
    # As isort orders it: keras (and TensorFlow) before lifecycle.
    output = run_child(f"import os\n{UNSET}\nimport keras\n{CHOICE_CHILD}", env=env)
    result = json.loads(output.split("RESULT", 1)[1])
    assert result["choice"][:2] == ["system", True]
    assert result["allocator"] in ("onednn-system", "tensorflow")
    code = f"import os\n{UNSET}\nimport tensorflow as tf\ntf.ones([1])\n{CHOICE_CHILD}"
    result = json.loads(run_child(code, env=env).split("RESULT", 1)[1])
    assert result["choice"][:3] == ["system", False, {}]
    assert result["allocator"] in ("onednn-pool", "tensorflow")


# Two children, ~10 s; a choice made in a child stays in the fast lane
# (test_lifecycle_allocator_system_is_applied_before_tensorflow_starts).
@pytest.mark.subprocess
@pytest.mark.slow
def test_the_users_own_variables_are_never_overridden(run_child):
    result = choice_in_child(
        run_child,
        LIFECYCLE_ALLOCATOR="system",
        TF_ONEDNN_USE_SYSTEM_ALLOCATOR="0",
        MALLOC_ARENA_MAX="4",
    )
    name, applied, tensorflow, glibc, kept = result["choice"]
    assert (name, applied, tensorflow, glibc) == ("system", True, {}, {})
    assert kept == ["TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "MALLOC_ARENA_MAX"]
    assert result["env"] == "0"
    assert result["allocator"] in ("onednn-pool", "tensorflow")
    # Without the variable, nothing is chosen and TensorFlow keeps its defaults.
    assert choice_in_child(run_child)["choice"] is None


# A fresh interpreter on the user's path: 4 cycles of build, fit, dispose() of a
# 72 MiB model (weights and Adam slots), under the allocator the environment gives.
DISPOSE_CHILD = """
import json
import keras, numpy as np
import lifecycle as lc
from lifecycle._core import all_cleaners

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 1024)).astype("float32")
y = rng.standard_normal((64, 2048)).astype("float32")

def cycle():
    inputs = keras.Input((1024,))
    hidden = keras.layers.Dense(2048, activation="relu")(inputs)
    model = lc.ManagedModel(inputs, keras.layers.Dense(2048)(hidden))
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    fitted, owned = rss_mib(), model.owned_bytes / 2**20
    report = model.dispose()
    del model, inputs, hidden
    for cleaner in all_cleaners():  # the trim runs on the cleaner's thread
        assert cleaner.wait_idle(60)
    return {"fitted": fitted, "after": rss_mib(), "owned": owned, "pooled": report.pooled}

cycles = [cycle() for _ in range(4)]
stats = lc.statistics(count_graphs=False)
print("RESULT", json.dumps({
    "cycles": cycles, "allocator": stats.cpu_allocator,
    "pooled_mib": stats.cpu_pooled_bytes / 2**20, "leaks": str(lc.find_leaks()),
}))
"""


def dispose_in_child(run_child, **env: str) -> dict:
    import json

    clean = {name: "" for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR")}
    code = f"import os\n{UNSET}\n{DISPOSE_CHILD}"
    output = run_child(code, env={"LIFECYCLE_ALLOCATOR": "", **clean, **env}, timeout=240)
    return json.loads(output.split("RESULT", 1)[1])


@pytest.mark.subprocess
@pytest.mark.slow  # the fast lane keeps an allocator child
def test_with_onednns_pool_memory_is_reused_and_the_pooled_bytes_reported(run_child):
    result = dispose_in_child(run_child)  # TensorFlow's defaults
    if result["allocator"] != "onednn-pool":
        pytest.skip(f"oneDNN's pool is not TensorFlow's default here ({result['allocator']})")
    cycles = result["cycles"]
    owned = cycles[0]["owned"]
    assert all(cycle["pooled"] for cycle in cycles), "DisposeReport.pooled should say so"
    # Reused, not grown: cycles 2-4 fit into what the first ones left in the pool. Kept
    # nothing, the pool would grow by the model's bytes a cycle (2 x 72 MiB); measured
    # here, 11-31 MiB over the 2 cycles in 6 runs (the pool's regions grow by doubling).
    grown = cycles[-1]["after"] - cycles[1]["after"]
    assert grown < 0.5 * owned, f"RSS grew {grown:.1f} MiB over 2 cycles ({owned:.0f} MiB model)"
    # Where the memory is: the pool holds at least the disposed model's buffers.
    assert result["pooled_mib"] >= owned, result
    assert "oneDNN's CPU pool" in result["leaks"] and "no leaks" in result["leaks"]


@pytest.mark.subprocess
@pytest.mark.slow  # the fast lane keeps an allocator child
def test_with_lifecycle_allocator_system_dispose_gives_memory_back(run_child):
    result = dispose_in_child(run_child, LIFECYCLE_ALLOCATOR="system")
    cycles = result["cycles"]
    owned = cycles[0]["owned"]
    assert result["allocator"] in ("onednn-system", "tensorflow")
    assert result["pooled_mib"] == 0 and not any(cycle["pooled"] for cycle in cycles)
    # Measured here: each dispose gave back 2.5-3x the model's bytes (its buffers,
    # gradients and activations); a pool would give back under 0.3x.
    for cycle in cycles:
        returned = cycle["fitted"] - cycle["after"]
        assert returned >= 0.7 * owned, f"{returned:.1f} MiB back of a {owned:.0f} MiB model"
    # Kept, the two cycles would add 2 x 72 MiB. Measured here: under 18 MiB in most runs,
    # 26.7-26.8 MiB in 3 of 16 (the tree before sessions owned everything included): the
    # bound leaves room for that, not for a model kept.
    grown = cycles[-1]["after"] - cycles[1]["after"]
    assert grown < 0.5 * owned, f"RSS grew {grown:.1f} MiB over 2 cycles ({owned:.0f} MiB model)"
    assert "oneDNN's CPU pool" not in result["leaks"]


def test_dispose_and_statistics_say_whether_freed_bytes_went_to_onednns_pool():
    import keras

    model = lc.manage(keras.Sequential([keras.Input((4,)), keras.layers.Dense(300)]))
    model(np_ones((2, 4)))
    report = model.dispose()
    stats = lc.statistics(count_graphs=False)
    assert stats.cpu_allocator in ("onednn-pool", "onednn-system", "tensorflow")
    assert report.pooled == (stats.cpu_allocator == "onednn-pool")
    if stats.cpu_allocator == "onednn-pool":
        assert stats.cpu_pooled_bytes is not None and stats.cpu_pooled_bytes >= 0
        assert "oneDNN's CPU pool" in str(lc.LeakReport(pooled_bytes=2**20))
    else:
        assert stats.cpu_pooled_bytes == 0
    assert "pool" not in str(lc.LeakReport(pooled_bytes=0))


def np_ones(shape):
    import numpy as np

    return np.ones(shape, "float32")
