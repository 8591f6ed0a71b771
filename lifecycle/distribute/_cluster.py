"""A local ``tf.distribute`` cluster: server processes on 127.0.0.1, for tests and demos.

Not part of the API (``lifecycle.distribute`` does not export it): the test suite
reaches it through ``tests/support/clusters.py``, the parameter-server example
imports it by its private path.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from .._core import check_int
from ._network import PRIVATE_NETWORK_ENV, in_private_network, launcher_command

__all__ = ["LocalCluster", "free_ports", "run_in_private_network"]

# A server process: exits by itself after its lifetime, so none outlives a
# crashed parent.
_SERVER = """
import json, os, sys, threading
threading.Timer(float(sys.argv[4]), lambda: os._exit(0)).start()
import tensorflow as tf
spec = tf.train.ClusterSpec(json.loads(sys.argv[1]))
server = tf.distribute.Server(spec, job_name=sys.argv[2], task_index=int(sys.argv[3]),
                              protocol="grpc", start=True)
print("ready", flush=True)
server.join()
"""

#: Environment of parameter-server processes. They run no heavy kernels, so
#: they use TensorFlow's plain CPU allocator (oneDNN's keeps freed blocks) with
#: a fixed mmap threshold (glibc's adaptive one keeps blocks up to 32 MiB):
#: a buffer released there goes back to the operating system at once.
PS_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "MALLOC_MMAP_THRESHOLD_": "65536"}


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (all bound at once, then closed)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def run_in_private_network(
    args: Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """Run a command in a new private network namespace (Linux) and wait for it.

    The child and everything it starts see only their own loopback network:
    servers they start, whatever address they listen on, cannot be reached
    from outside, and they cannot reach anything outside. This is how the
    test suite and the examples run local clusters, since TensorFlow's servers
    listen on every interface.

    No Python code runs in the forked child (no ``preexec_fn``, which is
    unsafe once TensorFlow's threads run): the child is a fresh interpreter
    that enters the namespace and then replaces itself with the command
    (``exec``). It needs no program besides Python; as a non-root user, the
    kernel must allow unprivileged user namespaces.

    Args:
        args: The command, e.g. ``[sys.executable, "train.py"]``.
        timeout: Seconds before the child is killed
            (``subprocess.TimeoutExpired`` is raised).
        env: Environment of the child (defaults to this process's).
        **kwargs: More ``subprocess.run`` arguments (``capture_output``,
            ``cwd``, ...), except ``executable``, ``shell`` and ``preexec_fn``.

    Returns:
        The ``subprocess.CompletedProcess`` (its ``args`` are the launcher's).

    Raises:
        subprocess.SubprocessError: The namespace could not be created (the
            kernel refused); the message says why.
        OSError: The command could not be executed (``FileNotFoundError``
            for a missing program), as with ``subprocess.run``.
        TypeError: ``executable``, ``shell`` or ``preexec_fn`` was given.
    """
    for name in ("executable", "shell", "preexec_fn"):
        if kwargs.get(name):
            raise TypeError(
                f"run_in_private_network() does not take `{name}`: the child is a launcher "
                f"that enters the namespace and then runs `args`. Received: {name}="
                f"{kwargs[name]!r}"
            )
    child_env = {**(env if env is not None else os.environ), PRIVATE_NETWORK_ENV: "1"}
    kwargs.setdefault("text", True)
    pass_fds = tuple(kwargs.pop("pass_fds", ()))
    # The launcher reports a failure on this pipe; the exec closes it unwritten.
    read_fd, write_fd = os.pipe()
    try:
        result = subprocess.run(
            launcher_command(args, report_fd=write_fd),
            timeout=timeout,
            env=child_env,
            pass_fds=(*pass_fds, write_fd),
            check=False,
            **kwargs,
        )
    finally:
        os.close(write_fd)
        # The launcher has exited or exec'd: whatever it wrote is in the pipe.
        os.set_blocking(read_fd, False)
        try:
            report = os.read(read_fd, 65536).decode(errors="replace")
        except BlockingIOError:
            report = ""
        finally:
            os.close(read_fd)
    if report:
        code, _, message = report.partition(" ")
        stage, _, detail = message.partition(": ")
        if stage == "exec":
            raise OSError(int(code), os.strerror(int(code)), args[0])
        raise subprocess.SubprocessError(
            f"run_in_private_network() could not start {args[0]!r} in a private network "
            f"namespace: {detail}"
        )
    return result


class LocalCluster:
    """Parameter servers and workers as local processes, and a chief in this one.

    Each server is a child process running ``tf.distribute.Server``, listening
    on a free port of 127.0.0.1 and exiting by itself after ``lifetime``
    seconds. This process is the chief (the coordinator). Use it as a context
    manager; leaving the block kills the servers.

    TensorFlow's servers listen on every interface, so the cluster refuses to
    start outside a private network namespace (see
    :func:`run_in_private_network`) unless ``allow_public_network=True``.

    Args:
        workers: Number of worker processes.
        ps: Number of parameter-server processes.
        lifetime: Seconds after which each server exits by itself.
        start_timeout: Seconds to wait for the servers to come up.
        allow_public_network: Start even outside a private network namespace
            (the servers are then reachable from other hosts).

    Example:
        >>> with LocalCluster(workers=1, ps=1) as cluster:  # doctest: +SKIP
        ...     strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
    """

    def __init__(
        self,
        *,
        workers: int = 1,
        ps: int = 1,
        lifetime: float = 600.0,
        start_timeout: float = 60.0,
        allow_public_network: bool = False,
    ) -> None:
        check_int(workers, "workers")
        check_int(ps, "ps")
        if workers + ps == 0:
            raise ValueError("A cluster needs at least one worker or parameter server.")
        if not allow_public_network and not in_private_network():
            raise RuntimeError(
                "LocalCluster refuses to start TensorFlow servers outside a private network "
                "namespace: they listen on every interface, not only 127.0.0.1. Run this "
                "program through run_in_private_network([...]) (or call "
                "enter_private_network() first, as root), or pass "
                "allow_public_network=True."
            )
        self.lifetime = lifetime
        self.start_timeout = start_timeout
        ports = free_ports(1 + workers + ps)
        self.cluster_spec: dict[str, list[str]] = {"chief": [f"127.0.0.1:{ports[0]}"]}
        if workers:
            self.cluster_spec["worker"] = [f"127.0.0.1:{p}" for p in ports[1 : 1 + workers]]
        if ps:
            self.cluster_spec["ps"] = [f"127.0.0.1:{p}" for p in ports[1 + workers :]]
        self._processes: dict[tuple[str, int], subprocess.Popen[str]] = {}
        self.resolver: tf.distribute.cluster_resolver.ClusterResolver | None = None

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server processes and wait until each is listening."""
        spec = json.dumps(self.cluster_spec)
        for job in ("worker", "ps"):
            for index in range(len(self.cluster_spec.get(job, []))):
                env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
                if job == "ps":
                    env.update(PS_ENV)
                self._processes[(job, index)] = subprocess.Popen(
                    [sys.executable, "-c", _SERVER, spec, job, str(index), str(self.lifetime)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=env,
                    text=True,
                )
        deadline = time.monotonic() + self.start_timeout
        for (job, index), process in self._processes.items():
            line = _readline(process, deadline)
            if line.strip() != "ready":
                raise RuntimeError(
                    f"The {job} server {index} did not start within {self.start_timeout} s "
                    f"(exit code {process.poll()})."
                )
        self.resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.cluster_spec),
            task_type="chief",
            task_id=0,
            rpc_layer="grpc",
        )

    def pid(self, job: str, index: int = 0) -> int:
        """Process id of a server, e.g. ``cluster.pid("ps")``."""
        return self._processes[(job, index)].pid

    def rss_bytes(self, job: str, index: int = 0) -> int:
        """Resident set size of a server process, in bytes (Linux ``/proc``)."""
        with open(f"/proc/{self.pid(job, index)}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def stop(self) -> None:
        """Kill the server processes (idempotent)."""
        for process in self._processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()


def _readline(process: subprocess.Popen[str], deadline: float) -> str:
    """A line of a child's output, or '' once the deadline passed or it exited."""
    import selectors

    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not selector.select(remaining):
            return ""
    return process.stdout.readline()
