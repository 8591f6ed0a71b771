"""Architecture sweep: does RSS come back after models of many kinds?

``keras.applications`` architectures (``--archs``; weights=None, ``--size``
squared inputs, 10 classes) are each built, compiled with Adam, fitted one step
(batch 4), saved as ``.keras``, reloaded and dropped, one after the other in one
child process, once per way of dropping:

    plain       ``del model, reloaded; keras.backend.clear_session(); gc.collect()``
    managed     ``lc.manage()`` on both, then ``dispose()`` on both (the defaults:
                the background cleaner trims the heap once enough was released)
    notrim      as managed, in a ``LifecycleSession(trim_threshold=None)``
    tuned       as managed, after ``lc.tuning.tune_allocator()``
    nodnn, plain-nodnn, notrim-nodnn
                with ``TF_ENABLE_ONEDNN_OPTS=0`` (no oneDNN kernels or allocator)
    sysalloc, plain-sysalloc
                with ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``

A child warms up (a small CNN, the same way), collects, waits ``--settle`` s and
reads its RSS; after the sweep it waits ``--settle`` s again: the growth is the
difference (per architecture too, and by kind: ``RssAnon``, ``RssFile`` +
``RssShmem``). Then it splits what is left: glibc's ``mallinfo2`` free and used
bytes, the malloc arenas, the RSS after ``malloc_trim(0)`` (timed), and after
``gc.collect()``, clearing TensorFlow's kernel cache and trimming again. The
``notrim`` child times that first trim while another thread allocates (1 KiB to
1 MiB), with the thread's allocation latency before and during it. A variant is
compared with the plain variant of the same settings.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/sweep.py --eager     # 3 rounds x 9 variants, 3-10 min per child
    python benchmarks/sweep.py --quick
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _harness
from _harness import MIB, Metric, Option

NO_ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
SYSTEM_ALLOCATOR = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"
# The variants run with a setting TensorFlow reads once: the variant each is otherwise.
SETTINGS = {
    "plain-nodnn": ("plain", {NO_ONEDNN: "0"}),
    "nodnn": ("managed", {NO_ONEDNN: "0"}),
    "notrim-nodnn": ("notrim", {NO_ONEDNN: "0"}),
    "plain-sysalloc": ("plain", {SYSTEM_ALLOCATOR: "1"}),
    "sysalloc": ("managed", {SYSTEM_ALLOCATOR: "1"}),
}
ARCHS = "MobileNetV2,MobileNetV3Small,EfficientNetB0,DenseNet121,ResNet50,InceptionV3"
ARCHS += ",NASNetMobile,Xception"
CLASSES = 10
BATCH = 4
PROBE_SECONDS = 0.3  # the allocating thread's latency samples before the trim
PROBE_SIZES = (1 << 10, 1 << 20)


def use_settings(settings: dict[str, str]) -> None:
    """Run with TensorFlow's defaults but ``settings`` (before TensorFlow is imported)."""
    for name in (NO_ONEDNN, SYSTEM_ALLOCATOR):
        os.environ.pop(name, None)
    os.environ.update(settings)


def base_variant(variant: str) -> str:
    """What ``variant`` does, setting aside the setting it runs with."""
    return SETTINGS[variant][0] if variant in SETTINGS else variant


def reference(variant: str) -> str:
    """The plain variant ``variant``'s growth is compared with: same settings."""
    return f"plain-{variant.rpartition('-')[2]}" if variant in SETTINGS else "plain"


# --------------------------------------------------------------------------- glibc


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33): sizes in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            *("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks"),
            *("uordblks", "fordblks", "keepcost"),
        )
    ]


def libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    lib = ctypes.CDLL(name) if name else None
    return lib if hasattr(lib, "malloc_trim") else None


def mallinfo(lib: ctypes.CDLL | None) -> dict[str, float] | None:
    """glibc's heap in MiB: taken from the system, mapped apart, in use, free."""
    if lib is None or not hasattr(lib, "mallinfo2"):
        return None
    lib.mallinfo2.restype = MallInfo2
    info = lib.mallinfo2()
    fields = {"heap": info.arena, "mapped": info.hblkhd, "used": info.uordblks}
    return {key: value / MIB for key, value in {**fields, "free": info.fordblks}.items()}


def arena_count(lib: ctypes.CDLL | None) -> int | None:
    """The number of malloc arenas (heaps listed by ``malloc_info``)."""
    if lib is None or not hasattr(lib, "malloc_info"):
        return None
    lib.fopen.restype = ctypes.c_void_p
    lib.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.fclose.argtypes = [ctypes.c_void_p]
    lib.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "malloc_info.xml"
        stream = lib.fopen(str(path).encode(), b"w")
        lib.malloc_info(0, stream)
        lib.fclose(stream)
        return len(re.findall(r"<heap nr=", path.read_text()))


