"""Ray Serve model multiplexing whose evicted models give their memory back.

One deployment keeps 2 models per replica and serves 12 model ids (each a
model of about 8 MiB answering its own id). Four callers keep asking for the
ids in turn, so every new id evicts a model that requests may still be using.
``lifecycle.integrations.ray.multiplexed`` replaces ``serve.multiplexed``: each
evicted model finishes the requests that hold it, then is disposed.

Run: python examples/ray_serve_multiplexed.py [--ids 12]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import ray
import ray.cloudpickle
from ray import serve

from lifecycle.integrations.ray import multiplexed, multiplexed_statistics

# The ids this deployment serves: a client's id is checked before it builds anything.
MODEL_ID = re.compile(r"[0-9]{1,4}")


def build(model_id: str):
    """About 8 MiB of weights; every row's answer is ``float(model_id)``.

    Raises:
        ValueError: ``model_id`` (the client's) is not 1-4 digits.
    """
    if not MODEL_ID.fullmatch(model_id):
        raise ValueError(f"A model id is 1-4 digits. Received: {model_id[:40]!r}")
    import keras

    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(2048)(inputs)
    output = keras.layers.Dense(
        1,
        kernel_initializer="zeros",
        bias_initializer=keras.initializers.Constant(float(model_id)),
    )
    return keras.Model(inputs, output(keras.layers.Dense(1024)(hidden)))


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
class Models:
    @multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        return build(model_id)

    async def __call__(self, rows: list[list[float]]) -> float:
        model = await self.get_model(serve.get_multiplexed_model_id())
        await asyncio.sleep(0.05)  # the request still holds its model while others load
        return float(np.asarray(model(np.asarray(rows, "float32")))[0, 0])

    def statistics(self):
        return multiplexed_statistics(self)


def main(ids: int = 12) -> None:
    # The deployment is defined in this script, which Ray's workers cannot import.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    try:
        handle = serve.run(Models.bind(), name="multiplexed", route_prefix=None)
        rows = np.ones((1, 16)).tolist()

        def ask(model_id: str) -> str:
            try:
                answer = handle.options(multiplexed_model_id=model_id).remote(rows).result()
            except Exception:
                return "failed"
            return "right" if answer == float(model_id) else "wrong"

        # Four callers at a time; ids in turn, each asked four times.
        order = [str(n) for n in range(ids) for _ in range(4)]
        with ThreadPoolExecutor(4) as callers:
            outcomes = list(callers.map(ask, order))
        statistics = handle.statistics.remote().result()
        print(
            f"requests: {len(outcomes)}, answered by their own model: "
            f"{outcomes.count('right')}, by another: {outcomes.count('wrong')}"
        )
        print(f"failed requests: {outcomes.count('failed')}")
        print(
            f"models loaded {statistics.models_loaded}, evicted {statistics.models_evicted}, "
            f"disposed {statistics.models_disposed}, still draining "
            f"{statistics.models_draining}; kept now: {', '.join(statistics.model_ids)} "
            f"({statistics.bytes_held / 2**20:.1f} MiB)"
        )
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=12, help="model ids to cycle through")
    main(parser.parse_args().ids)
