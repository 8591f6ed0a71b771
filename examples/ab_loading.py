"""Load two versions from saved files, label them and split traffic 90/10.

Requests with a user id as key are sticky: a user always sees the same version,
in every process, because routing hashes the key with BLAKE2b.

A canary may also rename an input. ``registry.serving()`` holds the version a
request resolves to, so the request is read by that version's input names and
run on that version: one routing decision per request.

Run: python examples/ab_loading.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import keras
import numpy as np

import lifecycle as lc


def save_version(directory: Path, version: int) -> Path:
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(
        1, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(version)
    )(inputs)
    path = directory / f"ranker-v{version}.keras"
    keras.Model(inputs, outputs).save(path)
    return path


def named_model(input_name: str, version: int) -> keras.Model:
    inputs = keras.Input((8,), name=input_name)
    outputs = keras.layers.Dense(
        1, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(version)
    )(inputs)
    return keras.Model(inputs, outputs)


def renamed_input_split(registry: lc.ModelRegistry, request: np.ndarray) -> None:
    registry.load("scorer", 1, lambda: named_model("features", 1))
    registry.load("scorer", 2, lambda: named_model("query", 2))  # the canary renamed it
    registry.route("scorer", {1: 0.5, 2: 0.5})
    read_right = []
    for user in range(20):
        with registry.serving("scorer", key=f"user-{user}") as lease:
            (spec,) = lease.signature.inputs  # this version's input
            answer = lease.infer({spec.name: request})
        read_right.append(int(answer.outputs["output_0"][0, 0]) == lease.version)
    print(f"each request read by its own version's input name: {all(read_right)}")


def main(users: int = 1000) -> None:
    request = np.ones((1, 8), "float32")
    with tempfile.TemporaryDirectory() as tmp, lc.ModelRegistry(name="ab") as registry:
        registry.load("ranker", 1, save_version(Path(tmp), 1), labels=["stable"])
        registry.load("ranker", 2, save_version(Path(tmp), 2), labels=["canary"])
        registry.route("ranker", {"stable": 0.9, "canary": 0.1})
        served = [
            int(registry.predict("ranker", request, key=f"user-{i}").numpy()[0, 0])
            for i in range(users)
        ]
        again = int(registry.predict("ranker", request, key="user-7").numpy()[0, 0])
        print(f"canary share: {served.count(2) / users:.1%} of {users} users")
        print(f"user-7 sticks to v{served[7]}: {again == served[7]}")
        for status in registry.status("ranker"):
            print(
                f"v{status.version}: labels={list(status.labels)} weight={status.weight:.2f} "
                f"requests={status.requests} bytes={status.bytes}"
            )
        renamed_input_split(registry, request)


if __name__ == "__main__":
    main()
