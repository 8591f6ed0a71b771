"""Architecture-sweep benchmark: does RSS come back after models of many kinds?

Eight ``keras.applications`` architectures (``--archs``; weights=None, a
``--size`` x ``--size`` x 3 input, 10 classes) are each built, compiled with
Adam, fitted one step on random data (batch 4), saved as ``.keras``, reloaded,
and dropped, one after the other in one process, once per way of dropping:

    plain      ``del model, reloaded; keras.backend.clear_session(); gc.collect()``
    managed    ``lc.manage()`` on the built and on the reloaded model, then
               ``dispose()`` on both and nothing else: the library's defaults
               (the default session's background cleaner, which returns free
               heap memory to the system once enough bytes were released)
    notrim     as ``managed``, in a ``LifecycleSession(trim_threshold=None)``:
               the cleaner never trims (the behaviour before trimming by default)
    tuned      as ``managed``, in a process that called ``lc.tune_allocator()``
               first (a fixed glibc mmap threshold, process-wide)
    nodnn      as ``managed``, with ``TF_ENABLE_ONEDNN_OPTS=0``: without oneDNN's
               CPU kernels, their primitive cache and TensorFlow's oneDNN CPU
               allocator (a pool that never returns its regions)
    plain-nodnn, notrim-nodnn
               ``plain`` and ``notrim`` with ``TF_ENABLE_ONEDNN_OPTS=0``; the
               ``vs plain`` column compares these variants with ``plain-nodnn``
    sysalloc   as ``managed``, with ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``: oneDNN's
               kernels stay on, but its CPU allocator hands every block to
               the system allocator (glibc) instead of keeping it in its pool
    plain-sysalloc
               ``plain`` with ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``; ``sysalloc``'s
               ``vs plain`` compares with it

Every other variant runs with TensorFlow's defaults: the child removes both
settings from its environment before TensorFlow starts.

Each child first imports everything and runs a warm-up model (a small CNN,
built, fitted, saved, reloaded and dropped the variant's way), collects once
and waits ``--settle`` seconds: its RSS then is the baseline. After the sweep it
waits ``--settle`` seconds again, without calling anything (the background
cleaner finishes), and reads its RSS: the growth is that minus the baseline.

The RSS is also split by kind (Linux's ``RssAnon``, and ``RssFile`` with
``RssShmem``: pages of TensorFlow's libraries and other files, which the
kernel may drop and read again but no allocator can hand back), at the
baseline, at the end and after the steps below; and glibc's bytes in use and
free at the end are compared with the baseline's.

Only then, to split what is left, the child reads glibc's ``mallinfo2`` (free
bytes kept in the heap, bytes in use, bytes mapped on their own) and the number
of malloc arenas (``malloc_info``), calls ``malloc_trim(0)`` (timing it), then
``gc.collect()``, clears TensorFlow's eager kernel cache and trims again,
reading RSS after each step. The ``notrim`` child also measures the cost of that
first trim for other threads: a thread allocating (numpy arrays of 1 KiB to
1 MiB) back to back records each allocation's latency before and during the trim.

Variants run in ``--rounds`` rounds (3 by default), each variant in a fresh
child process per round (this script re-invoked with ``--variant``), the order
rotating between rounds (plain, managed, notrim, ...; then managed, notrim, ...,
plain; ...). The table gives the median growth over the rounds and its spread
(min-max); vs plain is each round's growth over plain's growth in the same
round, reported as the median of the per-round ratios (min-max). The parent
exits non-zero if a child fails or times out, and names the failed children.

Run (from the repository root, with the package and psutil installed)::

    python benchmarks/sweep.py --eager          # 3 rounds x 9 variants, 3-10 min per child
    python benchmarks/sweep.py                  # traced fit steps: 5-15 min per child on 2 cores
    python benchmarks/sweep.py --rounds 1 --archs MobileNetV2,ResNet50 --variants plain,managed
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
from typing import TYPE_CHECKING, Any

import _harness
from _harness import MIB, fmt

if TYPE_CHECKING:
    import keras

VARIANTS = (
    "plain",
    "managed",
    "notrim",
    "tuned",
    "plain-nodnn",
    "nodnn",
    "notrim-nodnn",
    "plain-sysalloc",
    "sysalloc",
)
NO_ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
SYSTEM_ALLOCATOR = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"
# The variants run with a setting TensorFlow reads once: the variant each is
# otherwise, and the setting.
SETTINGS = {
    "plain-nodnn": ("plain", {NO_ONEDNN: "0"}),
    "nodnn": ("managed", {NO_ONEDNN: "0"}),
    "notrim-nodnn": ("notrim", {NO_ONEDNN: "0"}),
    "plain-sysalloc": ("plain", {SYSTEM_ALLOCATOR: "1"}),
    "sysalloc": ("managed", {SYSTEM_ALLOCATOR: "1"}),
}
LABELS = {
    "plain": "plain: del + clear_session() + gc.collect()",
    "managed": "managed: dispose() (defaults)",
    "notrim": "managed, trim_threshold=None",
    "tuned": "managed + lc.tune_allocator()",
    "plain-nodnn": "plain, TF_ENABLE_ONEDNN_OPTS=0",
    "nodnn": "managed, TF_ENABLE_ONEDNN_OPTS=0",
    "notrim-nodnn": "managed, trim_threshold=None, no oneDNN",
    "plain-sysalloc": "plain, TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1",
    "sysalloc": "managed, TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1",
}


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


ARCHS = (
    "MobileNetV2",
    "MobileNetV3Small",
    "EfficientNetB0",
    "DenseNet121",
    "ResNet50",
    "InceptionV3",
    "NASNetMobile",
    "Xception",
)
CLASSES = 10
BATCH = 4
# Latency samples of the allocating thread before the trim, and its allocation sizes.
PROBE_SECONDS = 0.3
PROBE_SIZES = (1 << 10, 1 << 20)


# --------------------------------------------------------------------------- glibc


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33): sizes in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # non-mmapped space taken from the system (every arena)
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes in chunks mapped on their own
            "usmblks",
            "fsmblks",
            "uordblks",  # bytes in use
            "fordblks",  # free bytes kept in the heaps
            "keepcost",
        )
    ]


def libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    return lib if hasattr(lib, "malloc_trim") else None


def mallinfo(lib: ctypes.CDLL | None) -> dict[str, int] | None:
    if lib is None or not hasattr(lib, "mallinfo2"):
        return None
    lib.mallinfo2.restype = MallInfo2
    info = lib.mallinfo2()
    return {"heap": info.arena, "mapped": info.hblkhd, "used": info.uordblks, "free": info.fordblks}


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


def rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def rss_kinds() -> dict[str, int] | None:
    """Resident bytes by kind (Linux): ``anon`` (heaps, mappings), ``file`` (code, files)."""
    try:
        with open("/proc/self/status") as status:
            fields = dict(line.split(":", 1) for line in status if line.startswith("Rss"))
    except OSError:
        return None
    kib = {name: int(value.split()[0]) * 1024 for name, value in fields.items()}
    return {"anon": kib.get("RssAnon", 0), "file": kib.get("RssFile", 0) + kib.get("RssShmem", 0)}


# --------------------------------------------------------------------------- child


def build(arch: str, size: int) -> keras.Model:
    import keras

    constructor = getattr(keras.applications, arch)
    model = constructor(weights=None, input_shape=(size, size, 3), classes=CLASSES)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def tiny_cnn() -> keras.Model:
    import keras

    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(x))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def cycle(
    variant: str, make: Any, shape: tuple[int, ...], directory: Path, eager: bool
) -> dict[str, Any]:
    """Build, fit one step, save, reload, drop; what it took."""
    import keras
    import numpy as np

    import lifecycle as lc

    managed = base_variant(variant) != "plain"
    started = time.perf_counter()
    model = make()
    model.run_eagerly = eager
    if managed:
        model = lc.manage(model)
    x = np.random.default_rng(0).random((BATCH, *shape), dtype=np.float32)
    y = np.arange(BATCH) % CLASSES
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    path = directory / f"{model.name}.keras"
    model.save(path)
    reloaded = keras.models.load_model(path)
    if managed:
        reloaded = lc.manage(reloaded)
    params = model.count_params()
    path.unlink()
    released = 0
    if managed:
        released = model.dispose().bytes_released + reloaded.dispose().bytes_released
        del model, reloaded
    else:
        del model, reloaded
        keras.backend.clear_session()
        gc.collect()
    return {"params": params, "released": released, "seconds": time.perf_counter() - started}


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
    trim_started = time.perf_counter()
    returned = lib.malloc_trim(0)
    trim_ended = time.perf_counter()
    time.sleep(0.05)
    stop.set()
    thread.join()
    before = sorted(
        s for t, s in latencies if t < trim_started and t > trim_started - PROBE_SECONDS
    )
    during = [s for t, s in latencies if t + s > trim_started and t < trim_ended]
    return {
        "trim_ms": (trim_ended - trim_started) * 1000,
        "returned": int(returned),
        "alloc_p99_before_us": before[int(0.99 * (len(before) - 1))] * 1e6 if before else None,
        "alloc_max_before_us": before[-1] * 1e6 if before else None,
        "alloc_max_during_us": max(during) * 1e6 if during else None,
        "allocs_during": len(during),
    }


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    base = base_variant(variant)
    use_settings(SETTINGS[variant][1] if variant in SETTINGS else {})

    import lifecycle as lc
    from lifecycle import _tf

    if variant == "tuned":
        lc.tune_allocator()
    lib = libc()
    session = lc.LifecycleSession(name="bench", trim_threshold=None) if base == "notrim" else None
    if session is not None:
        session.__enter__()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        cycle(variant, tiny_cnn, (32, 32, 3), directory, args.eager)
        gc.collect()
        time.sleep(args.settle)
        baseline, baseline_kinds, baseline_heap = rss(), rss_kinds(), mallinfo(lib)
        per_arch = []
        for arch in args.archs:
            shape = (args.size, args.size, 3)
            done = cycle(variant, lambda a=arch: build(a, args.size), shape, directory, args.eager)
            per_arch.append({"arch": arch, **done, "rss": rss()})
            print(f"{arch}: {done['seconds']:.0f} s", file=sys.stderr, flush=True)
        time.sleep(args.settle)  # the user calls nothing more; a background cleaner finishes
        end, end_kinds = rss(), rss_kinds()
    result: dict[str, Any] = {
        "baseline": baseline,
        "end": end,
        "kinds": {"baseline": baseline_kinds, "end": end_kinds},
        "growth": end - baseline,
        "per_arch": per_arch,
        "mallinfo": mallinfo(lib),
        "mallinfo_baseline": baseline_heap,
        "arenas": arena_count(lib),
    }
    current = lc.current_session().statistics().cleaner
    result["trims"] = current.trims
    result["max_trim_ms"] = current.max_trim_seconds * 1000
    result["collections"] = current.collections
    if lib is not None:
        if base == "notrim":
            result["probe"] = probe_trim(lib)
        else:
            started = time.perf_counter()
            result["trim_returned"] = int(lib.malloc_trim(0))
            result["trim_ms"] = (time.perf_counter() - started) * 1000
        result["after_trim"] = rss() - baseline
        result["mallinfo_after_trim"] = mallinfo(lib)
        gc.collect()
        _tf.memory.clear_kernel_cache()
        lib.malloc_trim(0)
        result["after_all"] = rss() - baseline
        result["kinds"]["after_all"] = rss_kinds()
        result["mallinfo_after_all"] = mallinfo(lib)
    if session is not None:
        session.__exit__(None, None, None)
    return result


# -------------------------------------------------------------------------- parent


def median_spread(values: list[float]) -> str:
    return _harness.fmt_spread(values, "+,.0f")


def table(rounds: _harness.Rounds) -> list[list[str]]:
    rows = []
    for variant in rounds.variants:
        runs = [r for r in rounds.results(variant) if r is not None]
        if not runs:
            continue

        def mib(key: str, variant: str = variant) -> list[float]:
            return [v / MIB for v in rounds.values(variant, key)]

        free = [r["mallinfo"]["free"] / MIB for r in runs if r.get("mallinfo")]
        rows.append(
            [
                LABELS[variant],
                str(len(runs)),
                median_spread(mib("growth")),
                _harness.fmt_spread(rounds.ratios("growth", variant, reference(variant)), ".3f"),
                _harness.fmt_spread(free, ",.0f"),
                median_spread(mib("after_trim")),
                median_spread(mib("after_all")),
            ]
        )
    return rows


def kind_growth(kinds: dict[str, Any], at: dict[str, int]) -> str:
    """``anon +X, file +Y``: resident MiB by kind at ``at`` over the baseline's."""
    start = kinds["baseline"]
    return ", ".join(f"{k} {(at[k] - start[k]) / MIB:+,.0f}" for k in ("anon", "file"))


