"""Peers benchmark: ``lifecycle serve`` beside KServe's and MLServer's Python servers.

Three servers, each in a process of its own on 127.0.0.1 and free ports, serve
the same SavedModel, a Keras 3 ``model.export()`` of the MLP of ``hot_swap.py``
(Input(256) -> Dense(units, relu) -> Dense(units, relu) -> Dense(16);
``--units 2048`` gives 4.76M params, 18.1 MiB of weights), written by the
benchmark:

    lifecycle  ``lifecycle serve --model_name mlp --model_base_path BASE``,
               BASE holding the model as version 1.
    kserve     KServe's Python model server as its docs show it: a
               ``kserve.Model`` subclass whose ``load()`` calls
               ``tf.saved_model.load`` and whose ``predict()`` calls the
               SavedModel's ``serve`` function (v2 ``InferRequest`` in,
               ``InferResponse`` out; a v1 ``{"instances"}`` dict in,
               ``{"predictions"}`` out), started with
               ``kserve.ModelServer().start([model])``. Its default
               ``ModelRepository`` cannot load a model again once unloaded
               (its ``load()`` does nothing), so the server gets a
               ``ModelRepository`` subclass whose ``load(name)`` builds and
               loads a new model object, as KServe's own model servers do.
    mlserver   ``mlserver start DIR``: ``settings.json`` and the model's
               ``model-settings.json``, whose implementation is an
               ``mlserver.MLModel`` subclass (``MLServerSavedModel`` below)
               with ``load()`` and ``predict()`` as MLServer's docs show.

KServe and MLServer run from virtualenvs of their own (``--kserve-venv``,
``--mlserver-venv``); a peer whose virtualenv is not given, does not exist or
lacks its package is skipped, and the report says how to create it::

    python3 -m venv /tmp/peer-kserve && \
        /tmp/peer-kserve/bin/pip install kserve 'tensorflow-cpu==2.21.*'
    python3 -m venv /tmp/peer-mlserver && \
        /tmp/peer-mlserver/bin/pip install mlserver 'uvloop==0.21.0' 'tensorflow-cpu==2.21.*'

(MLServer 1.7.1's workers crash-loop with uvloop 0.23, hence the pin.) Every
server runs with its defaults but for these: it listens on 127.0.0.1 and
free ports (KServe's REST server binds 0.0.0.0 with no option to change it,
so its child makes uvicorn's ``Config`` take 127.0.0.1); its gRPC server is
off (``lifecycle serve --port 0``, KServe ``enable_grpc=False``; MLServer has
no switch: its gRPC and metrics servers listen on free ports too); and, as
``lifecycle serve``, none writes a log line per request (KServe writes three
by default: its ``kserve.trace`` and ``uvicorn.access`` loggers are set to
WARNING, and ``enable_latency_logging=False``; MLServer one: ``"debug":
false`` turns its access log off). MLServer runs inference in one worker
process (``parallel_workers``, 1 by default), so its process tree holds two
Pythons with TensorFlow.

The run is ``--rounds`` rounds; each round measures, in this order:

* Throughput. For each protocol, each of ``--clients`` and each server that
  speaks the protocol, in turns (the order rotating from round to round), a
  Locust child (``serve.py``'s load child: ``FastHttpUser``s with no wait)
  sends batch-1 requests for ``--warmup`` unmeasured and ``--seconds``
  measured seconds; a child per server, so that no client connection sits
  idle while another server is measured (uvicorn closes one after 5 s, and a
  request racing that close fails). The protocols: KServe v2 REST
  (``POST /v2/models/mlp/infer``, JSON, all three servers) and TF Serving
  REST (``POST /v1/models/mlp:predict``: ``lifecycle serve``, and KServe,
  whose Python server also speaks this "v1" protocol; MLServer does not).
  Per server: requests/s, p50 and p99 (each request timed by Locust), and
  server CPU per request: the user+system time of the server's process tree
  (psutil: MLServer runs inference in a worker process) over the measured
  window, divided by its requests.
* Swaps. One more such phase per server, over v2 with the largest of
  ``--clients``: during the measured window the parent swaps the server's
  model back to back (the next swap ``--swap-every`` seconds after the last
  one started, and only once it completed). A swap of ``lifecycle serve`` is a
  new version directory (copied to ``BASE/.tmp-N``, renamed to ``BASE/N``)
  followed by ``POST /v2/repository/models/mlp/load``, until version N alone
  is listed ``AVAILABLE`` (the old one's directory is then deleted); a swap of
  KServe or MLServer is ``POST /v2/repository/models/mlp/load`` of the loaded
  model, which loads a new model object and replaces the old one. A swap
  counts as under load if it completed within the measured window; the
  table gives p99 and failed requests of those windows, and p99 over the same
  server's steady p99 at those clients in the same round.
* Memory. Without load, each server in turn waits ``--settle`` seconds, then
  runs ``--cycles`` cycles of ``POST /v2/repository/models/mlp/unload``,
  ``.../load``, one v2 request, ``--settle`` seconds, and reads the RSS of its
  process tree. MiB per cycle is the least-squares slope of RSS over the
  cycles (the RSS before the first cycle included): per round, and over
  every cycle of the run, the rounds' series joined end to end so that what
  the load phases between them did to RSS is left out.

Cells are the median over the rounds (min-max); ratios ("lifecycle ÷ it")
are taken within each round, then their median (min-max). A request fails if
it raises, is not answered 200 or is still unanswered when its phase stops.
The report is Markdown on stdout: the machine, the settings, the tables, notes.
The parent exits non-zero if a server fails to start or dies or a load phase
fails; server logs go to files in a temporary directory, kept and named on
failure, and every process started is stopped at the end (by its PID).

Needs the server's and the load generator's extras::

    pip install -e '.[serve,bench,loadtest]'

Run (from the repository root)::

    # 3 rounds of 4 s phases, 5 unload+load cycles per server and round: ~5 min
    python benchmarks/peers.py --kserve-venv /tmp/peer-kserve --mlserver-venv /tmp/peer-mlserver
    # a quick look, KServe only, under 2 min:
    python benchmarks/peers.py --kserve-venv /tmp/peer-kserve \
        --rounds 1 --seconds 2 --cycles 2 --units 256
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _harness
import serve
from _harness import MIB, fmt_spread
from hot_swap import INPUT_DIM, OUTPUTS, build_mlp, mlp_params, slope

if TYPE_CHECKING:
    import psutil

MODEL_NAME = serve.MODEL_NAME
V2_INFER = f"/v2/models/{MODEL_NAME}/infer"
V1_PREDICT = serve.PREDICT_PATH
REPOSITORY = f"/v2/repository/models/{MODEL_NAME}"
BENCHMARKS = Path(__file__).resolve().parent

SERVERS = ("lifecycle", "kserve", "mlserver")
LABELS = {"lifecycle": "lifecycle serve", "kserve": "KServe", "mlserver": "MLServer"}


@dataclass(frozen=True)
class Protocol:
    """A wire protocol of the benchmark's requests, and the servers that speak it."""

    label: str
    path: str
    servers: tuple[str, ...]


