"""Shared fixtures: quiet TensorFlow, fresh Keras state, child-process runner, served models.

Helpers shared by several modules are in ``support/`` (models, servers, waits).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import ROOT

if TYPE_CHECKING:
    import lifecycle as lc


def _run_child(
    code: str,
    *,
    timeout: float = 240,
    env: dict[str, str] | None = None,
    private_network: bool = False,
    python_options: tuple[str, ...] = (),
) -> str:
    """Run Python code in a fresh interpreter; fail the test on a crash or non-zero exit.

    Crashes (segfaults) show as a negative return code, which fails the test
    with the child's output. ``python_options`` go before ``-c`` (``("-W", "error")``).
    """
    child_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    args = [sys.executable, *python_options, "-c", textwrap.dedent(code)]
    try:
        if private_network:
            # Local clusters: TensorFlow's servers listen on every interface,
            # so the child gets a network namespace with only a loopback.
            from support.clusters import run_in_private_network

            result = run_in_private_network(
                args, capture_output=True, timeout=timeout, cwd=ROOT, env=child_env
            )
        else:
            result = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=child_env
            )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"child timed out after {timeout} s; output so far:\n{exc.stdout}\n{exc.stderr}"
        )
    if result.returncode != 0:
        pytest.fail(
            f"child exited with {result.returncode}\nstdout:\n{result.stdout}\n"
            f"stderr:\n{result.stderr[-4000:]}"
        )
    return result.stdout


@pytest.fixture
def keras_state():
    """Reset Keras's global state before a test (as Keras's own tests do).

    Without its collection of the whole heap (0.2 s a test): a test that needs one
    runs it.
    """
    import keras

    keras.backend.clear_session(free_memory=False)
    yield


@pytest.fixture(autouse=True)
def _allocator_variable_restored():
    """A command run in-process sets LIFECYCLE_ALLOCATOR; later tests' children must not see it.

    Not through monkeypatch: an autouse fixture using it would undo a test's own
    patches only after the test's session closed.
    """
    name = "LIFECYCLE_ALLOCATOR"
    saved = os.environ.get(name)
    yield
    if saved is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = saved


@pytest.fixture(autouse=True)
def session(request):
    """Every test owns its models: closing its session disposes what it left live."""
    import lifecycle as lc

    with lc.LifecycleSession(
        cleanup=lc.CleanupStrategy.ON_SESSION_CLOSE, name=request.node.name
    ) as test_session:
        yield test_session


@pytest.fixture
def run_child():
    """Run Python code in a fresh interpreter (see ``_run_child``); returns stdout."""
    return _run_child


@pytest.fixture
def registry() -> Iterator[lc.ModelRegistry]:
    """A registry of the test's own, closed after it."""
    import lifecycle as lc

    with lc.ModelRegistry() as each:
        yield each


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served models of the REST and gRPC tests (``support.servers.write_models``)."""
    from support.servers import write_models

    return write_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def kserve_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models of the KServe tests, more datatypes (``support.servers.write_kserve_models``)."""
    from support.servers import write_kserve_models

    return write_kserve_models(tmp_path_factory.mktemp("kserve-models"))
