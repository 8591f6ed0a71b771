"""Peers: ``lifecycle serve`` beside KServe's and MLServer's Python servers.

Three servers on 127.0.0.1 serve the same SavedModel (the MLP of ``hot_swap.py``,
``--units`` wide, ``model.export()``), each in its own process:

    lifecycle  ``lifecycle serve`` on a base path holding version 1
    kserve     KServe's model server as its docs show it: a ``kserve.Model``
               whose ``predict()`` calls the SavedModel's ``serve`` (v2 and v1),
               a ``ModelRepository`` whose ``load(name)`` loads a new model
    mlserver   ``mlserver start DIR``, an ``mlserver.MLModel`` (``MLServerSavedModel``)

KServe and MLServer run from virtualenvs of their own (``--kserve-venv``,
``--mlserver-venv``); a peer without one is skipped, and the report says how to
create it. Every server keeps its defaults but: 127.0.0.1 and free ports, no
gRPC where it can be turned off, no log line per request. Each round measures,
the servers' order rotating:

* throughput (cases ``v2, N clients`` and ``v1, N clients``): per protocol that
  the server speaks (KServe v2 REST infer; TF Serving REST predict) and N of
  ``--clients``, a Locust child (``serve.py``'s) of ``--warmup`` + ``--seconds``:
  requests/s, p50, p99, server CPU per request (the process tree's);
* swaps (``swaps, N clients``, the largest N, v2): the same while the model is
  swapped back to back (``--swap-every``): for lifecycle a new version
  directory then a repository load, for the peers a repository load; swaps
  finished in the window, and those finishing after it;
* memory (``memory``): without load, ``--cycles`` repository unload + load + one
  request, the tree's RSS ``--settle`` s after each: MiB per cycle (slope; every
  reading in the JSON as ``series``, and the slope over all rounds' cycles in
  the report), the RSS before the first cycle and after the last.

The report names the peers' package versions.

Servers are compared with lifecycle serve within each round.

Needs ``pip install -e '.[serve,bench,loadtest]'``, and for the peers::

    python3 -m venv /tmp/peer-kserve && /tmp/peer-kserve/bin/pip install kserve \
        'tensorflow-cpu==2.21.*'
    python3 -m venv /tmp/peer-mlserver && /tmp/peer-mlserver/bin/pip install mlserver \
        'uvloop==0.21.0' 'tensorflow-cpu==2.21.*'

Run (from the repository root)::

    python benchmarks/peers.py --kserve-venv /tmp/peer-kserve --mlserver-venv /tmp/peer-mlserver
    python benchmarks/peers.py --kserve-venv /tmp/peer-kserve --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness
import serve
from _harness import MIB, Metric, Option, load, servers
from _harness.servers import Server

MODEL_NAME = serve.MODEL_NAME
REPOSITORY = f"/v2/repository/models/{MODEL_NAME}"
PATHS = {"v2": f"/v2/models/{MODEL_NAME}/infer", "v1": serve.PREDICT_PATH}
SPEAKERS = {"v2": ("lifecycle", "kserve", "mlserver"), "v1": ("lifecycle", "kserve")}
# What a peer's virtualenv needs (MLServer 1.7.1's workers crash-loop with uvloop 0.23).
PEERS = {
    "kserve": ("kserve", "'tensorflow-cpu==2.21.*'"),
    "mlserver": ("mlserver", "'uvloop==0.21.0'", "'tensorflow-cpu==2.21.*'"),
}
SWAP_TIMEOUT = load.SWAP_TIMEOUT


def request_body(protocol: str, input_name: str) -> str:
    if protocol == "v1":
        return serve.request_body().decode()
    [row] = json.loads(serve.request_body())["instances"]
    tensor = {"name": input_name, "shape": [1, len(row)], "datatype": "FP32", "data": row}
    return json.dumps({"inputs": [tensor]})


# ------------------------------------------------------------- the peers' servers


def run_kserve(args: argparse.Namespace) -> dict[str, Any]:
    """Serve ``--model`` with KServe's ModelServer until SIGTERM (in KServe's virtualenv)."""
    sys.argv = sys.argv[:1]  # KServe parses its own options when imported
    import uuid

    import kserve
    import numpy as np
    import tensorflow as tf
    import uvicorn
    from kserve import InferOutput, InferRequest, InferResponse

    class SavedModel(kserve.Model):
        def __init__(self, name: str, path: str) -> None:
            super().__init__(name)
            self.path = path
            self.load()

        def load(self) -> bool:
            self.model = tf.saved_model.load(self.path)
            self.ready = True
            return self.ready

        def predict(self, payload: Any, headers: Any = None) -> Any:
            if isinstance(payload, InferRequest):
                result = self.model.serve(tf.constant(payload.inputs[0].as_numpy())).numpy()
                output = InferOutput(name="output_0", shape=list(result.shape), datatype="FP32")
                output.set_data_from_numpy(result, binary_data=False)
                answer_id = payload.id or str(uuid.uuid4())
                return InferResponse(answer_id, model_name=self.name, infer_outputs=[output])
            rows = np.asarray(payload["instances"], dtype=np.float32)
            return {"predictions": self.model.serve(tf.constant(rows)).numpy().tolist()}

    class Repository(kserve.ModelRepository):
        # KServe's default repository cannot load a model again once unloaded.
        async def load(self, name: str) -> bool:
            model = SavedModel(name, args.model)
            self.update(model)
            return model.ready

    class Loopback(uvicorn.Config):  # KServe's REST server binds 0.0.0.0, no option
        def __init__(self, *positional: Any, **named: Any) -> None:
            super().__init__(*positional, **{**named, "host": "127.0.0.1"})

    uvicorn.Config = Loopback
    server = kserve.ModelServer(
        http_port=args.port,
        registered_models=Repository(),
        enable_grpc=False,
        enable_latency_logging=False,
    )
    for name in ("kserve.trace", "uvicorn.access"):  # no log line per request
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([SavedModel(MODEL_NAME, args.model)])
    return {}


@functools.cache
def mlserver_model_class() -> type:
    """MLServer's documented custom runtime over the SavedModel."""
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
            outputs = [NumpyCodec.encode_output("output_0", result)]
            return InferenceResponse(model_name=self.name, outputs=outputs)

    return MLServerSavedModel