PROTOCOLS = {
    "v2": Protocol("KServe v2 REST", V2_INFER, SERVERS),
    "v1": Protocol("TF Serving REST", V1_PREDICT, ("lifecycle", "kserve")),
}
# Protocol of the swap phase.
SWAP_PROTOCOL = "v2"
SWAP_WAYS = {
    "lifecycle": "new version dir + repository load",
    "kserve": "repository load of the loaded model",
    "mlserver": "repository load of the loaded model",
}


@dataclass(frozen=True)
class Peer:
    """A peer server: the option naming its virtualenv and what that virtualenv needs."""

    name: str
    option: str
    requirements: tuple[str, ...]

    def install_line(self, venv: str | os.PathLike[str] | None = None) -> str:
        """The command that creates the peer's virtualenv at ``venv`` (``/tmp/peer-<name>``)."""
        venv = str(venv or f"/tmp/peer-{self.name}")
        # Version specifiers quoted, for any shell.
        packages = " ".join(f"'{r}'" if "=" in r else r for r in self.requirements)
        return f"python3 -m venv {venv} && {venv}/bin/pip install {packages}"


PEERS = {
    "kserve": Peer("kserve", "--kserve-venv", ("kserve", "tensorflow-cpu==2.21.*")),
    # MLServer 1.7.1's workers crash-loop with uvloop 0.23.
    "mlserver": Peer(
        "mlserver", "--mlserver-venv", ("mlserver", "uvloop==0.21.0", "tensorflow-cpu==2.21.*")
    ),
}
# Distributions whose versions a peer's virtualenv reports (the first that matters is
# the peer's own package; TensorFlow as either distribution).
PEER_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "keras")
# Run by a peer's Python: the versions of the distributions named on its command line.
VERSIONS_CHILD = """
import importlib.metadata as metadata, json, sys
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
print(json.dumps({name: version(name) for name in sys.argv[1:]}))
"""

# Roles of a child process (the hidden --variant).
ROLES = ("export", "kserve", "load")
# Seconds a repository load, an unload or a swap may take.
SWAP_TIMEOUT = 120.0
# Seconds between two status polls of lifecycle serve during a swap.
STATUS_POLL = 0.1
# Error messages kept per server and phase in the notes.
ERRORS_KEPT = 3


# ---------------------------------------------------------------- the requests


def request_row() -> list[float]:
    """The one row every request carries (``serve.py``'s, for every protocol)."""
    return json.loads(serve.request_body())["instances"][0]


def request_body(protocol: str, input_name: str) -> bytes:
    """The body of the benchmark's request over ``protocol``."""
    if protocol == "v1":
        return serve.request_body()
    tensor = {"name": input_name, "shape": [1, INPUT_DIM], "datatype": "FP32"}
    return json.dumps({"inputs": [{**tensor, "data": request_row()}]}).encode()


def outputs_of(protocol: str, answer: Mapping[str, Any]) -> list[float]:
    """The output row of an answer over ``protocol``, flat."""
    if protocol == "v1":
        return list(answer["predictions"][0])
    return list(answer["outputs"][0]["data"])


# ---------------------------------------------------------------- child: export


def run_export(args: argparse.Namespace) -> dict[str, Any]:
    """Write the served model with ``model.export(args.out)``; its input's name."""
    import tensorflow as tf

    build_mlp(args.units).export(args.out, verbose=False)
    signature = tf.saved_model.load(args.out).signatures["serving_default"]
    [input_name] = signature.structured_input_signature[1]
    return {"params": mlp_params(args.units), "input_name": input_name}


# ------------------------------------------------------ child: KServe's server


