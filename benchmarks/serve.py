"""Server benchmark: ``lifecycle serve`` against a hand-written endpoint, and under swaps.

Four HTTP servers serve the same model, a Keras 3 SavedModel written by
``model.export()`` (the MLP of ``hot_swap.py``: Input(256) -> Dense(units,
relu) -> Dense(units, relu) -> Dense(16); ``--units 2048`` gives 4.76M params,
18.1 MiB of weights), each in a process of its own on 127.0.0.1:

    (a) handwritten  what users write today: a Starlette app whose one
                     ``async`` endpoint parses the body with orjson, calls the
                     SavedModel's ``serve`` tf.function (``tf.saved_model.load``)
                     on the event loop and answers with orjson; run by uvicorn
                     with the settings ``lifecycle serve`` uses.
    (b) steady       ``lifecycle serve --rest_api_port P --port 0`` on a base path
                     holding version 1 only.
    (c) swapping     the same with ``--file_system_poll_wait_seconds``
                     (``--poll-wait``), while a new version directory appears
                     every ``--swap-every`` seconds during (c)'s load phases.
    (d) pure Python  (b) on uvicorn's pure-Python HTTP stack, h11 and
                     asyncio's own loop: the server's ``PYTHONPATH`` starts
                     with modules ``httptools`` and ``uvloop`` that raise
                     ImportError, as if the ``serve`` extra had not installed
                     them. (b)/(d) is what they are worth.

Every request is the same TensorFlow Serving REST call, batch 1:
``POST /v1/models/mlp:predict`` with ``{"instances": [[256 floats]]}``, answered
with ``{"predictions": [[16 floats]]}``. The load comes from Locust, used as a
library in a child process per load phase: ``--clients`` ``FastHttpUser``s
with ``wait_time=constant(0)`` (each sends its next request when the last one
is answered). Locust rounds its own percentiles to whole milliseconds, so the
child records each request's exact time from Locust's ``request`` event and
computes the percentiles itself. A request fails if it raises or its status is
not 200; every failure counts, in the warm-up too.

The four servers start once and stay up. The run is ``--rounds`` rounds; each
round runs one load phase per server (``--warmup`` seconds, then ``--seconds``
measured), in an order that rotates from round to round (a b c d, b c d a,
...) so that no server always runs first or right after the swaps. A
request counts in a phase if it completes within the measured window. The
table gives, per server, the median over the rounds of requests/s, p50 and
p99, with their spread (min-max), and the server's CPU time per request
(psutil, over the measured window); the ratios (b)/(a) and (c)/(b) are taken
per round, then their median and spread reported; (b)/(d) too, without a target.

Swaps. During each of (c)'s measured windows, the parent copies version 1's
directory to ``<base>/.tmp-N`` and renames it to ``<base>/N`` every
``--swap-every`` seconds; the server's default version policy (latest) loads N,
makes it the default and unloads N-1. The parent polls ``GET /v1/models/mlp``
every 0.1 s until N is the only version listed, ``AVAILABLE``: that is one swap
(write -> served). It then deletes N-1's directory and, 0.5 s later, reads the
server's RSS (psutil): "RSS after swap k". A new version is written only once
the previous swap completed, so versions never pile up, and a swap counts as
under load if it completed within a measured window. A swap takes longer than
``--swap-every`` under load (the server loads at the lowest priority), so if
the rounds end with fewer than ``--min-swaps`` swaps under load, further (c)
phases run until there are as many: their failed requests count, their
latencies are reported apart from the table.

Targets (the report says whether each is met): (b) requests/s >= 0.95x (a)'s
and p99 <= 1.1x (a)'s; (c) p99 <= 1.5x (b)'s; no failed request over >= 50
swaps; RSS after swap 50 within 10 % of RSS after swap 1.

The parent exits non-zero if a server fails to start or dies, or a load phase
fails. Server logs go to files in a temporary directory, kept and shown on
failure; every process started is stopped at the end (by its PID), also on error.

Swap to first response (``--first-response``, instead of (a)-(d)). Two
``lifecycle serve`` processes poll their base paths every ``--poll-wait``
seconds: one loading every version in the background (``--loader_foreground_bytes
0``, the setting before small versions loaded in the foreground), one with the
default. In rounds, the order rotating, each gets a phase of its own: a child
runs ``--clients`` threads sending KServe v2 infer back to back (its answer
names the version), ``--warmup`` seconds, ``--seconds`` steady, then
``--swaps`` new versions, each copied aside and renamed into place once the
previous one answered and 1-2 s more (drawn at random, so that the renames
fall at every phase of the poll). It reports the time from each rename to the
first answer by the new version, the p99 of the steady window against the
swapping one (taken per phase), and the failed requests.

Needs the server's and the load generator's extras::

    pip install -e '.[serve,bench,loadtest]'

Run (from the repository root)::

    python benchmarks/serve.py         # 5 rounds of 4 x (2 + 20) s, then >= 50 swaps: ~11 min
    python benchmarks/serve.py --clients 8 --units 512
    # a quick look, ~1 min:
    python benchmarks/serve.py --rounds 1 --seconds 4 --units 64 --swap-every 1 --min-swaps 0
    # swap to first response, a 6.8 MiB model, ~7 min:
    python benchmarks/serve.py --first-response --units 1200 --seconds 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import _harness
from _harness import MIB, RESULT_PREFIX, fmt
from hot_swap import INPUT_DIM, OUTPUTS, build_mlp, mlp_params

if TYPE_CHECKING:
    import psutil

MODEL_NAME = "mlp"
PREDICT_PATH = f"/v1/models/{MODEL_NAME}:predict"
STATUS_PATH = f"/v1/models/{MODEL_NAME}"
VARIANTS = ("a", "b", "c", "d")
LABELS = {
    "a": "(a) hand-written Starlette + tf.function",
    "b": "(b) lifecycle serve, steady",
    "c": "(c) lifecycle serve + new versions",
    "d": "(d) lifecycle serve on h11 + asyncio",
}
# What (d)'s server finds first on its path instead of the serve extra's C HTTP stack.
PURE_PYTHON_HTTP = ("httptools", "uvloop")
# Roles of a child process (the hidden --variant).
ROLES = ("export", "handwritten", "load", "swaps")

# Printed by a load child, with the server's index, when a measured slice opens and closes.
MEASURING = "MEASURING"
MEASURED = "MEASURED"
# Seconds between two status polls of the swapping server.
STATUS_POLL = 0.1
# Seconds a swap may take (write -> the new version alone served).
SWAP_TIMEOUT = 120.0
# Seconds after a swap at which the swapping server's RSS is read.
RSS_SETTLE = 0.5
# Most extra load phases of (c) run to reach --min-swaps.
MAX_EXTRA_PHASES = 20
# Seconds a load child's clients may take to finish their request in flight.
STOP_TIMEOUT = 10.0
# Seconds a server may take to stop after SIGTERM before it is killed.
STOP_WAIT = 20.0
# Error messages kept per load phase (every failure is counted).
ERRORS_KEPT = 5
# The uvicorn settings of `lifecycle serve` (lifecycle/server/_app.py, uvicorn_config()).
UVICORN_SETTINGS: dict[str, Any] = {
    "lifespan": "on",
    "timeout_graceful_shutdown": 10.0,
    "log_level": "info",
    "access_log": False,
}
TARGETS = {
    "throughput": 0.95,  # (b)/(a) requests/s, at least
    "p99": 1.1,  # (b)/(a) p99, at most
    "swap_p99": 1.5,  # (c)/(b) p99, at most
    "swaps": 50,  # swaps under load, at least
    "rss": 0.10,  # |RSS after swap 50 / RSS after swap 1 - 1|, at most
}


def request_body() -> bytes:
    """The one request every client sends: one row of fixed pseudo-random floats."""
    import random

    rng = random.Random(0)
    row = [round(rng.uniform(-1.0, 1.0), 6) for _ in range(INPUT_DIM)]
    return json.dumps({"instances": [row]}).encode()


# ---------------------------------------------------------------- child: export


def run_export(args: argparse.Namespace) -> dict[str, Any]:
    """Write the served model with ``model.export(args.out)``."""
    model = build_mlp(args.units)
    model.export(args.out, verbose=False)
    return {"params": mlp_params(args.units)}


# ------------------------------------------------------ child: the hand-written server


def run_handwritten(args: argparse.Namespace) -> None:
    """Serve ``args.model`` the way a user writes it today, until SIGTERM.

    The whole server is the code below: load the SavedModel, call its
    tf.function in the endpoint, run the app with uvicorn.
    """
    import orjson
    import tensorflow as tf
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    model = tf.saved_model.load(args.model)

    async def predict(request: Request) -> Response:
        body = orjson.loads(await request.body())
        outputs = model.serve(tf.constant(body["instances"], dtype=tf.float32))
        return Response(
            orjson.dumps({"predictions": outputs.numpy().tolist()}),
            media_type="application/json",
        )

    app = Starlette(routes=[Route(PREDICT_PATH, predict, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=args.port, **UVICORN_SETTINGS)


# ------------------------------------------------------------ child: one load phase


def run_load(
    args: argparse.Namespace, path: str = PREDICT_PATH, body: bytes | None = None
) -> dict[str, Any]:
    """One load phase: ``--clients`` Locust users against the servers of ``--url``.

    ``--url`` is one server, or several separated by commas, which then take
    turns: all users send to one server at a time, and each server gets
    ``--slices`` turns (1 by default) of its share of ``--warmup`` unmeasured
    and of ``--seconds`` measured, the order reversed every other turn.
    Prints ``MEASURING <index>`` and ``MEASURED <index>`` (flushed) as a
    server's measured slice opens and closes, for the parent to act on. A
    request counts for the server it was sent to: measured if it is answered
    within one of that server's measured slices, failed if it fails at any
    time or is still unanswered once the clients were stopped.

    Every request is ``POST <url><path>`` with ``body`` (:func:`request_body`
    by default).

    Returns:
        ``{"servers": [...]}``, each server's result, in the order of ``--url``.
    """
    import gevent
    from locust import FastHttpUser, constant, task
    from locust.env import Environment

    urls = args.url.split(",")
    count = len(urls)
    body = request_body() if body is None else body
    headers = {"Content-Type": "application/json"}
    clock = time.perf_counter
    # The server the users send to, and the one whose slice is measured (None between).
    target: list[int] = [0]
    measuring: list[int | None] = [None]
    times_ms: list[list[float]] = [[] for _ in urls]
    errors: list[list[str]] = [[] for _ in urls]
    sent, answered, failed = [0] * count, [0] * count, [0] * count
    seconds, cpu = [0.0] * count, [0.0] * count

    class Client(FastHttpUser):
        host = urls[0]
        wait_time = constant(0)

        @task
        def predict(self) -> None:
            index = target[0]
            sent[index] += 1
            # An absolute URL: each server keeps its own connections.
            self.client.post(urls[index] + path, data=body, headers=headers,
                             name=str(index))  # fmt: skip

    def on_request(
        name: str, response_time: float, response: Any, exception: BaseException | None, **_: Any
    ) -> None:
        index = int(name)
        answered[index] += 1
        status = getattr(response, "status_code", None)
        if exception is not None or status != 200:
            failed[index] += 1
            if len(errors[index]) < ERRORS_KEPT:
                errors[index].append(f"status {status}: {exception!r}"[:300])
        elif measuring[0] == index:
            times_ms[index].append(response_time)

    environment = Environment(user_classes=[Client], stop_timeout=STOP_TIMEOUT)
    environment.events.request.add_listener(on_request)
    runner = environment.create_local_runner()
    runner.start(args.clients, spawn_rate=max(args.clients, 100))
    order = list(range(count))
    for turn in range(args.slices):
        for index in order if turn % 2 == 0 else order[::-1]:
            target[0] = index
            gevent.sleep(args.warmup / args.slices)
            print(f"{MEASURING} {index}", flush=True)
            started, cpu_started = clock(), time.process_time()
            measuring[0] = index
            gevent.sleep(args.seconds / args.slices)
            measuring[0] = None
            seconds[index] += clock() - started
            cpu[index] += time.process_time() - cpu_started
            print(f"{MEASURED} {index}", flush=True)
    runner.stop()  # each client finishes its request in flight (stop_timeout)
    runner.quit()
    results = []
    for index in order:
        unanswered = sent[index] - answered[index]
        if unanswered > 0:
            failed[index] += unanswered
            errors[index].append(
                f"{unanswered} request(s) unanswered {STOP_TIMEOUT:g} s after the end"
            )
        results.append(
            {
                "requests": len(times_ms[index]),
                "requests_per_second": len(times_ms[index]) / seconds[index],
                **percentiles_ms(times_ms[index]),
                "failed": failed[index],
                "errors": errors[index],
                "load_cpu_share": cpu[index] / seconds[index],
                "load_cpu_warning": bool(runner.cpu_warning_emitted),
            }
        )
    return {"servers": results}


def percentiles_ms(times_ms: list[float]) -> dict[str, float | None]:
    """p50, p99, p99.9 and max of request times (ms); ``None`` for too few requests."""
    if len(times_ms) < 2:
        return {"p50_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}
    cuts = statistics.quantiles(times_ms, n=1000, method="inclusive")
    return {"p50_ms": cuts[499], "p99_ms": cuts[989], "p999_ms": cuts[998], "max_ms": max(times_ms)}


# ----------------------------------------------------------------- parent: servers


@dataclass
class Server:
    """A server process of one variant, its port and its log files."""

    variant: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def label(self) -> str:
        """The variant's name in the report (the variant itself if it has none)."""
        return LABELS.get(self.variant, self.variant)

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(
                f"server {self.label} exited with code {code}; log: {self.log}\n" + tail(self.log)
            )


