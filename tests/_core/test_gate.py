"""The call gate is pure Python: these tests run without TensorFlow."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from support.waits import joined, wait_until

import lifecycle._core
from lifecycle._core import CallGate


def test_core_imports_nothing_from_tensorflow_keras_or_tf_layer():
    core = Path(lifecycle._core.__file__).parent
    imported = set()
    for path in core.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add("." * node.level + (node.module or ""))
    assert imported, "no imports found: the walk is broken"
    forbidden = {"tensorflow", "keras", ".._tf", "..", "lifecycle"}
    assert not {name.split(".")[0] or name for name in imported} & forbidden, imported


def test_enter_exit_counts_threads_not_depth():
    gate = CallGate()
    assert (gate.enter(), gate.enter()) == (1, 2)
    assert gate.in_flight() == 1 and gate.held_by_current_thread()
    gate.exit()
    assert gate.held_by_current_thread()
    gate.exit()
    assert gate.in_flight() == 0 and not gate.held_by_current_thread()


def test_close_refuses_new_calls_but_lets_a_running_thread_reenter():
    gate = CallGate()
    entered, release = threading.Event(), threading.Event()
    results = []

    def worker():
        gate.enter()
        entered.set()
        release.wait(30)
        results.append(gate.enter())  # nested call while closing
        gate.exit()
        gate.exit()

    thread = threading.Thread(target=worker)
    thread.start()
    assert entered.wait(30), "the worker did not enter"
    closer = threading.Thread(target=lambda: results.append(("closed", gate.close(10))))
    closer.start()
    wait_until(lambda: gate.closed, "the gate closing")
    assert not gate.enter()  # a new caller is refused at once
    release.set()
    joined(thread, closer)
    assert results == [2, ("closed", 0)]
    assert not gate.enter()


def test_close_timeout_reopens_and_reports_calls_in_flight():
    gate = CallGate()
    finish = threading.Event()

    def worker():
        gate.enter()
        finish.wait(30)
        gate.exit()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    wait_until(lambda: gate.in_flight() == 3, "3 calls in flight")
    assert gate.close(0.05) == 3
    assert not gate.closed and gate.enter() == 1
    gate.exit()
    finish.set()
    joined(*threads)
    assert gate.close(0) == 0
