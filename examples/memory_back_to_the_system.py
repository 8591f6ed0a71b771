"""Where a disposed model's memory goes: back to the system, or into oneDNN's pool.

With oneDNN on (TensorFlow's default on x86 CPUs with AVX-512 VNNI, BF16 or AMX),
TensorFlow's CPU allocator keeps every freed block in a pool that only this
process reuses: ``dispose()`` frees every buffer, yet the RSS stays. One line
before ``import lifecycle`` (or in the shell) gives it back::

    LIFECYCLE_ALLOCATOR=system python train.py

This example fits and disposes the same model in two fresh processes, one with
TensorFlow's defaults and one with ``LIFECYCLE_ALLOCATOR=system``, and prints
what came back to the system and what the library says the pool holds
(``DisposeReport.pooled``, ``lc.statistics().cpu_pooled_bytes``).

Run: python examples/memory_back_to_the_system.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

MIB = 2**20


def fit_and_dispose() -> dict[str, object]:
    """In this process: fit a 72 MiB model (weights and Adam slots), dispose it, report."""
    import keras
    import numpy as np

    import lifecycle as lc

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1024)).astype("float32")
    y = rng.standard_normal((64, 2048)).astype("float32")
    inputs = keras.Input((1024,))
    hidden = keras.layers.Dense(2048, activation="relu")(inputs)
    model = lc.ManagedModel(inputs, keras.layers.Dense(2048)(hidden))
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    fitted = lc.statistics(count_graphs=False).rss_bytes or 0
    report = model.dispose()
    # The cleaner hands the freed heap back on its thread: wait for it.
    lc.current_session().cleaner.wait_idle(60)
    stats = lc.statistics(count_graphs=False)
    choice = lc.tuning.allocator_choice()
    return {
        "choice": "defaults" if choice is None else f"LIFECYCLE_ALLOCATOR={choice.name}",
        "allocator": stats.cpu_allocator,
        "released": report.bytes_released / MIB,
        "returned": (fitted - (stats.rss_bytes or 0)) / MIB,
        "pooled": report.pooled,
        "pool_holds": (stats.cpu_pooled_bytes or 0) / MIB,
    }


def run(setting: str | None) -> dict[str, object]:
    """:func:`fit_and_dispose` in a fresh process, with ``LIFECYCLE_ALLOCATOR=setting``."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("LIFECYCLE_ALLOCATOR", None)
    if setting is not None:
        env["LIFECYCLE_ALLOCATOR"] = setting
    child = subprocess.run(
        [sys.executable, __file__, "--child"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return json.loads(child.stdout.splitlines()[-1])


def main() -> None:
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(fit_and_dispose()))
        return
    for setting in (None, "system"):
        result = run(setting)
        print(
            f"{result['choice']}: CPU allocator {result['allocator']}; "
            f"dispose released {result['released']:.0f} MiB, "
            f"{result['returned']:.0f} MiB of RSS came back; "
            f"pooled: {result['pooled']}, the pool holds {result['pool_holds']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
