"""TensorFlow's start-up notices, kept out of the command's output.

TensorFlow's native start-up writes informational notices (oneDNN, CUDA drivers,
CPU features) straight to the process's stderr, twice, before any Python
logging is set up; ``TF_CPP_MIN_LOG_LEVEL`` does not silence them. On a terminal
they bury the command's own output. The commands that use the library import it
through :func:`import_library`, which captures file descriptor 2 meanwhile and
writes back every line but those notices. Warnings and errors stay.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

# absl's informational lines ("I0000 00:00:1796287763.806807 22228 port.cc:153] ..."),
# its note that they go to stderr, and the CPU-features notice's second line.
_NOTICE = re.compile(
    r"^(I\d{4} \d\d:\d\d:[\d.]+ +\d+ \S+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate "
    r"compiler flags\.$)"
)


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Capture file descriptor 2 for the block; then write back all but the notices."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedding host): nothing to filter
        saved = None
    if saved is None:
        yield
        return
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
            kept = [line for line in text.splitlines(keepends=True) if not _NOTICE.match(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def import_library() -> ModuleType:
    """Import keras-lifecycle, and with it TensorFlow, without TensorFlow's notices.

    Returns:
        The ``lifecycle`` package.
    """
    with filtered_stderr():
        import lifecycle
    return lifecycle