def tail(path: Path, lines: int = _harness.STDERR_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (all bound first, then released)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def child_environment() -> dict[str, str]:
    """The environment of every child: quiet TensorFlow, this source tree first on the path."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_harness.REPO_ROOT), env.get("PYTHONPATH", "")) if p
    )
    return env


def server_command(
    variant: str, port: int, model: Path, base: Path, poll_wait: float, extra: Sequence[str] = ()
) -> list[str]:
    """The command of a server: (a) the hand-written one, else ``lifecycle serve`` + ``extra``."""
    if variant == "a":
        script = str(Path(__file__).resolve())
        command = [sys.executable, script, "--variant", "handwritten", "--model", str(model)]
        return [*command, "--port", str(port)]
    command = [sys.executable, "-c", "import lifecycle_cli; lifecycle_cli.main()", "serve"]
    command += ["--rest_api_port", str(port), "--port", "0", "--model_name", MODEL_NAME]
    command += ["--model_base_path", str(base)]
    if variant == "c":
        command += ["--file_system_poll_wait_seconds", str(poll_wait)]
    return [*command, *extra]


def start_server(
    variant: str,
    port: int,
    model: Path,
    base: Path,
    poll_wait: float,
    logs: Path,
    extra: Sequence[str] = (),
) -> Server:
    log = logs / f"server-{variant}.log"
    env = child_environment()
    if variant == "d":
        env["PYTHONPATH"] = os.pathsep.join([str(pure_python_http(logs)), env["PYTHONPATH"]])
    with log.open("wb") as out:
        process = subprocess.Popen(
            server_command(variant, port, model, base, poll_wait, extra),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return Server(variant, process, port, log)


def pure_python_http(parent: Path) -> Path:
    """A directory of modules named as :data:`PURE_PYTHON_HTTP` that raise ImportError.

    First on a server's path, they make uvicorn pick h11 and asyncio's loop.
    """
    directory = parent / "pure-python-http"
    directory.mkdir(exist_ok=True)
    for name in PURE_PYTHON_HTTP:
        message = f"{name} is left out by benchmarks/serve.py's variant (d)"
        (directory / f"{name}.py").write_text(f"raise ImportError({message!r})\n")
    return directory


def post_predict(url: str, timeout: float = 10.0) -> int:
    """POST the benchmark's request to ``url``; the response's status."""
    request = urllib.request.Request(
        url + PREDICT_PATH, data=request_body(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        json.loads(response.read())
        return int(response.status)


def wait_ready(server: Server, timeout: float) -> float:
    """Wait until ``server`` answers the benchmark's request with 200; the seconds it took."""
    started = time.perf_counter()
    while True:
        server.check_alive()
        try:
            if post_predict(server.url) == 200:
                return time.perf_counter() - started
        except (OSError, ValueError):
            pass  # not listening yet (the port opens once the model is loaded)
        if time.perf_counter() - started > timeout:
            raise RuntimeError(
                f"server {server.label} not ready after {timeout:g} s; log: "
                f"{server.log}\n{tail(server.log)}"
            )
        time.sleep(0.25)


def stop_processes(processes: list[subprocess.Popen[Any]]) -> None:
    """SIGTERM each process, wait for it, SIGKILL it if it does not stop."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_WAIT
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ------------------------------------------------------------------ parent: swaps


def served_versions(url: str) -> dict[int, str]:
    """``{version: state}`` of the versions ``GET /v1/models/<name>`` lists."""
    with urllib.request.urlopen(url + STATUS_PATH, timeout=10.0) as response:
        body = json.loads(response.read())
    return {int(s["version"]): s["state"] for s in body["model_version_status"]}


@dataclass
class Swap:
    """One new version: when it was written, when it alone was served, RSS after it."""

    version: int
    seconds: float  # write -> the version alone listed, AVAILABLE
    under_load: bool  # completed within a measured window
    rss: int = 0  # the server's RSS, RSS_SETTLE seconds after the swap


@dataclass
class VersionWriter:
    """Writes a new version directory every ``every`` seconds during a measured window.

    ``start()`` opens a window, ``stop()`` closes it: the swap in progress, if any,
    is waited for (it then does not count as under load), and the server's RSS
    read. ``swaps`` accumulates over every window.
    """

    server: Server
    template: Path
    base: Path
    every: float
    version: int = 1
    swaps: list[Swap] = field(default_factory=list)
    error: BaseException | None = None
    _window_open: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._window_open = True
        self._thread = threading.Thread(target=self._run, name="version-writer", daemon=True)
        self._thread.start()

    def close_window(self) -> None:
        """The measured window has closed: a swap completing from now on is not under load."""
        self._window_open = False

    def stop(self) -> None:
        self._window_open = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.error is not None:
            raise RuntimeError(f"version writer failed: {self.error!r}") from self.error

    def _run(self) -> None:
        import psutil

        try:
            process = psutil.Process(self.server.process.pid)
            next_write = time.perf_counter()
            while not self._stop.wait(max(0.0, next_write - time.perf_counter())):
                next_write = time.perf_counter() + self.every
                self._swap(process)
        except BaseException as error:
            self.error = error

    def _swap(self, process: psutil.Process) -> None:
        new = self.version + 1
        staging = self.base / f".tmp-{new}"
        shutil.copytree(self.template, staging)
        os.rename(staging, self.base / str(new))
        written = time.perf_counter()
        while True:
            self.server.check_alive()
            if served_versions(self.server.url) == {new: "AVAILABLE"}:
                break
            if time.perf_counter() - written > SWAP_TIMEOUT:
                raise RuntimeError(
                    f"version {new} not served alone {SWAP_TIMEOUT:g} s after it was written: "
                    f"{served_versions(self.server.url)}"
                )
            time.sleep(STATUS_POLL)
        swap = Swap(new, time.perf_counter() - written, self._window_open)
        shutil.rmtree(self.base / str(self.version))
        self.version = new
        time.sleep(RSS_SETTLE)
        swap.rss = process.memory_info().rss
        self.swaps.append(swap)


# ------------------------------------------------------------- parent: load phases


class PhaseWindow(Protocol):
    """What runs along a load phase's measured window, such as a :class:`VersionWriter`."""

    def start(self) -> None:
        """The measured window has opened."""

    def close_window(self) -> None:
        """The measured window has closed."""

    def stop(self) -> None:
        """The load phase has ended (also on error); raise if the window's work failed."""


def run_phase(
    server: Server, args: argparse.Namespace, logs: Path, writer: PhaseWindow | None
) -> dict[str, Any]:
    """One load phase against ``server``, in a Locust child; its result.

    The server's CPU time is read when the child's measured window opens and
    closes; ``writer`` (if any) is told when the window opens and closes, and
    when the phase ends (a :class:`VersionWriter` writes versions meanwhile).
    """
    import psutil

    server.check_alive()
    server_process = psutil.Process(server.process.pid)
    command = [sys.executable, str(Path(__file__).resolve()), "--variant", "load"]
    command += ["--url", server.url, "--clients", str(args.clients)]
    command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    cpu_started = cpu_seconds = None

    def on_line(line: str) -> None:
        nonlocal cpu_started, cpu_seconds
        marker = line.partition(" ")[0]
        if marker == MEASURING:
            cpu_started = sum(server_process.cpu_times()[:2])
            if writer is not None:
                writer.start()
        elif marker == MEASURED:
            if cpu_started is not None:
                cpu_seconds = sum(server_process.cpu_times()[:2]) - cpu_started
            if writer is not None:
                writer.close_window()

    try:
        log = logs / f"load-{server.variant}.log"
        loaded = run_load_child(command, log, args.timeout, on_line, f"against {server.label}")
    except RuntimeError:
        server.check_alive()  # a server that died says so first
        raise
    finally:
        if writer is not None:
            writer.stop()
    server.check_alive()
    [result] = loaded["servers"]
    result["server_cpu_ms_per_request"] = (
        1000 * cpu_seconds / result["requests"] if cpu_seconds and result["requests"] else None
    )
    return result


def run_load_child(
    command: list[str], log: Path, timeout: float, on_line: Callable[[str], None], label: str
) -> dict[str, Any]:
    """Run a load child, handing each line it prints to ``on_line``; its result.

    The child's stderr goes to ``log``; it is killed after ``timeout`` seconds.

    Raises:
        RuntimeError: The child failed or printed no result (``label`` says which).
    """
    with log.open("ab") as errors:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            env=child_environment(),
            text=True,
        )
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    result: dict[str, Any] | None = None
    try:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.strip()
            if line.startswith(RESULT_PREFIX):
                result = json.loads(line[len(RESULT_PREFIX) :])
            else:
                on_line(line)
        code = process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()  # type: ignore[union-attr]
    if code != 0 or result is None:
        raise RuntimeError(
            f"load phase {label} failed (exit code {code}"
            f"{', no result line' if result is None else ''}); log: {log}\n{tail(log)}"
        )
    return result


