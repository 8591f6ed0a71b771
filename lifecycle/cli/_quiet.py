"""TensorFlow's start-up noise, kept out of the command's output.

TensorFlow's native start-up writes straight to the process's stderr, before
any Python logging is set up, and ``TF_CPP_MIN_LOG_LEVEL`` does not silence all
of it: informational notices (oneDNN, CUDA drivers, CPU features), twice; on a
CUDA build, errors that its cuDNN, cuFFT and cuBLAS plugins were registered
twice; and when devices are first listed on a host without a GPU, a ``failed
call to cuInit`` error. On a terminal they bury the command's own output. The
commands that use the library import it through :func:`import_library`, which
captures file descriptor 2 meanwhile and writes back every line but those.
Other warnings and errors stay, and so does the cuInit error on a host that has
a GPU, where it means the driver is broken.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType


def _native(levels: str) -> str:
    # The prefix of a native log line: absl's "I0000 00:00:1796287763.806807 22228
    # port.cc:153] " or TensorFlow's own "2025-07-02 09:22:30.972636: E .../cuda_fft.cc:467] ".
    return (
        rf"(?:[{levels}]\d{{4}} \d\d:\d\d:[\d.]+ +\d+ "
        rf"|\d{{4}}-\d\d-\d\d \d\d:\d\d:[\d.]+: [{levels}] )\S+:\d+\] "
    )


# Noise on every host.
_NOTICE = re.compile(
    "^(?:"
    + "|".join(
        (
            _native("I"),  # every informational line
            r"WARNING: All log messages before absl::InitializeLog\(\) is called are written "
            r"to STDERR",
            # The CPU-features notice's second line.
            r"To enable the following instructions: .* rebuild TensorFlow with the appropriate "
            r"compiler flags\.$",
            # A CUDA build links its plugins twice; the second registration fails harmlessly.
            _native("E") + r"Unable to register cu(?:DNN|FFT|BLAS) factory: Attempting to "
            r"register factory for plugin \S+ when one has already been registered",
            _native("W") + r"computation placer already registered\. ",
        )
    )
    + ")"
)
# Noise on a host without a GPU only.
_CUINIT = re.compile("^" + _native("E") + "failed call to cuInit: ")


def is_noise(line: str, *, gpu: bool) -> bool:
    """Whether ``line`` is TensorFlow start-up noise.

    Args:
        line: One line of stderr.
        gpu: Whether the host has a GPU (:func:`gpu_present`).

    Returns:
        ``True`` for a notice, and for a failed cuInit when there is no GPU.
    """
    return bool(_NOTICE.match(line) or (not gpu and _CUINIT.match(line)))


def gpu_present() -> bool:
    """Whether this host has an NVIDIA GPU, asked of the operating system, not of CUDA.

    Returns:
        ``True`` if a GPU device node (``/dev/nvidia0``, WSL's ``/dev/dxg``) or an
        NVIDIA display controller on the PCI bus is there.
    """
    if glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/dxg"):
        return True
    for device in glob.glob("/sys/bus/pci/devices/*"):
        try:
            with open(f"{device}/vendor") as vendor, open(f"{device}/class") as class_:
                if vendor.read().strip() == "0x10de" and class_.read().startswith("0x03"):
                    return True
        except OSError:
            continue
    return False


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Capture file descriptor 2 for the block; then write back all but the noise."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedding host): nothing to filter
        saved = None
    if saved is None:
        yield
        return
    gpu = gpu_present()
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not is_noise(line, gpu=gpu)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def import_library() -> ModuleType:
    """Import keras-lifecycle, and with it TensorFlow, without TensorFlow's start-up noise.

    Also lists TensorFlow's physical devices, which initialises CUDA (the cuInit
    error comes then, not at import). Listing does not create the devices: code
    run afterwards can still configure them (``tf.config.set_visible_devices``,
    ``set_memory_growth``).

    Returns:
        The ``lifecycle`` package.
    """
    with filtered_stderr():
        # The library first: it applies LIFECYCLE_ALLOCATOR before TensorFlow starts.
        lifecycle = importlib.import_module("lifecycle")
        import tensorflow as tf

        tf.config.list_physical_devices()
    return lifecycle
