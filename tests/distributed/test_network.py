"""Local clusters stay local: private network namespaces and the refusal outside one."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest
from support.clusters import LocalCluster, _cluster, launcher_command, run_in_private_network

LISTENER = """
import socket, sys
server = socket.socket()
server.bind(("0.0.0.0", 0))  # every interface, as TensorFlow's servers do
server.listen()
print(server.getsockname()[1], flush=True)
sys.stdin.readline()
"""


def test_a_server_inside_a_private_network_is_unreachable_from_outside():
    child = subprocess.Popen(
        launcher_command([sys.executable, "-c", LISTENER]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(child.stdout.readline())
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        child.communicate("\n", timeout=30)
    assert child.returncode == 0


def test_inside_it_the_loopback_works_and_the_marker_is_set():
    result = run_in_private_network(
        [
            sys.executable,
            "-c",
            "import os, socket; s = socket.create_server(('127.0.0.1', 0));"
            "c = socket.create_connection(s.getsockname());"
            "print('ok', os.environ['LIFECYCLE_PRIVATE_NETWORK'])",
        ],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok 1", result.stderr


def test_the_child_runs_in_a_new_network_namespace():
    result = run_in_private_network(
        [
            sys.executable,
            "-c",
            "import os, socket; print(os.readlink('/proc/self/ns/net'));"
            "print(sorted(name for _, name in socket.if_nameindex()))",
        ],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    namespace, interfaces = result.stdout.splitlines()
    assert namespace.startswith("net:[")
    assert namespace != os.readlink("/proc/self/ns/net")
    assert interfaces == "['lo']"


def test_no_python_code_runs_between_fork_and_exec(monkeypatch):
    # TensorFlow's threads run in this process: a preexec_fn could deadlock.
    calls = []
    real_popen = subprocess.Popen

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spy)
    result = run_in_private_network([sys.executable, "-c", "pass"], timeout=60)
    assert result.returncode == 0
    assert len(calls) == 1 and calls[0].get("preexec_fn") is None


def test_the_launcher_reports_a_missing_program_like_subprocess():
    with pytest.raises(FileNotFoundError, match="no-such-program-here"):
        run_in_private_network(["no-such-program-here"], timeout=60)


def test_a_refused_namespace_raises_with_the_kernels_reason(monkeypatch):
    # A user namespace of our own whose limit allows no new network namespace.
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux's unshare to build a namespace-less sandbox")
    restrict = 'echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"'

    def refused(args, *, report_fd=-1):
        sandbox = ["unshare", "--user", "--map-root-user", "sh", "-c", restrict, "sh"]
        return sandbox + launcher_command(args, report_fd=report_fd)

    probe = subprocess.run(["unshare", "--user", "--map-root-user", "true"], check=False)
    if probe.returncode != 0:
        pytest.skip("user namespaces are not available here")
    monkeypatch.setattr(_cluster, "launcher_command", refused)
    with pytest.raises(subprocess.SubprocessError, match="kernel refused a new network namespace"):
        run_in_private_network(["true"], timeout=60)


def test_options_that_would_replace_the_launcher_are_refused():
    with pytest.raises(TypeError, match="does not take `preexec_fn`"):
        run_in_private_network([sys.executable, "-c", "pass"], preexec_fn=lambda: None)
    with pytest.raises(TypeError, match="does not take `shell`"):
        run_in_private_network(["true"], shell=True)
    with pytest.raises(ValueError, match="command to run in a private network is empty"):
        run_in_private_network([])


def test_local_cluster_refuses_the_public_network(monkeypatch):
    monkeypatch.delenv("LIFECYCLE_PRIVATE_NETWORK", raising=False)
    with pytest.raises(RuntimeError, match="private network namespace"):
        LocalCluster(workers=1, ps=1)
    with pytest.raises(ValueError, match="workers"):
        LocalCluster(workers=-1, allow_public_network=True)