def notes(rounds: _harness.Rounds) -> list[str]:
    lines = []
    for variant in rounds.variants:
        runs = [r for r in rounds.results(variant) if r is not None]
        if not runs:
            continue
        last = runs[-1]
        info = last.get("mallinfo") or {}
        lines.append(
            f"  {variant}: arenas {last.get('arenas')}, cleaner trims {last.get('trims')} "
            f"(longest {fmt(last.get('max_trim_ms'), '.1f')} ms), "
            f"collections {last.get('collections')}; glibc at the end: heap "
            f"{info.get('heap', 0) / MIB:,.0f} MiB, in use {info.get('used', 0) / MIB:,.0f}, "
            f"free {info.get('free', 0) / MIB:,.0f}, mapped {info.get('mapped', 0) / MIB:,.0f} MiB"
        )
        trims = [r["trim_ms"] for r in runs if "trim_ms" in r]
        if trims:
            lines.append(f"    malloc_trim(0) at the end: {median_spread(trims)} ms")
        probes = [r["probe"] for r in runs if "probe" in r]
        for probe in probes:
            lines.append(
                f"    first malloc_trim(0) on the untrimmed heap: {probe['trim_ms']:.1f} ms "
                f"(returned {probe['returned']}); allocating thread: p99 "
                f"{fmt(probe['alloc_p99_before_us'], '.0f')} µs, max "
                f"{fmt(probe['alloc_max_before_us'], '.0f')} µs before, max "
                f"{fmt(probe['alloc_max_during_us'], '.0f')} µs over "
                f"{probe['allocs_during']} allocations during the trim"
            )
        kinds = last.get("kinds") or {}
        if kinds.get("baseline") and kinds.get("end"):
            after = kinds.get("after_all")
            tail = f"; after gc+trim: {kind_growth(kinds, after)}" if after else ""
            end = kind_growth(kinds, kinds["end"])
            lines.append(f"    RSS growth by kind (MiB), last round: {end}{tail}")
        start = last.get("mallinfo_baseline")
        if start and info:
            lines.append(
                f"    glibc in use at the end: {(info['used'] - start['used']) / MIB:+,.0f} MiB "
                f"over the baseline, free {(info['free'] - start['free']) / MIB:+,.0f} MiB"
            )
        steps = " ".join(
            f"{a['arch']} {(a['rss'] - last['baseline']) / MIB:+,.0f}" for a in last["per_arch"]
        )
        lines.append(f"    RSS growth (MiB) after each architecture, last round: {steps}")
    return lines


