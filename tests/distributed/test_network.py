"""Local clusters stay local: private network namespaces and the refusal outside one."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from lifecycle.distribute import LocalCluster, run_in_private_network
from lifecycle.distribute._cluster import _private_network_preexec

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
        [sys.executable, "-c", LISTENER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_private_network_preexec,
    )
    try:
        port = int(child.stdout.readline())
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        child.communicate("\n", timeout=30)


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


def test_local_cluster_refuses_the_public_network(monkeypatch):
    monkeypatch.delenv("LIFECYCLE_PRIVATE_NETWORK", raising=False)
    with pytest.raises(RuntimeError, match="private network namespace"):
        LocalCluster(workers=1, ps=1)
    with pytest.raises(ValueError, match="workers"):
        LocalCluster(workers=-1, allow_public_network=True)