def rss_mib() -> dict[str, float]:
    """Resident MiB: all, ``anon`` (heaps, mappings) and ``file`` (code, files; Linux)."""
    import psutil

    found = {"all": psutil.Process().memory_info().rss / MIB}
    try:
        with open("/proc/self/status") as status:
            fields = [line.split(":", 1) for line in status if line.startswith("Rss")]
    except OSError:
        return found
    mib = {name: int(value.split()[0]) / 1024 for name, value in fields}
    return found | {"anon": mib["RssAnon"], "file": mib["RssFile"] + mib["RssShmem"]}


# --------------------------------------------------------------------------- child


def model_of(arch: str, size: int) -> Any:
    import keras

    if arch == "warm-up":
        inputs = keras.Input((32, 32, 3))
        x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
        x = keras.layers.GlobalAveragePooling2D()(keras.layers.BatchNormalization()(x))
        model = keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(x))
    else:
        model = getattr(keras.applications, arch)(
            weights=None, input_shape=(size, size, 3), classes=CLASSES
        )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def cycle(variant: str, arch: str, args: argparse.Namespace, directory: Path) -> int:
    """Build, fit one step, save, reload, drop; the model's parameter count."""
    import keras
    import numpy as np

    import lifecycle as lc

    managed = base_variant(variant) != "plain"
    model = model_of(arch, args.size)
    model.run_eagerly, params = args.eager, model.count_params()
    model = lc.manage(model) if managed else model
    x = np.random.default_rng(0).random((BATCH, *model.input_shape[1:]), dtype=np.float32)
    model.fit(x, np.arange(BATCH) % CLASSES, batch_size=BATCH, epochs=1, verbose=0)
    path = directory / f"{model.name}.keras"
    model.save(path)
    reloaded = keras.models.load_model(path)
    path.unlink()
    if managed:
        lc.manage(reloaded).dispose()
        model.dispose()
    del model, reloaded
    if not managed:
        keras.backend.clear_session()
        gc.collect()
    return params


def probe_trim(lib: ctypes.CDLL) -> dict[str, Any]:
    """Time one ``malloc_trim(0)`` and an allocating thread's latency before and during it."""
    import numpy as np

    latencies: list[tuple[float, float]] = []  # (start, seconds)
    stop = threading.Event()

    def allocate() -> None:
        sizes = np.random.default_rng(1).integers(*PROBE_SIZES, size=4096)
        clock, i = time.perf_counter, 0
        while not stop.is_set():
            started = clock()
            np.ones(int(sizes[i % sizes.size]), dtype=np.uint8)
            latencies.append((started, clock() - started))
            i += 1

    thread = threading.Thread(target=allocate, name="allocator-probe")
    thread.start()
    time.sleep(PROBE_SECONDS)
    began = time.perf_counter()
    returned = lib.malloc_trim(0)
    ended = time.perf_counter()
    time.sleep(0.05)
    stop.set()
    thread.join()
    before = [1e6 * s for t, s in latencies if began - PROBE_SECONDS < t < began]
    during = [1e6 * s for t, s in latencies if t + s > began and t < ended]
    return {
        "first_trim_ms": 1000 * (ended - began),
        "alloc_p99_before_us": _harness.percentiles(before, 99)[0],
        "alloc_max_before_us": max(before, default=None),
        "alloc_max_during_us": max(during, default=None),
        "allocs_during_trim": len(during),
        "trim_returned": returned,  # 1: memory went back to the system
    }


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    use_settings(SETTINGS[variant][1] if variant in SETTINGS else {})

    import lifecycle as lc
    from lifecycle import _tf

    if variant == "tuned":
        lc.tuning.tune_allocator()
    lib = libc()
    session = None
    if base_variant(variant) == "notrim":
        session = lc.LifecycleSession(name="bench", trim_threshold=None).__enter__()
    cases: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cycle(variant, "warm-up", args, Path(tmp))
        gc.collect()
        time.sleep(args.settle)
        start, heap_start = rss_mib(), mallinfo(lib) or {}
        for arch in args.archs.split(","):
            params = cycle(variant, arch, args, Path(tmp))
            cases[f"after {arch}"] = {"growth_mib": rss_mib()["all"] - start["all"]}
            cases[f"after {arch}"]["params"] = params
        time.sleep(args.settle)  # the user calls nothing more; a background cleaner finishes
    end, heap = rss_mib(), mallinfo(lib) or {}
    cleaner = lc.current_session().statistics().cleaner
    sweep = {f"{kind}_growth_mib": end[kind] - start[kind] for kind in end if kind in start}
    sweep |= {"growth_mib": end["all"] - start["all"], "arenas": arena_count(lib)}
    sweep |= {f"glibc_{k}_mib": heap[k] for k in heap}
    sweep |= {f"glibc_{k}_growth_mib": heap[k] - heap_start[k] for k in ("used", "free") if heap}
    sweep |= {"cleaner_trims": cleaner.trims, "max_trim_ms": 1000 * cleaner.max_trim_seconds}
    sweep |= {"cleaner_collections": cleaner.collections}
    if lib is not None:
        if session is not None:
            sweep |= probe_trim(lib)
        else:
            started = time.perf_counter()
            sweep["trim_returned"] = lib.malloc_trim(0)  # 1: memory went back to the system
            sweep["trim_ms"] = 1000 * (time.perf_counter() - started)
        sweep |= {f"glibc_{k}_after_trim_mib": v for k, v in (mallinfo(lib) or {}).items()}
        sweep["after_trim_mib"] = rss_mib()["all"] - start["all"]
        gc.collect()
        _tf.memory.clear_kernel_cache()
        lib.malloc_trim(0)
        after = rss_mib()
        sweep |= {f"after_all_{k}_mib": after[k] - start[k] for k in after if k in start}
    if session is not None:
        session.__exit__(None, None, None)
    return {"cases": {"sweep": sweep, **cases}}


