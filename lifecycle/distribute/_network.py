"""A private loopback network for local clusters (Linux network namespaces).

TensorFlow's gRPC server listens on every interface (``0.0.0.0``) whatever the
address in the cluster spec, and has no option to change that. A process that
moves into a fresh network namespace before it starts any server keeps its
servers — and those of its child processes, which inherit the namespace —
reachable from inside only: the namespace has nothing but its own loopback.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct
import threading

__all__ = ["PRIVATE_NETWORK_ENV", "enter_private_network", "in_private_network"]

#: Set to ``"1"`` in processes started inside a private network.
PRIVATE_NETWORK_ENV = "LIFECYCLE_PRIVATE_NETWORK"

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

_lock = threading.Lock()
_entered = False


def in_private_network() -> bool:
    """Whether this process runs in a private network namespace (entered or inherited)."""
    return _entered or os.environ.get(PRIVATE_NETWORK_ENV) == "1"


def _unshare(flags: int) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.unshare(flags) != 0:
        return ctypes.get_errno()
    return 0


def _map_ids(uid: int, gid: int) -> None:
    # An unprivileged user namespace needs its ids mapped before use.
    with open("/proc/self/setgroups", "w") as file:
        file.write("deny")
    with open("/proc/self/uid_map", "w") as file:
        file.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as file:
        file.write(f"{gid} {gid} 1")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def enter_private_network() -> None:
    """Move this process into a new network namespace with only a loopback.

    Call it before starting any server, and — unless the process runs as
    root — before any thread exists (that is, before importing TensorFlow):
    an unprivileged process needs a user namespace too, which the kernel grants
    only to single-threaded processes. Idempotent.

    Afterwards the process and its children reach nothing outside the
    namespace (no other host, no other local process), and nothing outside
    reaches them.

    Raises:
        OSError: The kernel refused (no namespace support, or a
            multi-threaded unprivileged process). The process is unchanged.
    """
    global _entered
    with _lock:
        if _entered:
            return
        if not os.path.exists("/proc/self/ns/net"):
            raise OSError("network namespaces are not available on this system")
        error = _unshare(_CLONE_NEWNET)
        if error:
            uid, gid = os.getuid(), os.getgid()
            error = _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
            if error:
                raise OSError(
                    error,
                    f"cannot create a private network namespace ({os.strerror(error)}); "
                    "as a non-root user, call enter_private_network() before any thread "
                    "starts (before importing TensorFlow)",
                )
            _map_ids(uid, gid)
        _loopback_up()
        _entered = True
        os.environ[PRIVATE_NETWORK_ENV] = "1"
