"""Server processes of the benchmarks that measure servers: start, wait, stream, stop.

Every server listens on 127.0.0.1 and a free port (:func:`_harness.free_ports`),
writes its output to a log file, and is stopped by its PID at the end of the
run, also on error: :func:`workspace` owns the temporary directory and the
servers started in it, keeps the logs and names them if the run fails.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import RESULT_PREFIX, STDERR_TAIL_LINES, child_environment

STOP_WAIT = 20.0  # seconds a server may take to stop after SIGTERM before it is killed


@dataclass
class Server:
    """A server process, its port and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"server {self.name} exited with code {code}\n{tail(self.log)}")

    def cpu_seconds(self) -> float:
        """User and system CPU seconds of the process and its descendants."""
        return self._tree_sum(lambda p: sum(p.cpu_times()[:2]))

    def rss(self) -> int:
        """Resident bytes of the process and its descendants (MLServer's workers)."""
        return int(self._tree_sum(lambda p: p.memory_info().rss))

    def _tree_sum(self, read: Callable[[Any], float]) -> float:
        import psutil

        process = psutil.Process(self.process.pid)
        total = 0.0
        for member in [process, *process.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += read(member)
        return total


def tail(path: Path) -> str:
    """The last lines of a log file."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-STDERR_TAIL_LINES:])


@contextlib.contextmanager
def workspace(prefix: str) -> Iterator[tuple[Path, dict[str, Server]]]:
    """A temporary directory (logs under ``logs/``) and the servers started in it.

    SIGTERM ends the run through here. Every server put in the mapping is
    stopped by its PID at the end; the directory is removed if the run
    succeeded, kept and named if a ``RuntimeError`` ended it (then raised as
    ``SystemExit``, the benchmark's exit code 1 with its message).
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    work = Path(tempfile.mkdtemp(prefix=prefix))
    (work / "logs").mkdir()
    servers: dict[str, Server] = {}
    try:
        yield work, servers
    except RuntimeError as error:
        raise SystemExit(f"benchmark failed: {error}\nlogs kept in {work}") from error
    finally:
        stop_processes([server.process for server in servers.values()])
    shutil.rmtree(work, ignore_errors=True)


def start_server(
    name: str,
    port: int,
    command: list[str],
    logs: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Server:
    """Start ``command`` (a server listening on ``port``), its output to ``logs``."""
    log = logs / f"server-{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env or child_environment(),
            cwd=cwd,
        )
    return Server(name, process, port, log)


def wait_ready(server: Server, timeout: float, probe: Callable[[str], object]) -> None:
    """Wait until ``probe(url)`` succeeds (an error: not listening or not loaded yet)."""
    started = time.perf_counter()
    while True:
        server.check_alive()
        try:
            probe(server.url)
            return
        except (OSError, ValueError, RuntimeError):
            pass
        if time.perf_counter() - started > timeout:
            raise RuntimeError(
                f"server {server.name} not ready in {timeout:g} s\n{tail(server.log)}"
            )
        time.sleep(0.25)


def stop_processes(processes: Sequence[subprocess.Popen[Any]]) -> None:
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


def stream_child(
    command: list[str],
    log: Path,
    timeout: float,
    on_line: Callable[[str], None],
    cwd: Path | None = None,
) -> dict[str, Any]:
    """Run a child, handing each line it prints to ``on_line``; its ``RESULT`` line.

    Its stderr goes to ``log``; it is killed after ``timeout`` seconds.

    Raises:
        RuntimeError: The child failed or printed no result line.
    """
    with log.open("ab") as errors:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            env=child_environment(),
            text=True,
            cwd=cwd,
        )
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    result = None
    try:
        for line in process.stdout or ():
            if line.startswith(RESULT_PREFIX):
                result = json.loads(line[len(RESULT_PREFIX) :])
            else:
                on_line(line.strip())
        code = process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
    if code != 0 or result is None:
        raise RuntimeError(f"child failed (exit code {code}); log: {log}\n{tail(log)}")
    return result
