"""Entry point of the ``lifecycle`` command, outside the package.

Importing keras-lifecycle imports TensorFlow, whose native start-up writes
informational notices straight to the process's stderr (oneDNN, CUDA drivers,
CPU features), twice, before any Python logging is set up;
``TF_CPP_MIN_LOG_LEVEL`` does not silence them. On a terminal they bury the
command's own output, so this module imports the package with stderr captured
and writes back every line but those notices. Warnings and errors stay.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

__all__ = ["main"]

# absl's informational lines ("I0000 00:00:1796287763.806807 22228 port.cc:153] ..."),
# its note that they go to stderr, and the CPU-features notice's second line.
_NOTICE = re.compile(
    r"^(I\d{4} \d\d:\d\d:[\d.]+ +\d+ \S+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate "
    r"compiler flags\.$)"
)


def _import_quietly() -> None:
    """Import ``lifecycle.cli`` with fd 2 captured; write back all but TF's notices."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedding host): nothing to filter
        import lifecycle.cli

        return
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import lifecycle.cli  # noqa: F401  (imports TensorFlow)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [
                line
                for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                if not _NOTICE.match(line)
            ]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def main() -> None:
    """Run the ``lifecycle`` command."""
    _import_quietly()
    from lifecycle.cli import main as run

    run()