def metric(key: str, label: str, spec: str = "+,.0f", ratio: bool = False) -> Metric:
    unit = key.rpartition("_")[2] if key.endswith(("_mib", "_ms", "_us")) else ""
    return Metric(key, {"mib": "MiB", "ms": "ms", "us": "µs"}.get(unit, ""), spec, label, ratio)


BENCHMARK = _harness.Benchmark(
    name="sweep",
    doc=__doc__,
    variants={
        "plain": "del + clear_session() + gc.collect()",
        "managed": "dispose() (defaults)",
        "notrim": "managed, trim_threshold=None",
        "tuned": "managed + lc.tuning.tune_allocator()",
        "plain-nodnn": f"plain, {NO_ONEDNN}=0",
        "nodnn": f"managed, {NO_ONEDNN}=0",
        "notrim-nodnn": f"notrim, {NO_ONEDNN}=0",
        "plain-sysalloc": f"plain, {SYSTEM_ALLOCATOR}=1",
        "sysalloc": f"managed, {SYSTEM_ALLOCATOR}=1",
    },
    metrics=[
        metric("growth_mib", "RSS growth MiB", ratio=True),
        metric("anon_growth_mib", "anon MiB"),
        metric("file_growth_mib", "file MiB"),
        metric("glibc_free_mib", "glibc free MiB", ",.0f"),
        metric("after_trim_mib", "after trim"),
        metric("after_all_all_mib", "after gc+trim"),
        metric("after_all_anon_mib", "anon after gc+trim"),
        metric("after_all_file_mib", "file after gc+trim"),
        metric("glibc_heap_mib", "glibc heap MiB", ",.0f"),
        metric("glibc_used_mib", "glibc used MiB", ",.0f"),
        metric("glibc_mapped_mib", "glibc mapped MiB", ",.0f"),
        metric("glibc_used_growth_mib", "glibc used growth"),
        metric("glibc_free_growth_mib", "glibc free growth"),
        metric("arenas", "arenas", ".0f"),
        metric("cleaner_trims", "trims", ".0f"),
        metric("max_trim_ms", "longest trim ms", ".1f"),
        metric("cleaner_collections", "collections", ".0f"),
        metric("trim_ms", "malloc_trim ms", ".1f"),
        metric("first_trim_ms", "first trim ms", ".1f"),
        metric("alloc_p99_before_us", "alloc p99 before µs", ".0f"),
        metric("alloc_max_before_us", "alloc max before µs", ".0f"),
        metric("alloc_max_during_us", "alloc max during µs", ".0f"),
        metric("allocs_during_trim", "allocs during trim", ".0f"),
        metric("trim_returned", "malloc_trim returned", ".0f"),
        metric("params", "params", ",.0f"),
        metric("glibc_used_after_trim_mib", "glibc used after trim", ",.0f"),
        metric("glibc_free_after_trim_mib", "glibc free after trim", ",.0f"),
    ],
    measure=measure,
    options=[
        Option("--archs", ARCHS, "comma-separated keras.applications names"),
        Option("--size", 75, "input height and width", _harness.image_side),
        Option("--settle", 2.0, "seconds before reading RSS"),
        Option("--eager", False, "fit eagerly (no traced step, minutes faster)"),
    ],
    quick={"archs": "MobileNetV3Small", "size": 32, "settle": 0.0, "eager": True},
    baseline=reference,
    timeout=3600.0,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