def kserve_classes() -> tuple[type, type]:
    """KServe's documented custom model class over the SavedModel, and a repository for it.

    Returns:
        ``(SavedModel, Repository)``: the ``kserve.Model`` subclass and the
        ``kserve.ModelRepository`` subclass whose ``load(name)`` loads a new
        ``SavedModel`` (KServe's default repository cannot load one again).
    """
    import uuid

    import kserve
    import numpy as np
    import tensorflow as tf
    from kserve import InferOutput, InferRequest, InferResponse

    class SavedModel(kserve.Model):
        def __init__(self, name: str, path: str) -> None:
            super().__init__(name)
            self.path = path
            self.model = None
            self.load()

        def load(self) -> bool:
            self.model = tf.saved_model.load(self.path)
            self.ready = True
            return self.ready

        def predict(self, payload: Any, headers: Any = None) -> Any:
            if isinstance(payload, InferRequest):
                rows = payload.inputs[0].as_numpy()
                result = self.model.serve(tf.constant(rows)).numpy()
                output = InferOutput(name="output_0", shape=list(result.shape), datatype="FP32")
                output.set_data_from_numpy(result, binary_data=False)
                return InferResponse(
                    response_id=payload.id or str(uuid.uuid4()),
                    model_name=self.name,
                    infer_outputs=[output],
                )
            rows = np.asarray(payload["instances"], dtype=np.float32)
            return {"predictions": self.model.serve(tf.constant(rows)).numpy().tolist()}

    class Repository(kserve.ModelRepository):
        def __init__(self, path: str) -> None:
            super().__init__()
            self.path = path

        async def load(self, name: str) -> bool:
            model = SavedModel(name, self.path)
            self.update(model)
            return model.ready

    return SavedModel, Repository