def __getattr__(name: str) -> Any:
    # MLServer imports the class model-settings.json names; built then, so that the
    # benchmark itself never imports mlserver.
    if name == "MLServerSavedModel":
        return mlserver_model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def peer_python(name: str, venv: str | None) -> tuple[Path | None, str]:
    """The Python of a peer's virtualenv and its versions, or None and why it is skipped."""
    where = venv or f"/tmp/peer-{name}"
    create = f"python3 -m venv {where} && {where}/bin/pip install {' '.join(PEERS[name])}"
    python = Path(venv or "/nonexistent") / "bin" / "python"
    if not python.is_file():
        return None, f"no virtualenv at {venv} (--{name}-venv); create it: {create}"
    versions = f"import {name}, tensorflow as tf; from importlib.metadata import version as v; "
    versions += f"print('{name}', v('{name}'), 'tensorflow', tf.__version__)"
    check = subprocess.run(
        [str(python), "-c", versions], capture_output=True, text=True, timeout=300
    )
    if check.returncode != 0:
        return None, f"{venv} cannot import {name} and tensorflow; create it: {create}"
    return python, check.stdout.strip()


def start(name: str, python: Path | None, work: Path, logs: Path) -> Server:
    port, grpc, metrics = _harness.free_ports(3)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(_harness.BENCHMARKS))
    if name == "lifecycle":
        return servers.start_server(name, port, serve.lifecycle_serve(port, work / "base"), logs)
    if name == "kserve":
        command = [str(python), __file__, "--variant", "kserve", "--model", str(work / "model")]
        return servers.start_server(name, port, [*command, "--port", str(port)], logs, env)
    root = work / "mlserver"
    (root / MODEL_NAME).mkdir(parents=True)
    settings = {"debug": False, "host": "127.0.0.1", "http_port": port, "grpc_port": grpc}
    (root / "settings.json").write_text(json.dumps({**settings, "metrics_port": metrics}))
    model = {"name": MODEL_NAME, "implementation": "peers.MLServerSavedModel"}
    model["parameters"] = {"uri": str(work / "model")}
    (root / MODEL_NAME / "model-settings.json").write_text(json.dumps(model))
    command = [str(python.parent / "mlserver"), "start", "."]
    # MLServer keeps its metrics files under its working directory.
    return servers.start_server(name, port, command, logs, env, cwd=root)


