"""A private loopback network for local clusters (Linux network namespaces).

TensorFlow's gRPC server listens on every interface (``0.0.0.0``) whatever the
address in the cluster spec, and has no option to change that. A process that
moves into a fresh network namespace before it starts any server keeps its
servers — and those of its child processes, which inherit the namespace —
reachable from inside only: the namespace has nothing but its own loopback.

A process already running TensorFlow has threads, so it must not run Python
code between ``fork`` and ``exec`` (``preexec_fn``). Its children instead
start as this file, run as a script by a fresh interpreter (``python -I -S``:
standard library only, no ``site``, a single thread), which enters the
namespace and then replaces itself with the real command (``exec``). It
imports nothing of the package, so no thread exists when it asks the kernel
for the namespace.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys
import threading
from collections.abc import Sequence

__all__ = ["PRIVATE_NETWORK_ENV", "enter_private_network", "in_private_network"]

#: Set to ``"1"`` in processes started inside a private network.
PRIVATE_NETWORK_ENV = "LIFECYCLE_PRIVATE_NETWORK"

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

#: Exit status of the launcher when it could not enter the namespace or exec.
LAUNCH_FAILED = 126

_lock = threading.Lock()
_entered = False


def in_private_network() -> bool:
    """Whether this process runs in a private network namespace (entered or inherited)."""
    return _entered or os.environ.get(PRIVATE_NETWORK_ENV) == "1"


def _unshare(flags: int) -> int:
    """``unshare(2)``; returns 0 or the errno."""
    unshare = getattr(os, "unshare", None)  # Python >= 3.12
    if unshare is not None:
        try:
            unshare(flags)
        except OSError as error:
            return error.errno or 1
        return 0
    # The interpreter's own symbols include the C library's (no ldconfig lookup).
    libc = ctypes.CDLL(None, use_errno=True)
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
                    "starts (before importing TensorFlow), and check that the system "
                    "allows unprivileged user namespaces",
                )
            _map_ids(uid, gid)
        _loopback_up()
        _entered = True
        os.environ[PRIVATE_NETWORK_ENV] = "1"


def launcher_command(args: Sequence[str], *, report_fd: int = -1) -> list[str]:
    """The command line that runs ``args`` in a new private network namespace.

    Args:
        args: The command to run there.
        report_fd: A file descriptor the child inherits (``pass_fds``). If the
            launcher fails it writes ``"<errno> <stage>: <message>"`` there and
            exits with :data:`LAUNCH_FAILED`; once the command is exec'd the
            descriptor closes without a byte written. ``-1``: write the message
            to standard error instead.

    Returns:
        The argument list to hand to ``subprocess``.
    """
    if not args:
        raise ValueError("The command to run in a private network is empty. Received: args=[]")
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(report_fd), *args]


def _fail(report_fd: int, errno: int, stage: str, message: str) -> None:
    if report_fd >= 0:
        os.write(report_fd, f"{errno} {stage}: {message}".encode())
    else:
        os.write(2, f"lifecycle: {message}\n".encode())
    os._exit(LAUNCH_FAILED)


def _launch(argv: Sequence[str]) -> None:
    """Enter a private network namespace, then exec ``argv[1:]`` (the launcher's body)."""
    report_fd, command = int(argv[0]), list(argv[1:])
    try:
        enter_private_network()
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        _fail(
            report_fd,
            error.errno or 0,
            "namespace",
            f"the kernel refused a new network namespace ({reason}). It needs root, or "
            "unprivileged user namespaces (sysctl user.max_user_namespaces > 0, and "
            "kernel.unprivileged_userns_clone=1 where it exists); a container must "
            "allow the unshare system call.",
        )
    if report_fd >= 0:
        # Closed by the exec: the parent reads end-of-file, and the command
        # and its children do not keep the descriptor.
        os.set_inheritable(report_fd, False)
    try:
        os.execvp(command[0], command)
    except OSError as error:
        _fail(report_fd, error.errno or 0, "exec", f"cannot run {command[0]!r}: {error.strerror}")


if __name__ == "__main__":
    _launch(sys.argv[1:])
