"""Serve saved Keras models over TensorFlow Serving's REST API and KServe's v2 protocol.

Saves two versions of a model as ``.keras`` files in TensorFlow Serving's layout
(``<base>/<version>/``), starts the server on a free port of 127.0.0.1 (the app of
``lifecycle serve``, run here on a thread), and asks it what existing clients ask:
model status, metadata, a predict in both protocols, a request it must refuse. A new
version dropped in the base path is loaded through the repository API and served.
Requests are batched as a TensorFlow Serving ``--batching_parameters_file`` says,
read as it is. Beside it, a Triton/KServe model repository (``<repository>/<model>/<version>/``)
is served in Triton's ``explicit`` control mode: its models load and unload by name.

Run::

    python examples/serving_http.py

The same server as a command: ``lifecycle serve --model_name risk --model_base_path <base>
--enable_batching --batching_parameters_file <file> --model_repository <repository>
--model_control_mode explicit``.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any

BATCHING_PARAMETERS = """\
max_batch_size { value: 8 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 100 }
allowed_batch_sizes: [2, 4, 8]
"""


def save_version(base: str, version: int, bias: float) -> None:
    """A small model that answers ``bias`` for any input: versions are told apart."""
    import keras

    features = keras.Input((3,), name="features")
    dense = keras.layers.Dense(
        2, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(bias)
    )
    os.makedirs(os.path.join(base, str(version)))
    keras.Model(features, dense(features)).save(os.path.join(base, str(version), "model.keras"))


def call(url: str, body: Any = None) -> tuple[int, Any]:
    """One HTTP request with a JSON body (POST) or none (GET): status and JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def main() -> None:
    import uvicorn

    import lifecycle as lc
    from lifecycle.server import ServerConfig, build_app

    base = os.path.join(tempfile.mkdtemp(), "risk")
    save_version(base, 1, 1.0)
    save_version(base, 2, 2.0)
    repository = os.path.join(os.path.dirname(base), "repository")
    save_version(os.path.join(repository, "fraud"), 1, 7.0)  # <repository>/<model>/<version>/
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # A batching file written for TensorFlow Serving, used unchanged.
    batching_file = os.path.join(os.path.dirname(base), "batching.config")
    with open(batching_file, "w", encoding="utf-8") as file:
        file.write(BATCHING_PARAMETERS)
    config = ServerConfig.from_flags(
        rest_api_port=port,
        model_name="risk",
        model_base_path=base,
        enable_batching=True,
        batching_parameters_file=batching_file,
        model_repository=repository,
        model_control_mode="explicit",  # Triton's: models load and unload by name
    )
    policy = config.batching
    print(
        f"batching: max_batch_size {policy.max_batch_size}, allowed sizes "
        f"{list(policy.allowed_batch_sizes)}, max_enqueued_batches {policy.max_enqueued_batches}"
    )

    with lc.ModelRegistry() as registry:
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(registry, config), host=config.host, port=port, log_level="warning"
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:  # the port opens once the models are warmed up
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        try:
            _, status = call(f"{url}/v1/models/risk")
            print("status:", status["model_version_status"])
            _, metadata = call(f"{url}/v1/models/risk/metadata")
            signature = metadata["metadata"]["signature_def"]["signature_def"]
            print("inputs:", list(signature["serving_default"]["inputs"]))
            _, answer = call(f"{url}/v1/models/risk:predict", {"instances": [[1.0, 2.0, 3.0]]})
            print(f"TF Serving predict from version 2: {answer['predictions']}")
            tensor = {"name": "features", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}
            _, answer = call(f"{url}/v2/models/risk/infer", {"inputs": [tensor]})
            print(
                f"KServe v2 infer from version {answer['model_version']}: "
                f"{answer['outputs'][0]['data']}"
            )
            _, admin = call(f"{url}/v1/admin/models/risk")
            batching = next(v["batching"] for v in admin["versions"] if v["version"] == 2)
            print(f"requests through version 2's batcher: {batching['requests']}")
            code, answer = call(f"{url}/v1/models/risk:predict", {"instances": [[1.0]]})
            print(f"a wrong shape is refused with {code}: {answer['error']}")

            save_version(base, 3, 3.0)  # a training job publishes version 3
            call(f"{url}/v2/repository/models/risk/load", {})
            _, answer = call(f"{url}/v1/models/risk:predict", {"instances": [[0.0, 0.0, 0.0]]})
            print(f"after loading version 3: {answer['predictions']}")
            _, status = call(f"{url}/v1/models/risk")
            states = {s["version"]: s["state"] for s in status["model_version_status"]}
            print("versions:", states)  # 2 left the policy (latest 1): drained, then disposed

            # The model repository: nothing of it loads until asked, in explicit mode.
            _, index = call(f"{url}/v2/repository/index", {})
            print("repository:", [(m["name"], m["version"], m["state"]) for m in index])
            call(f"{url}/v2/repository/models/fraud/load", {})
            _, answer = call(f"{url}/v1/models/fraud:predict", {"instances": [[0.0, 0.0, 0.0]]})
            print(f"fraud, loaded by name: {answer['predictions']}")
            call(f"{url}/v2/repository/models/fraud/unload", {})
        finally:
            server.should_exit = True
            thread.join(30)


if __name__ == "__main__":
    main()
