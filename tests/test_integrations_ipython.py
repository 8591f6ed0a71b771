"""IPython: ``%load_ext lifecycle`` in a real kernel disposes the models a notebook let go of.

Each test starts a kernel of this interpreter (``ipykernel_launcher``, on
127.0.0.1, with its kernel spec, connection file and IPython profile in the
test's temporary directory), runs cells through jupyter_client as a notebook
front end does, and checks in the kernel: a cell's ``assert`` that fails fails
the test with the kernel's traceback.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ipykernel")
jupyter_client = pytest.importorskip("jupyter_client")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402 (after the skip)

pytestmark = pytest.mark.subprocess

# The notebook's first cells: data, a model builder, and the checks the tests use.
SETUP = """
import gc
import threading
import weakref

import keras
import numpy as np

import lifecycle as lc
from lifecycle.integrations import ipython

x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)


def build():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, epochs=1, verbose=0)
    return model


def disposed(model):
    # Its state, and its buffers read back empty.
    return model.state is lc.ModelState.DISPOSED and all(
        tuple(v.numpy().shape) == (0,) for v in model.weights
    )


def usable(model):
    live = getattr(model, "state", lc.ModelState.LIVE) is lc.ModelState.LIVE
    return live and model.predict(x[:2], verbose=0).shape == (2, 1)
"""
# The cell a user re-runs. Its last value, the History, is shown as the cell's output:
# Out keeps it, and it keeps its model, which is disposed all the same (output history
# does not count) and stays alive for the checks' weak references. Cells that drop a
# model end by showing it, for the same reason.
BUILD = """
model = build()
model.fit(x, y, epochs=1, verbose=0)
"""


class Kernel:
    """A running kernel's client: runs cells, fails the test on a cell's error."""

    def __init__(self, client: jupyter_client.BlockingKernelClient) -> None:
        self.client = client

    def run(self, code: str, *, timeout: float = 120, warns: bool = False) -> str:
        """Run one cell; returns its output (stdout, stderr and the error, if any)."""
        outputs: list[str] = []

        def keep(message: dict) -> None:
            content = message["content"]
            if message["msg_type"] == "stream":
                outputs.append(content["text"])
            elif message["msg_type"] == "error":
                outputs.append("\n".join(content["traceback"]))

        reply = self.client.execute_interactive(
            textwrap.dedent(code), timeout=timeout, output_hook=keep
        )
        out = "".join(outputs)
        assert reply["content"]["status"] == "ok", f"cell failed:\n{code}\n{out}"
        # The hook's warnings go to the cell's stderr.
        assert warns == ("keras-lifecycle:" in out), out
        return out

    def statistics(self) -> dict[str, float]:
        """The extension's statistics, read in the kernel."""
        out = self.run("import attrs, json; print(json.dumps(attrs.asdict(ipython.statistics())))")
        return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    """A kernel of this interpreter, shut down after the test whatever happens."""
    spec = tmp_path / "kernels" / "lifecycle-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "keras-lifecycle tests",
                "language": "python",
                # IPython's profile and history database, in the test's directory too.
                "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "IPYTHONDIR": str(tmp_path / "ipython")},
            }
        )
    )
    manager = jupyter_client.KernelManager(
        kernel_name="lifecycle-test",
        kernel_spec_manager=KernelSpecManager(
            kernel_dirs=[str(tmp_path / "kernels")], ensure_native_kernel=False
        ),
        connection_file=str(tmp_path / "connection.json"),
        transport="tcp",
        ip="127.0.0.1",
    )
    # The kernel process's own output (TensorFlow's logs) stays in the test's directory.
    with (tmp_path / "kernel.log").open("wb") as log:
        manager.start_kernel(cwd=str(tmp_path), stdout=log, stderr=log)
        client = manager.client()
        try:
            client.start_channels()
            client.wait_for_ready(timeout=60)
            kernel = Kernel(client)
            kernel.run("%load_ext lifecycle")
            kernel.run(SETUP)
            yield kernel
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)


# The fast lane's kernel test; the others take as long.
def test_a_rebound_or_deleted_model_is_disposed_and_named_ones_stay_usable(kernel):
    kernel.run(BUILD)
    kernel.run("first = weakref.ref(model)")
    kernel.run(BUILD)  # re-run: `model` is rebound
    kernel.run("assert disposed(first()), first()\nassert usable(model)")

    kernel.run("second = weakref.ref(model)")
    kernel.run("del model")
    kernel.run("assert disposed(second()), second()")

    kernel.run("models = [build()]\nby_name = {'a': build()}")
    kernel.run("assert usable(models[0]) and usable(by_name['a'])")
    kernel.run("kept = weakref.ref(models[0])\nmodels.clear()\nkept()")
    kernel.run("assert disposed(kept())")
    statistics = kernel.statistics()
    assert statistics["models_disposed"] == 3, statistics
    assert statistics["bytes_released"] > 0, statistics
    assert statistics["models_live"] == 1, statistics  # by_name['a']
    assert 0 < statistics["max_walk_seconds"] < 1, statistics


