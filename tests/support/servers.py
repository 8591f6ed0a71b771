"""The real server on 127.0.0.1 and a free port, always stopped: in a thread or a child.

``running`` serves REST (uvicorn on a thread), ``grpc_running`` gRPC, and
``lifecycle_serve`` runs the ``lifecycle serve`` command in a child process.
``write_models`` and ``write_kserve_models`` publish the models the server
tests share (the ``models_root`` and ``kserve_root`` fixtures of conftest.py).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import uvicorn

import lifecycle as lc
from lifecycle.server import ModelService, ServerConfig, build_app, build_grpc_server

from . import ROOT
from .models import (
    constant_model,
    echo_model,
    embedding_model,
    pair_model,
    save,
    words_model,
)
from .waits import wait_until

MAX_REQUEST_BYTES = 64 * 1024
"""The servers of the shared fixtures refuse bodies over this (--max_request_bytes)."""

MODEL_CONFIG = """
model_config_list {
  config {
    name: "risk"
    base_path: "%(root)s/risk"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
  }
  config { name: "pair" base_path: "%(root)s/pair" }
  config { name: "words" base_path: "%(root)s/words" }
  config { name: "embed" base_path: "%(root)s/embed" }
}
"""

KSERVE_MODEL_CONFIG = """
model_config_list {
  config {
    name: "risk"
    base_path: "%(root)s/risk"
    model_version_policy { specific { versions: 1 versions: 2 } }
  }
  config { name: "pair" base_path: "%(root)s/pair" }
  config { name: "words" base_path: "%(root)s/words" }
  config { name: "embed" base_path: "%(root)s/embed" }
  config { name: "text" base_path: "%(root)s/text" }
  config { name: "half" base_path: "%(root)s/half" }
  config { name: "bhalf" base_path: "%(root)s/bhalf" }
}
"""


def write_models(root: Path) -> Path:
    """``risk`` 1-3 (the config serves 1 and 2, labelled), ``pair``, ``words``, ``embed``."""
    save(constant_model(1.0), root / "risk", 1)
    save(constant_model(2.0), root / "risk", 2)
    save(constant_model(3.0), root / "risk", 3)  # not in the config's specific policy
    save(pair_model(), root / "pair", 4)
    save(words_model(), root / "words", 1)
    save(embedding_model(), root / "embed", 1)
    (root / "models.config").write_text(MODEL_CONFIG % {"root": root})
    return root


def write_kserve_models(root: Path) -> Path:
    """The models of :func:`write_models` (``risk`` 1 and 2), and echo models of more datatypes."""
    save(constant_model(1.0), root / "risk", 1)
    save(constant_model(2.0), root / "risk", 2)
    save(pair_model(), root / "pair", 4)
    save(words_model(), root / "words", 1)
    save(embedding_model(), root / "embed", 1)
    save(echo_model("string"), root / "text", 1)
    save(echo_model("float16"), root / "half", 1)
    save(echo_model("bfloat16"), root / "bhalf", 1)
    (root / "models.config").write_text(KSERVE_MODEL_CONFIG % {"root": root})
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running(registry: lc.ModelRegistry, config: ServerConfig) -> Iterator[str]:
    """uvicorn serving ``build_app`` on a thread; stopped on exit, within a timeout."""
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(registry, config),
            host=config.host,
            port=config.rest_api_port,
            log_level="warning",
            timeout_graceful_shutdown=5,
        )
    )
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the server stopped during start-up"
        return server.started

    wait_until(started, "the server started", timeout=120)
    try:
        yield f"http://127.0.0.1:{config.rest_api_port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop within 30 s"


@contextlib.contextmanager
def grpc_running(registry: lc.ModelRegistry, config: ServerConfig) -> Iterator[grpc.Channel]:
    """The configured models loaded and served over gRPC; stopped on exit, within a timeout."""
    service = ModelService(registry, config)
    service.start()
    server = build_grpc_server(service, config)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{config.grpc_port}") as channel:
            yield channel
    finally:
        assert server.stop(grace=5).wait(30), "the gRPC server did not stop within 30 s"
        service.stop()


def rest_answer(url: str, name: str = "m") -> object:
    """TensorFlow Serving's REST answer of ``name`` to one row of zeros."""
    body = {"instances": [[0.0, 0.0, 0.0]]}
    return httpx.post(f"{url}/v1/models/{name}:predict", json=body, timeout=30).json()


class Served(subprocess.Popen):
    """A ``lifecycle serve`` process whose output a thread keeps reading.

    A pipe nobody reads fills up (64 KiB): the server then blocks on its next
    log line and stops answering.
    """

    def __init__(self, command: list[str]) -> None:
        super().__init__(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.stdout is not None
        with self.stdout:
            for line in self.stdout:
                self.lines.append(line)

    def output(self, timeout: float = 60) -> str:
        """Everything the process printed, once it has exited (waits up to ``timeout``)."""
        self.wait(timeout)
        self._reader.join(timeout)
        return "".join(self.lines)


LIFECYCLE = str(Path(sys.executable).with_name("lifecycle"))
"""The ``lifecycle`` console script installed beside this interpreter: what users run."""
SERVE = [LIFECYCLE, "serve"]
"""The ``lifecycle serve`` command."""


@contextlib.contextmanager
def lifecycle_serve(*flags: str, ready_within: float = 180) -> Iterator[Served]:
    """``lifecycle serve *flags`` in a child process, once ready; killed on exit if still running.

    ``flags`` must include ``--rest_api_port``; :func:`stop` returns its output.
    """
    port = flags[flags.index("--rest_api_port") + 1]
    process = Served([*SERVE, *flags])

    def ready() -> bool:
        assert process.poll() is None, process.output()
        with contextlib.suppress(httpx.TransportError):
            return (
                httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5).status_code == 200
            )
        return False

    try:
        wait_until(ready, "lifecycle serve ready", timeout=ready_within)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.output(timeout=30)


def stop(process: Served) -> str:
    """SIGTERM ``process``; assert it exits 0 within 60 s; its output."""
    process.send_signal(signal.SIGTERM)
    output = process.output(timeout=60)
    assert process.returncode == 0, output
    return output