# ------------------------------------------------------------------ parent: report


def per_round_ratios(
    results: dict[str, list[dict[str, Any]]], key: str, over: str, under: str
) -> list[float]:
    """``results[over][i][key] / results[under][i][key]`` for each round i that has both."""
    return _harness.per_round_ratios(
        [phase.get(key) for phase in results[over]], [phase.get(key) for phase in results[under]]
    )


def median_of(values: list[float]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def variant_rows(results: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for variant in VARIANTS:
        phases = results[variant]

        def column(key: str, phases: list[dict[str, Any]] = phases) -> list[float | None]:
            return [phase.get(key) for phase in phases]

        rows.append(
            [
                LABELS[variant],
                _harness.fmt_spread(column("requests_per_second"), ",.0f"),
                _harness.fmt_spread(column("p50_ms"), ".2f"),
                _harness.fmt_spread(column("p99_ms"), ".2f"),
                _harness.fmt_spread(column("server_cpu_ms_per_request"), ".2f"),
                _harness.fmt_spread(
                    [100 * v for v in column("load_cpu_share") if v is not None], ".0f"
                ),
                f"{sum(p['requests'] for p in phases):,}",
                str(sum(p["failed"] for p in phases)),
            ]
        )
    return rows


VARIANT_HEADER = [
    "variant",
    "requests/s",
    "p50 ms",
    "p99 ms",
    "server CPU ms/request",
    "load gen CPU %",
    "requests",
    "failed",
]
RATIO_HEADER = ["ratio, per round", "median (min-max)", "target", "met"]


def rss_after(swaps: list[Swap], count: int) -> int | None:
    """RSS after the ``count``-th swap (from 1), if there was one."""
    return swaps[count - 1].rss if len(swaps) >= count else None


def target_rows(
    results: dict[str, list[dict[str, Any]]], extra: list[dict[str, Any]], swaps: list[Swap]
) -> tuple[list[list[str]], bool]:
    """The ratio and target rows, and whether every target is met."""
    throughput = per_round_ratios(results, "requests_per_second", "b", "a")
    p99 = per_round_ratios(results, "p99_ms", "b", "a")
    swap_p99 = per_round_ratios(results, "p99_ms", "c", "b")
    under_load = sum(s.under_load for s in swaps)
    failed = sum(p["failed"] for phases in [*results.values(), extra] for p in phases)
    first, fiftieth = rss_after(swaps, 1), rss_after(swaps, TARGETS["swaps"])
    rss_ratio = fiftieth / first if first and fiftieth else None
    t_med, p_med, s_med = median_of(throughput), median_of(p99), median_of(swap_p99)
    # (row, value, target, met: None when there is nothing to judge)
    checks: list[tuple[str, str, str, bool | None]] = [
        (
            "(b)/(a) requests/s",
            _harness.fmt_spread(throughput, ".2f", "x"),
            f">= {TARGETS['throughput']:.2f}x",
            None if t_med is None else t_med >= TARGETS["throughput"],
        ),
        (
            "(b)/(a) p99",
            _harness.fmt_spread(p99, ".2f", "x"),
            f"<= {TARGETS['p99']:.2f}x",
            None if p_med is None else p_med <= TARGETS["p99"],
        ),
        (
            "(c)/(b) p99",
            _harness.fmt_spread(swap_p99, ".2f", "x"),
            f"<= {TARGETS['swap_p99']:.2f}x",
            None if s_med is None else s_med <= TARGETS["swap_p99"],
        ),
        (
            "swaps under load, failed requests",
            f"{under_load}, {failed}",
            f">= {TARGETS['swaps']}, 0",
            under_load >= TARGETS["swaps"] and failed == 0,
        ),
        (
            f"(c) RSS after swap {TARGETS['swaps']} / after swap 1",
            fmt(rss_ratio, ".3f"),
            f"1 +- {TARGETS['rss']:.2f}",
            None if rss_ratio is None else abs(rss_ratio - 1) <= TARGETS["rss"],
        ),
    ]
    rows = [
        [name, value, target, "-" if ok is None else ("yes" if ok else "NO")]
        for name, value, target, ok in checks
    ]
    # What the serve extra's C HTTP stack is worth: no target.
    for key, label in (
        ("requests_per_second", "requests/s"),
        ("server_cpu_ms_per_request", "server CPU ms/request"),
    ):
        ratios = per_round_ratios(results, key, "b", "d")
        rows.append([f"(b)/(d) {label}", _harness.fmt_spread(ratios, ".2f", "x"), "-", "-"])
    return rows, all(ok is True for *_, ok in checks)


def swap_notes(swaps: list[Swap]) -> list[str]:
    if not swaps:
        return ["swaps: none"]
    seconds = [s.seconds for s in swaps]
    series = ", ".join(
        f"{k}: {swap.rss / MIB:.0f}"
        for k, swap in enumerate(swaps, 1)
        if k == 1 or k % 10 == 0 or k == len(swaps)
    )
    return [
        f"swaps: {len(swaps)} in all, {sum(s.under_load for s in swaps)} completed under load; "
        f"write -> new version alone served: median {statistics.median(seconds):.2f} s "
        f"(min {min(seconds):.2f}, max {max(seconds):.2f}; status polled every {STATUS_POLL:g} s)",
        f"(c) RSS after swap k, MiB: {series}",
    ]


def error_notes(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    notes = []
    for variant in VARIANTS:
        errors = [e for phase in results[variant] for e in phase["errors"]]
        if errors:
            notes.append(f"errors of {LABELS[variant]}: {errors[:ERRORS_KEPT]}")
        if any(phase["load_cpu_warning"] for phase in results[variant]):
            notes.append(
                f"Locust warned that its CPU use was over 90 % against {LABELS[variant]}: "
                "the load generator limited that phase."
            )
    return notes


def describe_run(args: argparse.Namespace, params: int, load_start: str) -> list[str]:
    return [
        *_harness.machine_lines(),
        f"load:     uptime load average {load_start} at the start; load generator, servers "
        "and parent share the machine",
        f"served:   MLP {INPUT_DIM}-{args.units}-{args.units}-{OUTPUTS}, {params:,} params "
        f"({params * 4 / MIB:.1f} MiB), Keras model.export() SavedModel; batch-1 "
        f"TF Serving REST predict, {args.clients} Locust FastHttpUsers with no wait",
        f"rounds:   {args.rounds} x (a, b, c, d) in rotating order, each phase {args.warmup:g} s "
        f"warm-up + {args.seconds:g} s measured",
        f"versions: (c) polls its base path every {args.poll_wait:g} s; a new version directory "
        f"every {args.swap_every:g} s during (c)'s measured windows",
    ]


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def extra_note(extra: list[dict[str, Any]], min_swaps: int) -> list[str]:
    if not extra:
        return []
    return [
        f"extra (c) phases to reach {min_swaps} swaps under load (not in the table): "
        f"{len(extra)}, {sum(p['requests'] for p in extra):,} requests, p99 "
        f"{_harness.fmt_spread([p['p99_ms'] for p in extra], '.2f')} ms, "
        f"{sum(p['failed'] for p in extra)} failed"
    ]


def c_http_modules(process: psutil.Process) -> list[str]:
    """Which of :data:`PURE_PYTHON_HTTP`'s C modules the server process has mapped."""
    paths = [region.path for region in process.memory_maps()]
    return [name for name in PURE_PYTHON_HTTP if any(f"/{name}/" in path for path in paths)]


def print_run_report(
    args: argparse.Namespace,
    params: int,
    load_start: str,
    run: Run,
    idle_rss: dict[str, int],
    stacks: dict[str, list[str]],
) -> None:
    ratio_rows, all_met = target_rows(run.results, run.extra, run.writer.swaps)
    print("\n".join(describe_run(args, params, load_start)))
    print()
    print(_harness.render_table(VARIANT_HEADER, variant_rows(run.results)))
    print()
    print(_harness.render_table(RATIO_HEADER, ratio_rows))
    print()
    print(f"targets: {'all met' if all_met else 'NOT all met'}")
    legend = [
        "requests/s, p50, p99, server CPU, load gen CPU: median over the rounds (min-max);",
        "  p50/p99 from every request that completed in a measured window, timed by Locust",
        "  (perf_counter, send to body read). server CPU: the server process's user+system",
        "  time over the window / requests. load gen CPU: the Locust child's, % of one core.",
        "requests, failed: sums over the rounds; failed counts warm-ups too.",
        "ratios: taken per round, then their median (min-max).",
    ]
    print("\n".join(legend))
    print(
        "p99.9 ms, median (min-max): "
        + ", ".join(
            f"({v}) {_harness.fmt_spread([p['p999_ms'] for p in run.results[v]], '.1f')}"
            for v in VARIANTS
        )
    )
    print("\n".join(swap_notes(run.writer.swaps) + extra_note(run.extra, args.min_swaps)))
    print(
        "server RSS at the end, MiB: "
        + ", ".join(f"({v}) {idle_rss[v] / MIB:.0f}" for v in VARIANTS if v in idle_rss)
    )
    print(
        "C HTTP modules loaded: "
        + "; ".join(f"({v}) {', '.join(stacks[v]) or 'none'}" for v in VARIANTS if v in stacks)
    )
    print(f"load average at the end: {load_average()}")
    for note in error_notes({**run.results, "c": run.results["c"] + run.extra}):
        print(note)


# --------------------------------------------------------------------- parent: run


@dataclass
class Run:
    """The load phases run so far, and the writer of (c)'s versions."""

    writer: VersionWriter
    results: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {v: [] for v in VARIANTS}
    )
    # (c)'s phases after the rounds, to reach --min-swaps.
    extra: list[dict[str, Any]] = field(default_factory=list)

    def phase(self, server: Server, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
        writer = self.writer if server.variant == "c" else None
        result = run_phase(server, args, logs, writer)
        print(
            f"  {result['requests_per_second']:,.0f} requests/s, "
            f"p99 {fmt(result['p99_ms'], '.2f')} ms, {result['failed']} failed, "
            f"{len(self.writer.swaps)} swaps so far",
            file=sys.stderr,
            flush=True,
        )
        return result


def start_servers(args: argparse.Namespace, work: Path, logs: Path) -> list[Server]:
    """Export the model, then start the three servers; returned as soon as started."""
    template = work / "model"
    print("exporting the model ...", file=sys.stderr, flush=True)
    exported = _harness.spawn_child(
        __file__, "export", ["--units", str(args.units), "--out", str(template)], args.timeout
    )
    if exported.result is None:
        raise RuntimeError(f"exporting the model failed: {exported.error}")
    for variant in ("b", "c", "d"):
        shutil.copytree(template, work / f"base-{variant}" / "1")
    ports = free_ports(len(VARIANTS))
    return [
        start_server(v, port, template, work / f"base-{v}", args.poll_wait, logs)
        for v, port in zip(VARIANTS, ports, strict=True)
    ]


def run_parent(args: argparse.Namespace) -> int:
    import psutil

    # SIGTERM ends the run through the `finally` below, which stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    load_start = load_average()
    work = Path(tempfile.mkdtemp(prefix="lifecycle-serve-bench-"))
    logs = work / "logs"
    logs.mkdir()
    servers: list[Server] = []
    failed = True
    try:
        servers = start_servers(args, work, logs)
        for server in servers:
            seconds = wait_ready(server, args.timeout)
            print(f"server {server.variant} ready after {seconds:.1f} s", file=sys.stderr)
        by_variant = {s.variant: s for s in servers}
        run = Run(VersionWriter(by_variant["c"], work / "model", work / "base-c", args.swap_every))
        for index in range(args.rounds):
            for variant in _harness.rotation(VARIANTS, index):
                print(f"round {index + 1}: {variant} ...", file=sys.stderr, flush=True)
                run.results[variant].append(run.phase(by_variant[variant], args, logs))
        while len(run.extra) < MAX_EXTRA_PHASES:
            under_load = sum(s.under_load for s in run.writer.swaps)
            if under_load >= args.min_swaps:
                break
            print(f"extra (c) phase: {under_load} swaps so far ...", file=sys.stderr, flush=True)
            run.extra.append(run.phase(by_variant["c"], args, logs))
        idle_rss = {s.variant: psutil.Process(s.process.pid).memory_info().rss for s in servers}
        stacks = {s.variant: c_http_modules(psutil.Process(s.process.pid)) for s in servers}
        print_run_report(args, mlp_params(args.units), load_start, run, idle_rss, stacks)
        failed = False
        return 0
    except RuntimeError as error:
        print(f"\nbenchmark failed: {error}", file=sys.stderr)
        return 1
    finally:
        stop_processes([s.process for s in servers])
        if failed:
            print(f"logs and models kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------- swap to first response (--first-response)

#: ``lifecycle serve`` settings compared by ``--first-response``: extra flags of each.
LOADER_SETTINGS: dict[str, list[str]] = {
    "background": ["--loader_foreground_bytes", "0"],
    "default": [],
}
LOADER_LABELS = {
    "background": "every load in the background (--loader_foreground_bytes 0, the old default)",
    "default": "small versions in the foreground (the default, up to 40 MiB on disk)",
}
FIRST_RESPONSE_TARGETS = {"seconds": 1.0, "swap_p99": 1.5}
# Seconds each swap waits, after the new version's first response, before the next one:
# drawn uniformly, so that renames do not keep one phase of the poll interval.
SETTLE_SECONDS = (1.0, 2.0)


def run_swaps(args: argparse.Namespace) -> dict[str, Any]:
    """One phase of ``--first-response``: clients send while new versions are renamed into place.

    ``--clients`` threads send KServe v2 infer requests back to back (its
    response names the version that answered) to ``--url``: ``--warmup``
    seconds unmeasured, ``--seconds`` steady (no new version), then
    ``--swaps`` swaps: ``--model`` copied to ``<--base>/.tmp-N`` and renamed to
    ``<--base>/N``, N from ``--first-version``; the time from the rename to the
    first response by N; then a pause drawn from :data:`SETTLE_SECONDS` and the
    old version's directory deleted. Every request that raises or is not
    answered 200 fails.
    """
    import http.client
    import random
    import urllib.parse

    address = urllib.parse.urlsplit(args.url)
    host, port = address.hostname or "127.0.0.1", address.port or 80
    with urllib.request.urlopen(f"{args.url}/v2/models/{MODEL_NAME}", timeout=30) as response:
        name = json.loads(response.read())["inputs"][0]["name"]
    [row] = json.loads(request_body())["instances"]
    tensor = {"name": name, "shape": [1, INPUT_DIM], "datatype": "FP32", "data": row}
    body = json.dumps({"inputs": [tensor]}).encode()
    headers = {"Content-Type": "application/json"}
    path = f"/v2/models/{MODEL_NAME}/infer"
    clock = time.perf_counter
    stop = threading.Event()
    # Per client: (end, latency) of each answered request; failures; version -> first answer.
    answered: list[list[tuple[float, float]]] = [[] for _ in range(args.clients)]
    failures: list[str] = []
    first_answer: dict[int, float] = {}

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(host, port, timeout=30)
        mine = answered[index]
        while not stop.is_set():
            started = clock()
            try:
                connection.request("POST", path, body, headers)
                response = connection.getresponse()
                data = response.read()
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}: {data[:200]!r}")
                version = int(json.loads(data)["model_version"])
            except Exception as error:
                failures.append(f"{type(error).__name__}: {error}"[:300])
                connection.close()
                connection = http.client.HTTPConnection(host, port, timeout=30)
                continue
            ended = clock()
            mine.append((ended, ended - started))
            first_answer.setdefault(version, ended)
        connection.close()

    threads = [
        threading.Thread(target=client, args=(i,), name=f"client-{i}", daemon=True)
        for i in range(args.clients)
    ]
    for thread in threads:
        thread.start()
    rng = random.Random(args.seed)
    base, template = Path(args.base), Path(args.model)
    firsts: list[float] = []
    try:
        time.sleep(args.warmup)
        steady_from = clock()
        time.sleep(args.seconds)
        steady = (steady_from, clock())
        swapping_from = clock()
        for new in range(args.first_version, args.first_version + args.swaps):
            shutil.copytree(template, base / f".tmp-{new}")
            os.rename(base / f".tmp-{new}", base / str(new))
            renamed = clock()
            while new not in first_answer:
                if clock() - renamed > SWAP_TIMEOUT:
                    raise RuntimeError(f"version {new} did not answer within {SWAP_TIMEOUT:g} s")
                time.sleep(0.002)
            firsts.append(first_answer[new] - renamed)
            time.sleep(rng.uniform(*SETTLE_SECONDS))
            shutil.rmtree(base / str(new - 1), ignore_errors=True)
        swapping = (swapping_from, clock())
    finally:
        stop.set()
        for thread in threads:
            thread.join(STOP_TIMEOUT)

    def within(window: tuple[float, float]) -> list[float]:
        return [1000 * t for mine in answered for end, t in mine if window[0] <= end < window[1]]

    steady_ms, swapping_ms = within(steady), within(swapping)
    return {
        "first_response_s": firsts,
        "steady": {"requests": len(steady_ms), **percentiles_ms(steady_ms)},
        "swapping": {"requests": len(swapping_ms), **percentiles_ms(swapping_ms)},
        "failed": len(failures),
        "errors": failures[:ERRORS_KEPT],
    }


def first_response_rows(phases: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for setting, results in phases.items():
        firsts = [s for phase in results for s in phase["first_response_s"]]
        steady = [phase["steady"]["p99_ms"] for phase in results]
        swapping = [phase["swapping"]["p99_ms"] for phase in results]
        rows.append(
            [
                setting,
                _harness.fmt_spread(firsts, ".2f"),
                _harness.fmt_spread(
                    [statistics.median(p["first_response_s"]) for p in results], ".2f"
                ),
                f"{sum(s <= FIRST_RESPONSE_TARGETS['seconds'] for s in firsts)}/{len(firsts)}",
                _harness.fmt_spread(steady, ".1f"),
                _harness.fmt_spread(swapping, ".1f"),
                _harness.fmt_spread(_harness.per_round_ratios(swapping, steady), ".2f", "x"),
                str(sum(phase["failed"] for phase in results)),
            ]
        )
    return rows


FIRST_RESPONSE_HEADER = [
    "setting",
    "rename -> first response s",
    "per phase",
    "<= 1 s",
    "p99 steady ms",
    "p99 swapping ms",
    "swapping/steady p99",
    "failed",
]


def template_bytes(template: Path) -> int:
    """The bytes of a SavedModel's variables on disk (what the server's size check reads)."""
    return sum(f.stat().st_size for f in (template / "variables").glob("variables.data-*"))


def run_first_response(args: argparse.Namespace) -> int:
    """``--first-response``: swap to first response under load, per loader setting."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    load_start = load_average()
    work = Path(tempfile.mkdtemp(prefix="lifecycle-first-response-"))
    logs = work / "logs"
    logs.mkdir()
    template = work / "model"
    servers: list[Server] = []
    failed = True
    try:
        print("exporting the model ...", file=sys.stderr, flush=True)
        exported = _harness.spawn_child(
            __file__, "export", ["--units", str(args.units), "--out", str(template)], args.timeout
        )
        if exported.result is None:
            raise RuntimeError(f"exporting the model failed: {exported.error}")
        settings = list(LOADER_SETTINGS)
        for setting in settings:
            shutil.copytree(template, work / f"base-{setting}" / "1")
        poll = ["--file_system_poll_wait_seconds", str(args.poll_wait)]
        servers = [
            start_server(
                s, port, template, work / f"base-{s}", 0, logs, [*poll, *LOADER_SETTINGS[s]]
            )
            for s, port in zip(settings, free_ports(len(settings)), strict=True)
        ]
        for server in servers:
            print(f"server {server.variant} ready after {wait_ready(server, args.timeout):.1f} s",
                  file=sys.stderr)  # fmt: skip
        by_setting = {server.variant: server for server in servers}
        next_version = dict.fromkeys(settings, 2)
        phases: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
        for index in range(args.rounds):
            for setting in _harness.rotation(settings, index):
                print(f"round {index + 1}: {setting} ...", file=sys.stderr, flush=True)
                server = by_setting[setting]
                command = [sys.executable, str(Path(__file__).resolve()), "--variant", "swaps"]
                command += ["--url", server.url, "--clients", str(args.clients)]
                command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
                command += ["--swaps", str(args.swaps), "--seed", str(index)]
                command += ["--base", str(work / f"base-{setting}"), "--model", str(template)]
                command += ["--first-version", str(next_version[setting])]
                result = run_load_child(
                    command, logs / f"swaps-{setting}.log", args.timeout, lambda _: None, setting
                )
                server.check_alive()
                next_version[setting] += args.swaps
                phases[setting].append(result)
                print(f"  first response {_harness.fmt_spread(result['first_response_s'], '.2f')}"
                      f" s, {result['failed']} failed", file=sys.stderr, flush=True)  # fmt: skip
        params = mlp_params(args.units)
        print("\n".join(_harness.machine_lines()))
        print(f"load:     uptime load average {load_start} at the start, {load_average()} at "
              "the end; servers, clients and parent share the machine")  # fmt: skip
        print(
            f"served:   MLP {INPUT_DIM}-{args.units}-{args.units}-{OUTPUTS}, {params:,} params, "
            f"a SavedModel of {template_bytes(template) / MIB:.1f} MiB of variables; "
            f"{args.clients} client threads sending KServe v2 infer back to back"
        )
        print(
            f"rounds:   {args.rounds} x ({', '.join(settings)}) in rotating order; each phase "
            f"{args.warmup:g} s warm-up, {args.seconds:g} s steady, then {args.swaps} new "
            f"versions, each renamed into place once the last answered plus "
            f"{SETTLE_SECONDS[0]:g}-{SETTLE_SECONDS[1]:g} s; --file_system_poll_wait_seconds "
            f"{args.poll_wait:g}"
        )
        print()
        print(_harness.render_table(FIRST_RESPONSE_HEADER, first_response_rows(phases)))
        print()
        print("\n".join([
            "rename -> first response: every swap of every round, median (min-max), in seconds;",
            "  per phase: the medians of the phases, median (min-max); <= 1 s: swaps that made it.",
            "p99 steady / swapping: each phase's requests answered in its steady window and in",
            "  its swapping window (first rename to the end of the last swap), median (min-max);",
            "  swapping/steady p99 taken per phase. failed: requests, warm-ups included.",
            *(f"{key}: {LOADER_LABELS[key]}" for key in settings),
        ]))  # fmt: skip
        for setting in settings:
            errors = [e for phase in phases[setting] for e in phase["errors"]]
            if errors:
                print(f"errors of {setting}: {errors[:ERRORS_KEPT]}")
        failed = False
        return 0
    except RuntimeError as error:
        print(f"\nbenchmark failed: {error}", file=sys.stderr)
        return 1
    finally:
        stop_processes([s.process for s in servers])
        if failed:
            print(f"logs and models kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------- main


def run_child(role: str, args: argparse.Namespace) -> dict[str, Any]:
    if role == "export":
        return run_export(args)
    if role == "handwritten":
        run_handwritten(args)
        return {}
    if role == "swaps":
        return run_swaps(args)
    return run_load(args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (a, b, c, d) load phases")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per phase")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="unmeasured seconds of load before each phase"
    )
    parser.add_argument("--clients", type=int, default=4, help="concurrent Locust clients")
    parser.add_argument(
        "--units", type=int, default=2048, help="hidden width (2048 gives 4.76M params)"
    )
    parser.add_argument(
        "--swap-every", type=float, default=2.0, help="seconds between new versions in (c)"
    )
    parser.add_argument(
        "--poll-wait", type=float, default=1.0, help="(c)'s --file_system_poll_wait_seconds"
    )
    parser.add_argument(
        "--min-swaps",
        type=int,
        default=TARGETS["swaps"],
        help="after the rounds, further (c) phases run until this many swaps happened under load",
    )
    parser.add_argument(
        "--first-response",
        action="store_true",
        help="instead of (a)-(d): time from a new version's rename to its first response, "
        "and p99 during swaps, with every load in the background against the default "
        "(--rounds, --seconds steady, --warmup, --clients, --units, --poll-wait apply)",
    )
    parser.add_argument(
        "--swaps", type=int, default=8, help="with --first-response: new versions per phase"
    )
    _harness.add_child_arguments(parser, ROLES, timeout=600.0)
    # The children's own options.
    for name in ("--out", "--model", "--url", "--base"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--slices", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--first-version", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    positive = (args.rounds, args.seconds, args.clients, args.units, args.swap_every, args.slices)
    if min(positive) <= 0 or args.poll_wait <= 0 or args.timeout <= 0:
        parser.error(
            "--rounds, --seconds, --clients, --units, --swap-every, --poll-wait and "
            "--timeout must be positive"
        )
    if args.warmup < 0 or args.min_swaps < 0 or args.swaps < 1:
        parser.error("--warmup and --min-swaps must be 0 or more, --swaps 1 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.first_response and args.variant is None:
        return run_first_response(args)
    return _harness.run_role(args, run_child, run_parent)


if __name__ == "__main__":
    sys.exit(main())
