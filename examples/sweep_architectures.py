"""A sweep over different architectures whose memory goes back to the system.

Each architecture is built, managed, fitted one step and disposed. ``dispose()``
frees its buffers, and the session's cleaner hands glibc's free heap back to the
system; but with oneDNN on (TensorFlow's default on x86 Linux), TensorFlow's CPU
allocator keeps every block in a pool that grows to the largest model and is
never returned. ``LIFECYCLE_ALLOCATOR=system``, set before ``import lifecycle``,
keeps oneDNN's kernels and takes every block from the system allocator instead.
It is process-wide, so it is the program's choice, made here on its first
lines; docs/allocator.md gives what it costs, docs/sweeps.md what it saves.

Run: python examples/sweep_architectures.py [--archs MobileNetV2,ResNet50] [--side 96]
     LIFECYCLE_ALLOCATOR=tensorflow python examples/sweep_architectures.py  # the pool

Measured on 2 cores, one run each with the defaults and TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1
(what LIFECYCLE_ALLOCATOR=system sets for TensorFlow): after ResNet50, the RSS was 313
MiB under the first model's with the system allocator, 223 MiB over it with the pool.
"""

from __future__ import annotations

import os

# Read by `import lifecycle`, before it imports TensorFlow (which reads its settings once).
os.environ.setdefault("LIFECYCLE_ALLOCATOR", "system")

import argparse

import keras
import numpy as np

import lifecycle as lc
from lifecycle.monitoring import statistics

MIB = 1024 * 1024


def rss() -> int:
    return statistics(count_graphs=False).rss_bytes or 0


def build(arch: str, side: int) -> keras.Model:
    constructor = getattr(keras.applications, arch)
    model = constructor(weights=None, input_shape=(side, side, 3), classes=10)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default="MobileNetV3Small,MobileNetV2,ResNet50")
    parser.add_argument("--side", type=int, default=96, help="input height and width")
    parser.add_argument("--batch", type=int, default=16, help="images per fit step")
    args = parser.parse_args()
    setting = os.environ["LIFECYCLE_ALLOCATOR"]
    allocator = statistics(count_graphs=False).cpu_allocator
    print(f"LIFECYCLE_ALLOCATOR={setting}: TensorFlow's CPU allocator {allocator}")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.side, args.side, 3), dtype=np.float32)
    y = rng.integers(0, 10, size=args.batch)
    session = lc.current_session()
    start = None
    for arch in args.archs.split(","):
        with lc.manage(build(arch, args.side)) as model:
            model.fit(x, y, epochs=1, verbose=0)
        # Leaving the block disposed the model; the cleaner trims in the background.
        session.cleaner.wait_idle(60)
        released = model.dispose().bytes_released  # already disposed: the same report
        if start is None:  # the first model also pays one-time costs: kernels, traces
            start = rss()
        print(
            f"{arch}: {released / MIB:,.0f} MiB released; RSS {rss() / MIB:,.0f} MiB "
            f"({(rss() - start) / MIB:+,.0f} MiB since the first model)"
        )
    stats = session.statistics().cleaner
    print(f"cleaner: {stats.collections} collections, {stats.trims} heap trims")


if __name__ == "__main__":
    main()