def run_parent(args: argparse.Namespace) -> int:
    options = ["--archs", ",".join(args.archs), "--size", str(args.size)]
    options += ["--settle", str(args.settle), *(["--eager"] if args.eager else [])]
    rounds = _harness.run_rounds(__file__, args.variants, args.rounds, options, args.timeout)
    measured = (rounds.last_result(v) for v in args.variants)
    first = next((r for r in measured if r is not None), {}).get("per_arch", [])
    params = ", ".join(f"{a['arch']} {a['params'] / 1e6:.1f}M" for a in first)
    description = [
        *_harness.machine_lines(),
        f"sweep:    {len(args.archs)} architectures, {args.size}x{args.size}x3, {CLASSES} "
        f"classes, Adam, fit 1 step (batch {BATCH}{', eager' if args.eager else ''}), "
        "save .keras, reload, drop",
        f"params:   {params}",
        _harness.rounds_line(args.rounds),
    ]
    header = [
        "variant",
        "runs",
        "RSS growth MiB",
        "vs plain",
        "glibc free MiB",
        "after trim",
        "after gc+trim",
    ]
    legend = [
        "RSS growth: RSS after the sweep (+ settle) - RSS after imports and a warm-up model;",
        "            median over rounds (min-max). vs plain: growth / plain's growth in the",
        "            same round, median of the per-round ratios (min-max)",
        "            (the -nodnn and -sysalloc variants: / plain-nodnn's, plain-sysalloc's)",
        "glibc free: mallinfo2 fordblks at the end (freed, kept by glibc, every arena)",
        "after trim: growth after malloc_trim(0); after gc+trim: after gc.collect(),",
        "            clearing TF's eager kernel cache and malloc_trim(0)",
    ]
    _harness.print_report(description, header, table(rounds), legend, notes(rounds))
    return _harness.report_round_failures(rounds)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument("--archs", default=",".join(ARCHS), help="keras.applications names")
    parser.add_argument("--size", type=int, default=75, help="input height and width (>= 75)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before reading RSS")
    parser.add_argument(
        "--eager",
        action="store_true",
        help="fit eagerly (run_eagerly=True): no traced train step, minutes faster",
    )
    _harness.add_variants_argument(parser, VARIANTS)
    _harness.add_child_arguments(parser, VARIANTS, timeout=3600.0, rounds=3)
    args = parser.parse_args(argv)
    args.archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    if not args.archs or args.settle < 0 or args.size < 32:
        parser.error("--archs must name one architecture, --settle >= 0, --size >= 32")
    args.variants = _harness.parse_variants(parser, args.variants, VARIANTS)
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