@pytest.mark.slow
def test_what_the_namespace_reaches_stays_usable_and_only_the_rest_is_disposed(kernel):
    kernel.run(
        """
        class Experiment:
            best = None  # a class attribute of a class of the notebook's


        def predictor(model):
            return lambda: model.predict(x[:2], verbose=0)


        def traced(model):
            import tensorflow as tf

            return tf.function(lambda inputs: model(inputs))


        run = Experiment()
        run.model = build()
        Experiment.best = build()
        predict = predictor(build())
        serve = traced(build())
        nested = {"fold": [(1, build())]}
        """
    )
    # Shared layers: `whole`, no longer named, is kept: its dispose would release the
    # weights of `features`, built on its layers. `base` is a layer of `stacked`.
    kernel.run(
        """
        whole = build()
        features = keras.Model(whole.inputs, whole.layers[0].output)
        base = build()
        stacked = keras.Sequential([keras.Input((4,)), base, keras.layers.Dense(1)])
        watched = [weakref.ref(m) for m in (whole, base)]
        del whole, base
        """
    )
    kernel.run(
        """
        assert usable(run.model) and usable(Experiment.best) and usable(nested["fold"][0][1])
        assert predict().shape == (2, 1) and tuple(serve(x[:2]).shape) == (2, 1)
        assert features.predict(x[:2], verbose=0).shape == (2, 8)
        assert stacked.predict(x[:2], verbose=0).shape == (2, 1)
        assert all(usable(ref()) for ref in watched)
        """
    )
    # Only shown as a cell's output: disposed.
    kernel.run("shown = build()\nshown")
    kernel.run("shown = weakref.ref(shown)")
    kernel.run("assert disposed(shown())")
    # Disposed by hand: skipped, not disposed again.
    before = kernel.statistics()["models_disposed"]
    kernel.run(
        "by_hand = build()\nby_hand_ref = weakref.ref(by_hand)\nlc.manage(by_hand).dispose()"
    )
    kernel.run("del by_hand")
    kernel.run("assert by_hand_ref() is None or disposed(by_hand_ref())")
    assert kernel.statistics()["models_disposed"] == before


@pytest.mark.slow
def test_no_model_is_disposed_while_a_cell_or_a_thread_still_uses_it(kernel):
    kernel.run(BUILD)
    # A cell that runs a cell: nothing is disposed until the outer cell ends.
    kernel.run(
        """
        first = weakref.ref(model)
        get_ipython().run_cell("model = build()")
        assert usable(first()), "disposed while a cell was running"
        """
    )
    kernel.run("assert disposed(first())")
    # A model only a background thread's function holds, built on that thread.
    kernel.run(
        """
        built, finish, results = threading.Event(), threading.Event(), []


        def train():
            local = build()
            results.append(weakref.ref(local))
            built.set()
            finish.wait(60)
            results.append(local.predict(x[:2], verbose=0).shape)


        worker = threading.Thread(target=train)
        worker.start()
        assert built.wait(60)
        """
    )
    kernel.run("assert usable(results[0]())")  # a cell ran: the thread's model was kept
    kernel.run("finish.set()\nworker.join(60)\nassert results[1] == (2, 1), results\nresults[0]()")
    kernel.run("assert disposed(results[0]())")


@pytest.mark.slow
def test_unloading_stops_it_and_a_failing_hook_only_warns(kernel):
    kernel.run("%unload_ext lifecycle")
    kernel.run(BUILD)
    kernel.run("first = weakref.ref(model)")
    kernel.run(BUILD)
    kernel.run("assert usable(first())")
    out = kernel.run(
        """
        try:
            ipython.statistics()
        except lc.LifecycleError as error:
            print(error)
        """
    )
    assert "The notebook extension is not loaded" in out, out

    # Loaded again: the models built while it was not are not its to dispose.
    kernel.run("%load_ext lifecycle")
    kernel.run("before = weakref.ref(model)")
    kernel.run(BUILD)
    kernel.run("assert usable(before())\nassert ipython.statistics().models_live == 1")
    # A failure in the hook (from this cell on): the cell succeeds and the hook warns.
    out = kernel.run("ipython._NotebookCleaner._rotate = lambda self, failed: 1 / 0", warns=True)
    assert "the notebook clean-up failed: ZeroDivisionError: division by zero" in out, out
