"""Serve what a training job publishes: a registry watching a directory of versions.

A training job writes one directory of checkpoints per model version under a base
path (TensorFlow Serving's layout, ``<base>/<version>/``). The registry watches the
base path with a version policy: each scan loads the new versions (built by a
factory, restored from their checkpoint, warmed up), serves the newest, and retires
the versions that left the policy through the normal drain. A corrupt version is
reported and skipped; the serving version keeps serving.

Run::

    python examples/serve_checkpointed_versions.py
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


def build():
    """The architecture the training job and the server share (untrained)."""
    import keras

    inputs = keras.Input((8,))
    return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(32)(inputs)))


def publish(base: str, version: int, answer: float) -> str:
    """The training job: train version ``version`` (here: set its output) and checkpoint it."""
    import lifecycle as lc

    model = lc.manage(build())
    model.compile("adam", "mse")
    model.layers[-1].kernel.assign(np.zeros((32, 1), "float32"))
    model.layers[-1].bias.assign([answer])
    prefix = model.checkpoints(os.path.join(base, str(version))).save()
    model.dispose()
    return prefix


def main() -> None:
    """Publish versions, scan, serve, corrupt one, scan again."""
    import lifecycle as lc

    x = np.ones((1, 8), "float32")
    with tempfile.TemporaryDirectory() as base, lc.ModelRegistry(name="server") as registry:
        publish(base, 1, 1.0)
        report = registry.watch("risk", base, build, policy=lc.VersionPolicy.latest(1))
        print(f"scan: loaded {report.loaded}, serving v{report.default}")
        print(f"  answer: {float(registry.predict('risk', x)[0, 0]):.1f}")

        publish(base, 2, 2.0)
        report = registry.scan("risk")
        print(f"scan: loaded {report.loaded}, retired {report.retired}, serving v{report.default}")
        print(f"  answer: {float(registry.predict('risk', x)[0, 0]):.1f}")

        prefix = publish(base, 3, 3.0)
        with open(prefix + ".data-00000-of-00001", "r+b") as data:
            data.write(b"\xff" * 64)  # a disk error in the new version
        report = registry.scan("risk")
        for version, error in report.failed:
            print(f"scan: version {version} failed: {error[:70]}...")
        print(f"  still serving v{report.default}: {float(registry.predict('risk', x)[0, 0]):.1f}")


if __name__ == "__main__":
    main()
