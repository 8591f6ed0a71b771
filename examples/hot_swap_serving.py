"""Swap model versions under live traffic without dropping a request.

Client threads call ``registry.predict`` while the main thread loads version
n+1, promotes it and retires version n. Retired versions are disposed only
after the requests holding them return.

The registry is set up as a serving process would be: loads run on a loader
thread of lower priority (Linux) that pauses its Python work while requests are
in flight, and the objects alive before the first load are frozen so that the
collection after each swap is short.

Run: python examples/hot_swap_serving.py
"""

from __future__ import annotations

import sys
import threading

import keras
import numpy as np

import lifecycle as lc


def version_factory(version: int):
    """Each version answers its own number, so the client sees which one served it."""

    def build() -> keras.Model:
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(32, activation="relu")(inputs)
        outputs = keras.layers.Dense(
            1, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(version)
        )(hidden)
        return keras.Model(inputs, outputs)

    return build


def main(swaps: int = 5, clients: int = 4) -> None:
    request = np.ones((1, 8), "float32")
    seen: dict[int, int] = {}
    failures: list[Exception] = []
    stop = threading.Event()
    lock = threading.Lock()
    # Per-thread priorities are a Linux feature; elsewhere the loader only paces itself.
    loader_nice = 19 if sys.platform.startswith("linux") else None
    with lc.ModelRegistry(
        name="scoring", loader_nice=loader_nice, loader_gil_share=0.5, freeze_heap=True
    ) as registry:
        registry.load("scorer", 1, version_factory(1))

        def client() -> None:
            while not stop.is_set():
                try:
                    version = int(registry.predict("scorer", request).numpy()[0, 0])
                except Exception as error:
                    failures.append(error)
                    continue
                with lock:
                    seen[version] = seen.get(version, 0) + 1

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for version in range(2, swaps + 2):
            status = registry.load("scorer", version, version_factory(version))
            registry.promote("scorer", version)
            registry.unload("scorer", version - 1)
            print(f"swapped to v{version} (loaded in {status.load_seconds * 1e3:.0f} ms)")
        stop.set()
        for thread in threads:
            thread.join()
        print(f"requests per version: {dict(sorted(seen.items()))}; failed: {len(failures)}")


if __name__ == "__main__":
    main()