# ------------------------------------------------------------------- the parent


def post(url: str, body: str = "") -> Any:
    request = urllib.request.Request(url, body.encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=SWAP_TIMEOUT) as response:
            data = response.read()
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"POST {url}: status {error.code}: {error.read()[:300]!r}") from None
    return json.loads(data) if data.strip() else None


def infer(url: str, input_name: str) -> None:
    """The benchmark's v2 request; raises unless answered with outputs."""
    answer = post(url + PATHS["v2"], request_body("v2", input_name))
    if not answer or not answer.get("outputs"):
        raise ValueError(f"{url} answered {str(answer)[:300]}")


def phase(
    server: Server,
    protocol: str,
    clients: int,
    args: argparse.Namespace,
    logs: Path,
    swap: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One Locust child against ``server``, swapping with ``swap`` if given."""
    spec = {"path": PATHS[protocol], "body": request_body(protocol, args.input_name)}
    spec |= {"clients": clients, "seconds": args.seconds, "warmup": args.warmup}
    swapper = load.Swapper(swap, args.swap_every) if swap else None
    log = logs / f"load-{server.name}-{protocol}-{clients}.log"
    [result] = load.run_load([server], spec, log, args.timeout, swapper=swapper)
    if swapper is not None:
        result["swaps"] = swapper.under_load()
        result["swaps_after_window"] = len(swapper.swaps) - swapper.under_load()
        result["swap_s"] = _harness.percentiles([s for s, *_ in swapper.swaps], 50)[0]
    return result


def memory(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """``--cycles`` repository unload + load + one request; the tree's RSS after each."""
    time.sleep(args.settle)
    rss = [server.rss() / MIB]
    started = time.perf_counter()
    for _ in range(args.cycles):
        post(server.url + REPOSITORY + "/unload")
        post(server.url + REPOSITORY + "/load")
        infer(server.url, args.input_name)
        time.sleep(args.settle)
        rss.append(server.rss() / MIB)
    cycle_s = (time.perf_counter() - started) / args.cycles - args.settle
    found = {"mib_per_cycle": _harness.slope(rss), "rss_mib": rss[-1], "cycle_s": cycle_s}
    return found | {"rss_before_mib": rss[0], "rss_series_mib": rss}


def collect(args: argparse.Namespace) -> _harness.Runs:
    pythons: dict[str, Path | None] = {"lifecycle": None}
    args.peer_notes = []
    for name in ("kserve", "mlserver"):
        python, why = peer_python(name, getattr(args, f"{name}_venv"))
        if name in args.variants and python is None:
            args.peer_notes.append(f"{name} skipped: {why}")
        elif python is not None:
            pythons[name] = python
            if name in args.variants:
                args.peer_notes.append(f"{name}'s virtualenv: {why}")
    names = [name for name in args.variants if name in pythons]
    with servers.workspace("lifecycle-peers-bench-") as (work, running):
        logs = work / "logs"
        args.input_name = serve.export_model(args.units, work / "model", args.timeout)["input_name"]
        shutil.copytree(work / "model", work / "base" / "1")
        for name in names:
            running[name] = start(name, pythons[name], work, logs)
        for server in running.values():
            servers.wait_ready(server, args.timeout, lambda url: infer(url, args.input_name))
        swaps = {
            name: functools.partial(post, server.url + REPOSITORY + "/load")
            for name, server in running.items()
        }
        if "lifecycle" in running:
            served = functools.partial(serve.served_versions, running["lifecycle"].url)
            load_new = swaps["lifecycle"]
            swaps["lifecycle"] = load.version_swap(work / "base", work / "model", served, load_new)
        runs: _harness.Runs = []
        for index in range(args.rounds):
            runs.append({name: {"cases": {}} for name in names})
            order = _harness.rotation(names, index)
            for protocol, clients in ((p, n) for p in PATHS for n in args.clients):
                for name in (name for name in order if name in SPEAKERS[protocol]):
                    print(f"round {index + 1}: {protocol}, {clients}, {name}", file=sys.stderr)
                    found = phase(running[name], protocol, clients, args, logs)
                    runs[-1][name]["cases"][f"{protocol}, {clients} clients"] = found
            for name in order:
                clients = max(args.clients)
                found = phase(running[name], "v2", clients, args, logs, swaps[name])
                steady = runs[-1][name]["cases"][f"v2, {clients} clients"]["p99_ms"]
                found["p99_over_steady"] = found["p99_ms"] / steady if steady else None
                runs[-1][name]["cases"][f"swaps, {clients} clients"] = found
            for name in order:
                runs[-1][name]["cases"]["memory"] = memory(running[name], args)
    return runs


def notes(runs: _harness.Runs, args: argparse.Namespace) -> list[str]:
    """The peers skipped or their versions, each server's RSS slope over every round, errors."""
    lines = list(getattr(args, "peer_notes", []))
    for name in args.variants:
        results = [run[name]["cases"] for run in runs if run.get(name)]
        joined = [
            mib for cases in results for mib in cases.get("memory", {}).get("rss_series_mib", [])
        ]
        if len(joined) > 1:
            lines.append(
                f"{name}: RSS over all rounds' cycles: {_harness.slope(joined):+.2f} MiB per cycle"
            )
        errors = [
            f"{case}: {e}"
            for cases in results
            for case, v in cases.items()
            for e in v.get("errors") or []
        ]
        if errors:
            lines.append(f"errors of {name}: {errors[:3]}")
    return lines


BENCHMARK = _harness.Benchmark(
    name="peers",
    doc=__doc__,
    variants={
        "lifecycle": "lifecycle serve",
        "kserve": "KServe's Python model server",
        "mlserver": "MLServer",
    },
    metrics=[
        Metric("requests_per_second", "req/s", ",.0f", "requests/s"),
        Metric("p50_ms", "ms", ".2f", "p50 ms"),
        Metric("p99_ms", "ms", ".2f", "p99 ms"),
        Metric("server_cpu_ms", "ms", ".2f", "server CPU ms/request"),
        Metric("failed", "", ".0f", "failed", ratio=False),
        Metric("load_cpu_percent", "%", ".0f", "load gen CPU %", ratio=False),
        Metric("swaps", "", ".0f", "swaps", ratio=False),
        Metric("swap_s", "s", ".2f", "swap s"),
        Metric("p99_over_steady", "x", ".2f", "p99 / steady p99", ratio=False),
        Metric("swaps_after_window", "", ".0f", "swaps after window", ratio=False),
        Metric("mib_per_cycle", "MiB", "+.2f", "MiB/cycle", False, "rss_series_mib"),
        Metric("rss_before_mib", "MiB", ",.0f", "RSS before MiB", ratio=False),
        Metric("rss_mib", "MiB", ",.0f", "RSS MiB"),
        Metric("cycle_s", "s", ".2f", "unload+load s"),
    ],
    measure=lambda role, args: run_kserve(args) if role == "kserve" else {},
    collect=collect,
    options=[
        Option("--kserve-venv", "/tmp/peer-kserve", "KServe's virtualenv"),
        Option("--mlserver-venv", "/tmp/peer-mlserver", "MLServer's virtualenv"),
        Option("--seconds", 4.0, "measured seconds per phase", _harness.positive_float),
        Option("--warmup", 1.0, "unmeasured seconds per phase"),
        Option(
            "--clients",
            "1,16",
            "comma-separated clients; swaps with the most",
            _harness.positive_ints,
        ),
        Option("--units", 2048, "hidden width (2048: 18 MiB)", _harness.positive_int),
        Option("--cycles", 5, "unload+load cycles per round", _harness.positive_int),
        Option("--settle", 1.0, "seconds after a cycle before RSS is read"),
        Option("--swap-every", 1.0, "seconds between swaps' starts", _harness.positive_float),
        Option("--model", None, argparse.SUPPRESS, str),
        Option("--port", 0, argparse.SUPPRESS),
    ],
    quick={"seconds": 1.0, "warmup": 0.5, "clients": "1,2", "units": 32, "cycles": 2},
    baseline="lifecycle",
    timeout=300.0,
    notes=notes,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
