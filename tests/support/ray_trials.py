"""What Ray Tune's workers did, seen from the driver: a named observer actor.

A trial cannot report after it ended, so the tests of the Ray Tune integration
put :class:`Observed` in front of a managed trainable (``__mixins__``, as Tune
composes function trainables): after the trainable's ``stop()`` or ``reset()``
ran, it sends the worker's statistics to the :class:`Observer` named in the
trial's config; trials send what they saw when they start with :func:`send`.
Ray's workers import this module: the test modules put ``tests/`` on their
``PYTHONPATH`` (``PYTHON_PATH`` below).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import attrs
import ray

from lifecycle.integrations.ray import worker_statistics

TESTS = Path(__file__).resolve().parent.parent
#: The workers' PYTHONPATH: the tests (for ``support``) and the repository.
PYTHON_PATH = os.pathsep.join(
    p for p in (str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH")) if p
)


@ray.remote(num_cpus=0)
class Observer:
    """Events sent by the workers of every node: trial starts, trainable stops and resets."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def record(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def all(self) -> list[dict[str, Any]]:
        return self.events

    def nodes(self) -> int:
        """Nodes on which a trial started."""
        return len({event["node"] for event in self.events if event["kind"] == "start"})


def send(name: str, kind: str, **fields: Any) -> None:
    """Send the observer ``name`` an event: this worker's statistics, process, thread, node."""
    event = {
        "kind": kind,
        "pid": os.getpid(),
        "thread": threading.get_ident(),
        "node": ray.get_runtime_context().get_node_id(),
        **attrs.asdict(worker_statistics()),
        **fields,
    }
    ray.get(ray.get_actor(name).record.remote(event))


class Observed:
    """Put in front of ManagedTrainable: reports the worker once it disposed."""

    def reset(self, new_config, *args, **kwargs):
        reset = super().reset(new_config, *args, **kwargs)
        send(self.config["observer"], "reset")
        return reset

    def stop(self):
        super().stop()
        send(self.config["observer"], "stop")
