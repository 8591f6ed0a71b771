"""Call ``lifecycle serve`` with tritonclient, HTTP and gRPC, each with its defaults.

Saves two versions of a small model and a string model, serves them over REST and
gRPC on free ports of 127.0.0.1 (the app and gRPC server of ``lifecycle serve``, run
here on threads), and calls them as Triton's clients do by default: over HTTP,
tensors in binary after the JSON (KServe v2's binary tensor data extension), asked
back in binary; over gRPC, ``inference.GRPCInferenceService`` with raw tensor
contents. Then the model repository over gRPC: the index, an unload and a load.

Run::

    pip install "tritonclient[http,grpc]"
    python examples/serving_triton_client.py

The same server as a command: ``lifecycle serve --model_config_file <file>``.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time

import numpy as np

MODEL_CONFIG = """
model_config_list {
  config { name: "risk" base_path: "%(root)s/risk" model_version_policy { all {} } }
  config { name: "echo" base_path: "%(root)s/echo" }
}
"""


def save_versions(root: str) -> None:
    """``risk``: answers its version for 3 features; ``echo``: answers its strings back."""
    import keras

    for version in (1, 2):
        features = keras.Input((3,), name="features")
        dense = keras.layers.Dense(
            2, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(version)
        )
        os.makedirs(os.path.join(root, "risk", str(version)))
        keras.Model(features, dense(features)).save(
            os.path.join(root, "risk", str(version), "model.keras")
        )
    text = keras.Input((1,), name="text", dtype="string")
    os.makedirs(os.path.join(root, "echo", "1"))
    keras.Model(text, keras.layers.Identity(dtype="string")(text)).save(
        os.path.join(root, "echo", "1", "model.keras")
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import uvicorn

    import lifecycle as lc
    from lifecycle.server import ModelService, ServerConfig, build_app, build_grpc_server

    root = tempfile.mkdtemp()
    save_versions(root)
    with open(os.path.join(root, "models.config"), "w", encoding="utf-8") as file:
        file.write(MODEL_CONFIG % {"root": root})
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        port=free_port(),
        model_config_file=os.path.join(root, "models.config"),
    )
    features = np.array([[1.0, 2.0, 3.0]], "float32")
    words = np.array([[b"chat"], ["\u732b".encode()]], object)

    with lc.ModelRegistry() as registry:
        service = ModelService(registry, config)
        app = build_app(registry, config, service=service)
        server = uvicorn.Server(
            uvicorn.Config(app, host=config.host, port=config.rest_api_port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:  # the port opens once the models are warmed up
            time.sleep(0.05)
        grpc_server = build_grpc_server(service, config)
        grpc_server.start()
        try:
            with httpclient.InferenceServerClient(f"127.0.0.1:{config.rest_api_port}") as client:
                x = httpclient.InferInput("features", [1, 3], "FP32")
                x.set_data_from_numpy(features)  # binary_data=True by default
                result = client.infer("risk", [x])  # outputs asked back in binary
                size = result.get_output("output_0")["parameters"]["binary_data_size"]
                print(
                    f"HTTP, binary both ways: {result.as_numpy('output_0').tolist()} "
                    f"({size} bytes) from version {result.get_response()['model_version']}"
                )
                text = httpclient.InferInput("text", [2, 1], "BYTES")
                text.set_data_from_numpy(words)
                echoed = client.infer("echo", [text]).as_numpy("output_0")
                print(f"HTTP, BYTES: {[v.decode() for v in echoed.reshape(-1)]}")

            with grpcclient.InferenceServerClient(f"127.0.0.1:{config.grpc_port}") as client:
                print(
                    f"gRPC live and ready: {client.is_server_live() and client.is_server_ready()}"
                )
                metadata = client.get_model_metadata("risk")
                print(f"gRPC metadata: inputs {[i.name for i in metadata.inputs]}")
                x = grpcclient.InferInput("features", [1, 3], "FP32")
                x.set_data_from_numpy(features)  # raw_input_contents
                result = client.infer("risk", [x], model_version="1")
                print(
                    f"gRPC, raw contents: {result.as_numpy('output_0').tolist()} from version "
                    f"{result.get_response().model_version}"
                )
                index = client.get_model_repository_index().models
                print(f"gRPC repository: {sorted((m.name, m.version, m.state) for m in index)}")
                client.unload_model("echo")  # an admin call: loopback needs no token
                while client.is_model_ready("echo"):
                    time.sleep(0.05)
                client.load_model("echo")
                print(f"echo unloaded and loaded again: ready {client.is_model_ready('echo')}")
        finally:
            grpc_server.stop(grace=5).wait(30)
            server.should_exit = True
            thread.join(30)


if __name__ == "__main__":
    main()