def run_kserve(args: argparse.Namespace) -> None:
    """Serve ``args.model`` with KServe's ModelServer until SIGTERM."""
    # KServe parses its own options from the command line when imported.
    sys.argv = sys.argv[:1]
    saved_model, repository = kserve_classes()
    import kserve
    import uvicorn

    class Loopback(uvicorn.Config):
        # KServe's REST server listens on 0.0.0.0, with no option to change it.
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "host": "127.0.0.1"})

    uvicorn.Config = Loopback
    server = kserve.ModelServer(
        http_port=args.port,
        registered_models=repository(args.model),
        enable_grpc=False,
        enable_latency_logging=False,
    )
    # No log line per request, as in the other servers (KServe writes three by default).
    for name in ("kserve.trace", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([saved_model(MODEL_NAME, args.model)])


# ------------------------------------------------------ MLServer's model class


@functools.cache
def mlserver_model_class() -> type:
    """MLServer's documented custom runtime over the SavedModel (``MLServerSavedModel``)."""
    import tensorflow as tf
    from mlserver import MLModel
    from mlserver.codecs import NumpyCodec
    from mlserver.types import InferenceResponse
    from mlserver.utils import get_model_uri

    class MLServerSavedModel(MLModel):
        async def load(self) -> bool:
            self._model = tf.saved_model.load(await get_model_uri(self._settings))
            return True

        async def predict(self, payload: Any) -> Any:
            rows = NumpyCodec.decode_input(payload.inputs[0])
            result = self._model.serve(tf.constant(rows)).numpy()
            return InferenceResponse(
                model_name=self.name,
                model_version=self.version,
                outputs=[NumpyCodec.encode_output("output_0", result)],
            )

    return MLServerSavedModel


def __getattr__(name: str) -> Any:
    # MLServer imports the class that model-settings.json names; build it then,
    # so that the benchmark itself never imports mlserver.
    if name == "MLServerSavedModel":
        return mlserver_model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def write_mlserver_settings(
    directory: Path, model: Path, http_port: int, grpc_port: int, metrics_port: int
) -> None:
    """``settings.json`` and ``mlp/model-settings.json`` of an MLServer repository."""
    settings = {
        "debug": False,  # no access log line per request
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
    }
    model_settings = {
        "name": MODEL_NAME,
        "implementation": f"{Path(__file__).stem}.MLServerSavedModel",
        "parameters": {"uri": str(model)},
    }
    (directory / MODEL_NAME).mkdir(parents=True)
    (directory / "settings.json").write_text(json.dumps(settings, indent=2))
    (directory / MODEL_NAME / "model-settings.json").write_text(json.dumps(model_settings))


# ------------------------------------------------------------ child: the load


def run_load(args: argparse.Namespace) -> dict[str, Any]:
    """``serve.py``'s load child, over ``--protocol``, with the one number of ``--clients``."""
    [clients] = args.clients
    protocol = PROTOCOLS[args.protocol]
    body = request_body(args.protocol, args.input_name)
    return serve.run_load(
        argparse.Namespace(**{**vars(args), "clients": clients}), protocol.path, body
    )


# ---------------------------------------------------------------- parent: peers


@dataclass(frozen=True)
class PeerCheck:
    """Whether a peer can run: its Python, or why it is skipped.

    Attributes:
        name: The peer.
        python: The Python of its virtualenv, None if it is skipped.
        versions: The versions of its package, TensorFlow and Keras there.
        skipped: Why it is skipped (with the command that creates its
            virtualenv), or None.
    """

    name: str
    python: Path | None
    versions: dict[str, str | None] = field(default_factory=dict)
    skipped: str | None = None


def find_peer(peer: Peer, venv: str | None, timeout: float = 120.0) -> PeerCheck:
    """Check that ``venv`` holds ``peer``'s package and TensorFlow.

    Args:
        peer: The peer.
        venv: The path given with its option, or None.
        timeout: Seconds the virtualenv's Python may take to report versions.

    Returns:
        The peer's Python and versions, or why it is skipped.
    """
    create = f"create it with `{peer.install_line(venv)}` and pass {peer.option} PATH"
    if venv is None:
        return PeerCheck(peer.name, None, skipped=f"{peer.option} not given; {create}")
    python = Path(venv) / "bin" / "python"
    if not python.is_file():
        return PeerCheck(peer.name, None, skipped=f"no virtualenv at {venv}: {create}")
    command = [str(python), "-c", VERSIONS_CHILD, peer.name, *PEER_DISTRIBUTIONS]
    try:
        found = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        versions = json.loads(found.stdout) if found.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        versions = None
    if versions is None:
        return PeerCheck(peer.name, None, skipped=f"the Python of {venv} does not run: {create}")
    missing = [
        name
        for name, present in (
            (peer.name, versions[peer.name]),
            ("tensorflow", versions["tensorflow-cpu"] or versions["tensorflow"]),
        )
        if not present
    ]
    if missing:
        lacks = " and ".join(missing)
        return PeerCheck(peer.name, None, versions, f"{venv} lacks {lacks}: {create}")
    return PeerCheck(peer.name, python, versions)


def peer_checks(args: argparse.Namespace) -> dict[str, PeerCheck]:
    """Each peer's check, from ``--kserve-venv`` and ``--mlserver-venv``."""
    return {
        name: find_peer(peer, getattr(args, f"{name}_venv"), args.timeout)
        for name, peer in PEERS.items()
    }


def skip_lines(checks: Mapping[str, PeerCheck]) -> list[str]:
    """A line per skipped peer, saying why and how to create its virtualenv."""
    return [
        f"{LABELS[name]} skipped: {check.skipped}"
        for name, check in checks.items()
        if check.skipped is not None
    ]


# -------------------------------------------------------------- parent: servers


def peer_environment() -> dict[str, str]:
    """The environment of a peer server: quiet TensorFlow, this directory on the path."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(BENCHMARKS))


def server_command(name: str, work: Path, port: int, python: Path | None) -> list[str]:
    """The command that starts server ``name``, its REST API on ``port``."""
    if name == "lifecycle":
        command = [sys.executable, "-c", "import lifecycle_cli; lifecycle_cli.main()", "serve"]
        command += ["--rest_api_port", str(port), "--port", "0", "--model_name", MODEL_NAME]
        return [*command, "--model_base_path", str(work / "base")]
    assert python is not None
    if name == "kserve":
        command = [str(python), str(Path(__file__).resolve()), "--variant", "kserve"]
        return [*command, "--model", str(work / "model"), "--port", str(port)]
    return [str(python.parent / "mlserver"), "start", str(work / "mlserver")]


def start_server(name: str, work: Path, logs: Path, python: Path | None) -> serve.Server:
    """Start server ``name`` on free ports; returned as soon as started."""
    ports = serve.free_ports(3)
    env = serve.child_environment()
    cwd = None
    if name == "mlserver":
        write_mlserver_settings(work / "mlserver", work / "model", *ports)
        cwd = work / "mlserver"  # MLServer keeps its metrics files under the working directory
    if name != "lifecycle":
        env = peer_environment()
    log = logs / f"server-{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            server_command(name, work, ports[0], python),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
        )
    return serve.Server(name, process, ports[0], log)


def post(url: str, body: bytes = b"", timeout: float = SWAP_TIMEOUT) -> Any:
    """POST ``body`` to ``url``; the answer parsed (``None`` if empty).

    Raises:
        RuntimeError: The answer's status is not 200 (with the answer).
    """
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read()
    except urllib.error.HTTPError as error:
        detail = error.read()[:300].decode(errors="replace")
        raise RuntimeError(f"POST {url}: status {error.code}: {detail}") from None
    return json.loads(data) if data.strip() else None


def infer(server: serve.Server, protocol: str, input_name: str) -> None:
    """Send the benchmark's request; check that the answer has the model's outputs.

    Raises:
        RuntimeError: The request failed or the answer is not one row of outputs.
    """
    path = PROTOCOLS[protocol].path
    answer = post(server.url + path, request_body(protocol, input_name), timeout=30.0)
    try:
        row = outputs_of(protocol, answer)
    except (KeyError, IndexError, TypeError):
        row = []
    if len(row) != OUTPUTS:
        raise RuntimeError(f"{server.variant} answered {path} with {str(answer)[:300]}")


def wait_ready(server: serve.Server, input_name: str, timeout: float) -> float:
    """Wait until ``server`` answers a v2 request; the seconds it took."""
    started = time.perf_counter()
    while True:
        server.check_alive()
        try:
            infer(server, "v2", input_name)
            return time.perf_counter() - started
        except (OSError, RuntimeError, ValueError):
            pass  # not listening or not loaded yet
        if time.perf_counter() - started > timeout:
            raise RuntimeError(
                f"server {server.variant} not ready after {timeout:g} s; log: "
                f"{server.log}\n{serve.tail(server.log)}"
            )
        time.sleep(0.5)


def tree(process: psutil.Process) -> list[psutil.Process]:
    """``process`` and its descendants (MLServer's inference workers)."""
    return [process, *process.children(recursive=True)]


def tree_sum(process: psutil.Process, read: Callable[[psutil.Process], float]) -> float:
    """The sum of ``read`` over ``process`` and its descendants (those still alive)."""
    import psutil

    total = 0.0
    for member in tree(process):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += read(member)
    return total


def tree_cpu_seconds(process: psutil.Process) -> float:
    """User + system seconds of ``process`` and its descendants."""
    return tree_sum(process, lambda member: sum(member.cpu_times()[:2]))


def tree_rss(process: psutil.Process) -> float:
    """RSS of ``process`` and its descendants, in bytes."""
    return tree_sum(process, lambda member: member.memory_info().rss)


# ---------------------------------------------------------------- parent: swaps


@dataclass(eq=False)
class Swapper:
    """Swaps a server's model back to back while a measured window is open.

    ``start()`` opens a window; ``stop()`` closes it and waits for the swap in
    progress (which then does not count as under load); ``check()`` raises what
    a swap raised. ``seconds`` accumulates the swaps completed within a window.
    """

    swap: Callable[[], None]
    every: float
    seconds: list[float] = field(default_factory=list)
    late: int = 0  # swaps completed after their window closed
    error: BaseException | None = None
    _open: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._open = True
        self._thread = threading.Thread(target=self._run, name="swapper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._open = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SWAP_TIMEOUT + 10)
            self._thread = None

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"a swap failed: {self.error}") from self.error

    def _run(self) -> None:
        try:
            next_swap = time.perf_counter()
            while not self._stop.wait(max(0.0, next_swap - time.perf_counter())):
                started = time.perf_counter()
                next_swap = started + self.every
                self.swap()
                if self._open:
                    self.seconds.append(time.perf_counter() - started)
                else:
                    self.late += 1
        except BaseException as error:
            self.error = error


def served_versions(server: serve.Server) -> dict[int, str]:
    """``{version: state}`` of the versions ``lifecycle serve`` lists."""
    return serve.served_versions(server.url)


@dataclass(eq=False)
class NewVersion:
    """A swap of ``lifecycle serve``: a new version directory, then a repository load."""

    server: serve.Server
    template: Path
    base: Path
    version: int = 1

    def __call__(self) -> None:
        new = self.version + 1
        staging = self.base / f".tmp-{new}"
        shutil.copytree(self.template, staging)
        os.rename(staging, self.base / str(new))
        post(self.server.url + REPOSITORY + "/load")
        deadline = time.perf_counter() + SWAP_TIMEOUT
        while served_versions(self.server) != {new: "AVAILABLE"}:
            self.server.check_alive()
            if time.perf_counter() > deadline:
                raise RuntimeError(
                    f"version {new} not served alone {SWAP_TIMEOUT:g} s after it was written: "
                    f"{served_versions(self.server)}"
                )
            time.sleep(STATUS_POLL)
        shutil.rmtree(self.base / str(self.version))
        self.version = new


def repository_load(server: serve.Server) -> Callable[[], None]:
    """A swap of a peer: a repository load of its loaded model."""
    return lambda: post(server.url + REPOSITORY + "/load")


# ---------------------------------------------------------- parent: load phases


def run_turns(
    servers: Sequence[serve.Server],
    protocol: str,
    clients: int,
    args: argparse.Namespace,
    logs: Path,
    swappers: Mapping[str, Swapper] | None = None,
) -> dict[str, dict[str, Any]]:
    """``clients`` Locust users against each of ``servers`` in turn; per server.

    Each server gets a load child of its own, so that no connection of the
    clients sits idle while another server is measured (uvicorn closes one
    after 5 s, and a request racing that close would fail).
    """
    return {
        server.variant: run_phase(server, protocol, clients, args, logs, (swappers or {}))
        for server in servers
    }


def run_phase(
    server: serve.Server,
    protocol: str,
    clients: int,
    args: argparse.Namespace,
    logs: Path,
    swappers: Mapping[str, Swapper],
) -> dict[str, Any]:
    """One load child against ``server``; its measurements.

    The CPU time of the server's process tree is read as the measured
    window opens and closes; the server's swapper (if any) runs during it.
    """
    import psutil

    server.check_alive()
    process = psutil.Process(server.process.pid)
    swapper = swappers.get(server.variant)
    cpu_started = cpu_seconds = None
    command = [sys.executable, str(Path(__file__).resolve()), "--variant", "load"]
    command += ["--url", server.url, "--clients", str(clients)]
    command += ["--protocol", protocol, "--input-name", args.input_name]
    command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]

    def on_line(line: str) -> None:
        nonlocal cpu_started, cpu_seconds
        marker = line.partition(" ")[0]
        if marker == serve.MEASURING:
            cpu_started = tree_cpu_seconds(process)
            if swapper is not None:
                swapper.start()
        elif marker == serve.MEASURED:
            if cpu_started is not None:
                cpu_seconds = tree_cpu_seconds(process) - cpu_started
            if swapper is not None:
                swapper.stop()
                swapper.check()

    label = f"against {server.variant}, {protocol}, {clients} clients"
    log = logs / f"load-{server.variant}-{protocol}-{clients}.log"
    try:
        result = serve.run_load_child(command, log, args.timeout, on_line, label)
    except RuntimeError:
        server.check_alive()  # a server that died says so first
        raise
    finally:
        if swapper is not None:
            swapper.stop()
    server.check_alive()
    [loaded] = result["servers"]
    requests = loaded["requests"]
    return {
        "requests_per_second": loaded["requests_per_second"],
        "p50_ms": loaded["p50_ms"],
        "p99_ms": loaded["p99_ms"],
        "server_cpu_ms_per_request": (
            1000 * cpu_seconds / requests if cpu_seconds is not None and requests else None
        ),
        "requests": requests,
        "failed": loaded["failed"],
        "errors": loaded["errors"][:ERRORS_KEPT],
        "load_cpu_share": loaded["load_cpu_share"],
        "load_cpu_warning": loaded["load_cpu_warning"],
    }


# ---------------------------------------------------------------- parent: memory


def memory_cycles(server: serve.Server, count: int, args: argparse.Namespace) -> dict[str, Any]:
    """``count`` cycles of repository unload + load + one request; RSS after each.

    Returns:
        ``rss_mib``: the process tree's RSS ``--settle`` seconds before the
        first cycle and ``--settle`` seconds after each; ``cycle_seconds``: each
        cycle's unload + load + request; ``error``: why a cycle failed, or
        None (the cycles stop at the first failure).
    """
    import psutil

    process = psutil.Process(server.process.pid)
    time.sleep(args.settle)
    rss = [tree_rss(process) / MIB]
    seconds: list[float] = []
    error = None
    for _ in range(count):
        server.check_alive()
        started = time.perf_counter()
        try:
            post(server.url + REPOSITORY + "/unload")
            post(server.url + REPOSITORY + "/load")
            infer(server, "v2", args.input_name)
        except (OSError, RuntimeError, ValueError) as failure:
            server.check_alive()
            error = str(failure)[:300]
            break
        seconds.append(time.perf_counter() - started)
        time.sleep(args.settle)
        rss.append(tree_rss(process) / MIB)
    return {"rss_mib": rss, "cycle_seconds": seconds, "error": error}


# --------------------------------------------------------------------- parent: run


@dataclass
class Run:
    """The measurements of every round, and the swappers that ran in them."""

    servers: list[str]
    clients: list[int]
    # Per round: {"<protocol>/<clients>": {server: phase}, "swaps": ..., "memory": ...}.
    rounds: list[dict[str, Any]] = field(default_factory=list)
    swappers: dict[str, Swapper] = field(default_factory=dict)

    @property
    def swap_clients(self) -> int:
        return max(self.clients)


def run_round(
    index: int, by_name: Mapping[str, serve.Server], run: Run, args: argparse.Namespace, logs: Path
) -> None:
    """One round: throughput, swaps, memory, servers in the round's order."""
    order = [by_name[name] for name in _harness.rotation(run.servers, index)]
    record: dict[str, Any] = {}
    run.rounds.append(record)
    for protocol, spec in PROTOCOLS.items():
        speakers = [server for server in order if server.variant in spec.servers]
        for clients in run.clients:
            print(f"round {index + 1}: {protocol}, {clients} clients ...", file=sys.stderr)
            record[f"{protocol}/{clients}"] = run_turns(speakers, protocol, clients, args, logs)
    print(f"round {index + 1}: swaps ...", file=sys.stderr)
    before = {name: len(s.seconds) for name, s in run.swappers.items()}
    phases = run_turns(order, SWAP_PROTOCOL, run.swap_clients, args, logs, run.swappers)
    for name, phase in phases.items():
        phase["swap_seconds"] = run.swappers[name].seconds[before[name] :]
    record["swaps"] = phases
    record["memory"] = {}
    for server in order:
        print(f"round {index + 1}: memory, {server.variant} ...", file=sys.stderr)
        record["memory"][server.variant] = memory_cycles(server, args.cycles, args)


def export_model(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Export the model to ``work/model`` and copy it to ``work/base/1``; the export's result."""
    print("exporting the model ...", file=sys.stderr, flush=True)
    options = ["--units", str(args.units), "--out", str(work / "model")]
    exported = _harness.spawn_child(__file__, "export", options, args.timeout)
    if exported.result is None:
        raise RuntimeError(f"exporting the model failed: {exported.error}")
    shutil.copytree(work / "model", work / "base" / "1")
    return exported.result


def run_parent(args: argparse.Namespace) -> int:
    # SIGTERM ends the run through the `finally` below, which stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    load_start = serve.load_average()
    checks = peer_checks(args)
    for line in skip_lines(checks):
        print(line, file=sys.stderr)
    names = [n for n in SERVERS if n == "lifecycle" or checks[n].python is not None]
    work = Path(tempfile.mkdtemp(prefix="lifecycle-peers-bench-"))
    logs = work / "logs"
    logs.mkdir()
    servers: list[serve.Server] = []
    failed = True
    try:
        exported = export_model(args, work)
        args.input_name = exported["input_name"]
        for name in names:
            python = None if name == "lifecycle" else checks[name].python
            servers.append(start_server(name, work, logs, python))
        for server in servers:
            seconds = wait_ready(server, args.input_name, args.timeout)
            print(f"server {server.variant} ready after {seconds:.1f} s", file=sys.stderr)
            if server.variant in PROTOCOLS["v1"].servers:
                infer(server, "v1", args.input_name)
        by_name = {server.variant: server for server in servers}
        run = Run(names, args.clients)
        for name in names:
            swap = (
                NewVersion(by_name[name], work / "model", work / "base")
                if name == "lifecycle"
                else repository_load(by_name[name])
            )
            run.swappers[name] = Swapper(swap, args.swap_every)
        for index in range(args.rounds):
            run_round(index, by_name, run, args, logs)
        print_report(args, exported["params"], load_start, checks, run)
        failed = False
        return 0
    except RuntimeError as error:
        print(f"\nbenchmark failed: {error}", file=sys.stderr)
        return 1
    finally:
        serve.stop_processes([server.process for server in servers])
        if failed:
            print(f"logs and models kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ parent: report


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: the first column left-aligned, the others right."""
    rule = ["---", *("---:" for _ in header[1:])]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, rule, *rows])


def column(run: Run, phase: str, server: str, key: str) -> list[float | None]:
    """``key`` of ``server`` in ``phase`` of each round (None where not measured)."""
    values = []
    for record in run.rounds:
        measured = record.get(phase, {}).get(server)
        values.append(None if measured is None else measured.get(key))
    return values


def ratio_cell(run: Run, phase: str, server: str, key: str) -> str:
    """lifecycle serve's ``key`` over ``server``'s, per round: median (min-max)."""
    if server == "lifecycle":
        return "-"
    ratios = _harness.per_round_ratios(
        column(run, phase, "lifecycle", key), column(run, phase, server, key)
    )
    return fmt_spread(ratios, ".2f", "x")


THROUGHPUT_HEADER = [
    "protocol, clients, server",
    "requests/s",
    "p50 ms",
    "p99 ms",
    "server CPU ms/request",
    "failed",
    "lifecycle ÷ it: requests/s",
    "lifecycle ÷ it: CPU/request",
]


def throughput_rows(run: Run) -> list[list[str]]:
    rows = []
    for protocol, spec in PROTOCOLS.items():
        for clients in run.clients:
            phase = f"{protocol}/{clients}"
            for server in (s for s in run.servers if s in spec.servers):
                failed = [v for v in column(run, phase, server, "failed") if v is not None]
                rows.append(
                    [
                        f"{spec.label}, {clients}, {LABELS[server]}",
                        fmt_spread(column(run, phase, server, "requests_per_second"), ",.0f"),
                        fmt_spread(column(run, phase, server, "p50_ms"), ".2f"),
                        fmt_spread(column(run, phase, server, "p99_ms"), ".2f"),
                        fmt_spread(column(run, phase, server, "server_cpu_ms_per_request"), ".2f"),
                        f"{sum(failed):,.0f}",
                        ratio_cell(run, phase, server, "requests_per_second"),
                        ratio_cell(run, phase, server, "server_cpu_ms_per_request"),
                    ]
                )
    return rows


SWAP_HEADER = [
    "server",
    "a swap is",
    "swaps under load",
    "swap s",
    "p99 ms during swaps",
    "p99 ÷ steady p99",
    "failed",
]


def swap_rows(run: Run) -> list[list[str]]:
    steady = f"{SWAP_PROTOCOL}/{run.swap_clients}"
    rows = []
    for server in run.servers:
        seconds = [s for r in run.rounds for s in r["swaps"][server]["swap_seconds"]]
        p99 = column(run, "swaps", server, "p99_ms")
        failed = [v for v in column(run, "swaps", server, "failed") if v is not None]
        ratios = _harness.per_round_ratios(p99, column(run, steady, server, "p99_ms"))
        rows.append(
            [
                LABELS[server],
                SWAP_WAYS[server],
                str(len(seconds)),
                fmt_spread(seconds, ".2f"),
                fmt_spread(p99, ".2f"),
                fmt_spread(ratios, ".2f", "x"),
                f"{sum(failed):,.0f}",
            ]
        )
    return rows


MEMORY_HEADER = [
    "server",
    "cycles",
    "RSS before, MiB",
    "RSS at the end, MiB",
    "MiB/cycle, per round",
    "MiB/cycle, all cycles",
    "cycle s",
    "failed cycles",
]


def joined(series: Sequence[Sequence[float]]) -> list[float]:
    """The rounds' RSS series end to end, each shifted to start where the last one ended."""
    whole: list[float] = []
    for values in series:
        shift = whole[-1] - values[0] if whole and values else 0.0
        whole += [value + shift for value in values[1 if whole else 0 :]]
    return whole


def memory_rows(run: Run) -> list[list[str]]:
    rows = []
    for server in run.servers:
        measured = [r["memory"][server] for r in run.rounds]
        series = [m["rss_mib"] for m in measured]
        seconds = [s for m in measured for s in m["cycle_seconds"]]
        rows.append(
            [
                LABELS[server],
                str(len(seconds)),
                _harness.fmt(series[0][0] if series else None, ",.0f"),
                _harness.fmt(series[-1][-1] if series else None, ",.0f"),
                fmt_spread([slope(s) for s in series], "+.2f"),
                _harness.fmt(slope(joined(series)), "+.2f"),
                fmt_spread(seconds, ".2f"),
                str(sum(m["error"] is not None for m in measured)),
            ]
        )
    return rows


def describe_run(
    args: argparse.Namespace, params: int, load_start: str, checks: Mapping[str, PeerCheck]
) -> list[str]:
    machine, software = _harness.machine_lines()
    peers = [
        f"{LABELS[name]} {check.versions.get(name)} (TensorFlow "
        f"{check.versions.get('tensorflow-cpu') or check.versions.get('tensorflow')}, "
        f"Keras {check.versions.get('keras')})"
        for name, check in checks.items()
        if check.skipped is None
    ]
    return [
        f"- {machine}",
        f"- {software}; lifecycle serve from this tree; peers: {', '.join(peers) or 'none'}",
        f"- load:     uptime load average {load_start} at the start, {serve.load_average()} at "
        "the end; load generator, servers and parent share the machine",
        f"- served:   MLP {INPUT_DIM}-{args.units}-{args.units}-{OUTPUTS}, {params:,} params "
        f"({params * 4 / MIB:.1f} MiB), Keras model.export() SavedModel; batch-1 requests, "
        "Locust FastHttpUsers with no wait",
        f"- rounds:   {args.rounds}; per round, protocol, clients "
        f"({','.join(map(str, args.clients))}) and server: {args.warmup:g} s warm-up + "
        f"{args.seconds:g} s measured, servers in turns, the order rotating; swaps every "
        f"{args.swap_every:g} s at most; {args.cycles} unload+load cycles, "
        f"{args.settle:g} s settle",
    ]


LEGEND = [
    "Cells: median over the rounds (min-max). Ratios: lifecycle serve's value over the "
    "server's, taken within each round, then their median (min-max). server CPU: user+system "
    "time of the server's process tree over the measured window / its requests. failed: "
    "summed over the rounds, warm-ups included. Swaps: p99 of the swap phase's measured "
    "windows, over the same server's steady p99 at those clients in the same round; swap s: "
    "from the swap's start (lifecycle serve: writing the version directory) to the new model "
    "alone served (the peers: the load's answer). Memory: RSS of the server's process tree "
    "before the first cycle and after each unload+load cycle; RSS at the end is after the "
    "last cycle, load phases of every round included; MiB/cycle is the least-squares slope "
    "of RSS over the cycles, per round, and over all cycles with the rounds' series joined "
    "end to end (what the load phases between them did left out).",
]


def notes(run: Run) -> list[str]:
    lines = []
    for server in run.servers:
        series = [r["memory"][server]["rss_mib"] for r in run.rounds]
        starts = ", ".join(f"{values[0]:,.0f}" for values in series)
        lines.append(
            f"- RSS of {LABELS[server]}, MiB, before and after each cycle, rounds joined: "
            f"{' '.join(f'{v:.0f}' for v in joined(series))} (each round's start as measured: "
            f"{starts})"
        )
        errors = [
            error
            for record in run.rounds
            for phases in record.values()
            if server in phases
            for error in phases[server].get("errors", ())
        ]
        cycles = [r["memory"][server]["error"] for r in run.rounds]
        errors += [error for error in cycles if error is not None]
        if errors:
            lines.append(f"- errors of {LABELS[server]}: {errors[:ERRORS_KEPT]}")
        if run.swappers.get(server) is not None and run.swappers[server].late:
            lines.append(
                f"- {LABELS[server]}: {run.swappers[server].late} swap(s) completed after their "
                "window closed (not under load)"
            )
    shares = [
        100 * phase["load_cpu_share"]
        for record in run.rounds
        for key, phases in record.items()
        if key != "memory"
        for phase in phases.values()
    ]
    lines.append(f"- load generator CPU, % of one core: {fmt_spread(shares, '.0f')}")
    if any(
        phase["load_cpu_warning"]
        for record in run.rounds
        for key, phases in record.items()
        if key != "memory"
        for phase in phases.values()
    ):
        lines.append("- Locust warned that its CPU use was over 90 %: it limited some phases.")
    return lines


def print_report(
    args: argparse.Namespace,
    params: int,
    load_start: str,
    checks: Mapping[str, PeerCheck],
    run: Run,
) -> None:
    print("\n".join(describe_run(args, params, load_start, checks)))
    print(f"\n### Throughput\n\n{markdown_table(THROUGHPUT_HEADER, throughput_rows(run))}")
    print(
        f"\n### Swaps under load ({PROTOCOLS[SWAP_PROTOCOL].label}, {run.swap_clients} clients)"
        f"\n\n{markdown_table(SWAP_HEADER, swap_rows(run))}"
    )
    print(f"\n### Unload + load cycles\n\n{markdown_table(MEMORY_HEADER, memory_rows(run))}")
    print()
    print("\n".join(LEGEND))
    print()
    print("\n".join(notes(run) + [f"- {line}" for line in skip_lines(checks)]))


# ---------------------------------------------------------------------------- main


def run_child(role: str, args: argparse.Namespace) -> dict[str, Any]:
    if role == "export":
        return run_export(args)
    if role == "kserve":
        run_kserve(args)
        return {}
    return run_load(args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    for peer in PEERS.values():
        parser.add_argument(
            peer.option,
            metavar="PATH",
            help=f"virtualenv of {LABELS[peer.name]} ({peer.install_line()}); skipped without",
        )
    parser.add_argument("--rounds", type=_harness.positive_int, default=3, help="rounds")
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="measured seconds per server and phase"
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="unmeasured seconds per server and phase"
    )
    parser.add_argument(
        "--clients",
        type=_harness.positive_ints,
        default=[1, 16],
        help="comma-separated concurrent clients; the swaps run with the largest",
    )
    parser.add_argument(
        "--units", type=_harness.positive_int, default=2048, help="hidden width (2048: 18 MiB)"
    )
    parser.add_argument(
        "--cycles", type=_harness.positive_int, default=5, help="unload+load cycles per round"
    )
    parser.add_argument(
        "--settle", type=float, default=1.0, help="seconds after a cycle before RSS is read"
    )
    parser.add_argument(
        "--swap-every", type=float, default=1.0, help="seconds between swaps' starts, at least"
    )
    _harness.add_child_arguments(parser, ROLES, timeout=300.0)
    # The children's own options.
    for name in ("--out", "--model", "--url", "--protocol", "--input-name"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    # serve.py's load child takes turns between servers in slices; here, one server each.
    parser.add_argument("--slices", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.clients = sorted(set(args.clients))
    if min(args.seconds, args.swap_every, args.timeout) <= 0:
        parser.error("--seconds, --swap-every and --timeout must be positive")
    if args.warmup < 0 or args.settle < 0:
        parser.error("--warmup and --settle must be 0 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    return _harness.run_role(parse_args(argv), run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
