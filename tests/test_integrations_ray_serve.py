"""Ray Serve multiplexing on a real local Ray: one Ray and one Serve for the module.

Each test deploys its own application (replicas are separate worker processes)
and deletes it after; the deployments are defined here and pickled by value.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")

import numpy as np  # noqa: E402
from ray import serve  # noqa: E402
from support import models as support_models  # noqa: E402
from support.models import constant_model  # noqa: E402
from support.waits import wait_until  # noqa: E402

from lifecycle.integrations.ray import multiplexed, multiplexed_statistics  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
X = [[1.0, 2.0, 3.0, 4.0]]
# Replicas take no CPU of Ray's two: several applications may be up at once.
NO_CPU = {"num_cpus": 0}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def metrics_port():
    # Ray's metrics agent exports every worker's metrics here (Prometheus text).
    port = free_port()
    # Ray's workers cannot import the tests: what they run is pickled by value.
    for module in (sys.modules[__name__], support_models):
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=port,
        # Workers push metrics every second instead of every ten.
        _system_config={"metrics_report_interval_ms": 1000},
    )
    serve.start(proxy_location="Disabled")
    yield port
    serve.shutdown()
    ray.shutdown()
    for module in (sys.modules[__name__], support_models):
        ray.cloudpickle.unregister_pickle_by_value(module)


# Each test's deployment, by name: started together in one application, so that
# their replicas (a process each, importing TensorFlow) start side by side.
DEPLOYMENTS = {}


def deployment(name: str, target):
    DEPLOYMENTS[name] = target
    return target


@pytest.fixture(scope="module")
def handles(metrics_port):
    @serve.deployment(ray_actor_options=NO_CPU)
    class Together:
        def __init__(self, *deployments) -> None:
            pass

        def __call__(self) -> str:
            return "up"

    bound = [target.options(name=name).bind() for name, target in DEPLOYMENTS.items()]
    serve.run(Together.bind(*bound), name="multiplexing", route_prefix=None)
    return {name: serve.get_deployment_handle(name, "multiplexing") for name in DEPLOYMENTS}


def model_for(model_id: str, hidden: int = 0, units: int = 1):
    """A model answering ``float(model_id)`` in its first column; holds :func:`model_bytes`."""
    return constant_model(float(model_id), features=4, outputs=units, units=hidden)


def model_bytes(hidden: int = 0, units: int = 1) -> int:
    width = hidden or 4
    return 4 * ((4 * hidden + hidden if hidden else 0) + width * units + units)


class Recorder:
    """What the loader built, read back by the test: each model's state and kernel."""

    def __init__(self) -> None:
        self.built: list[tuple[str, object, object]] = []

    def record(self, model_id: str, model) -> None:
        import weakref

        self.built.append((model_id, weakref.ref(model), model.weights[0]))

    def states(self) -> list[tuple[str, str, tuple[int, ...]]]:
        # A disposed model's kernel reads back as an empty buffer, shape (0,).
        return [
            (
                model_id,
                ref().state.value if ref() is not None else "collected",
                kernel.numpy().shape,
            )
            for model_id, ref, kernel in self.built
        ]


@serve.deployment(ray_actor_options=NO_CPU, max_ongoing_requests=32)
class Models:
    def __init__(self) -> None:
        self.recorder = Recorder()

    @multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        if model_id == "not-a-model":
            return {"not": "a model"}
        model = model_for(model_id)
        self.recorder.record(model_id, model)
        return model

    async def __call__(self, x, hold: float = 0.0) -> float:
        model = await self.get_model(serve.get_multiplexed_model_id())
        await asyncio.sleep(hold)  # a slow request: the model may be evicted meanwhile
        return float(np.asarray(model(np.asarray(x, "float32")))[0, 0])

    def statistics(self):
        return multiplexed_statistics(self)

    def states(self):
        return [(i, s, tuple(int(n) for n in shape)) for i, s, shape in self.recorder.states()]


def ask(handle, model_id: str, **kwargs):
    return handle.options(multiplexed_model_id=model_id).remote(X, **kwargs)


deployment("cycling", Models)
deployment("in-flight", Models)


def test_each_model_id_is_answered_by_its_model_and_evicted_models_are_disposed(handles):
    handle = handles["cycling"]
    ids = [str(n) for n in range(20)]
    assert [ask(handle, model_id).result() for model_id in ids] == [float(i) for i in ids]
    # Asked again, a kept model answers without a load.
    assert ask(handle, "19").result() == 19.0

    statistics = handle.statistics.remote().result()
    assert statistics.model_ids == ("18", "19")
    assert (statistics.models_loaded, statistics.models_evicted) == (20, 18)
    assert statistics.max_models == 2 and statistics.leases == 0
    assert statistics.bytes_held == 2 * (4 * 1 + 1) * 4

    # An evicted model whose last request's lease was still being returned is
    # disposed by the registry's cleaner a moment later.
    wait_until(
        lambda: handle.statistics.remote().result().models_disposed == 18,
        "the 18 evicted models disposed",
    )
    states = handle.states.remote().result()
    assert [model_id for model_id, _, _ in states] == ids
    for model_id, state, kernel_shape in states[:18]:
        assert state in {"disposed", "collected"} and kernel_shape == (0,), (model_id, state)
    assert [(state, shape) for _, state, shape in states[18:]] == [("live", (4, 1))] * 2


def test_an_evicted_model_finishes_the_requests_in_flight_then_is_disposed(handles):
    handle = handles["in-flight"]
    assert ask(handle, "7").result() == 7.0
    # Four callers hold model 7 for 2 s each while two other ids evict it.
    held = [ask(handle, "7", hold=2.0) for _ in range(4)]
    wait_until(
        lambda: handle.statistics.remote().result().leases == 4, "4 requests holding model 7"
    )
    assert [ask(handle, model_id).result() for model_id in ("8", "9")] == [8.0, 9.0]

    during = handle.statistics.remote().result()
    assert during.model_ids == ("8", "9")
    assert (during.models_evicted, during.models_draining, during.models_disposed) == (1, 1, 0)
    assert during.bytes_draining == (4 + 1) * 4
    assert handle.states.remote().result()[0] == ("7", "live", (4, 1))

    # Every caller is answered by model 7, as plain Ray would answer them.
    assert [response.result() for response in held] == [7.0] * 4
    wait_until(
        lambda: handle.statistics.remote().result().models_disposed == 1,
        "model 7 disposed once its requests ended",
    )
    assert handle.states.remote().result()[0][1:] == ("disposed", (0,))
    after = handle.statistics.remote().result()
    assert (after.models_draining, after.leases) == (0, 0)


@serve.deployment(ray_actor_options=NO_CPU)
class Budgeted:
    # Two models of 268,288 bytes fit; model 9 (4.2 MB) does not fit even alone.
    @multiplexed(max_num_models_per_replica=10, memory_budget=600_000)
    async def get_model(self, model_id: str):
        size = 1024 if model_id == "9" else 256
        return model_for(model_id, hidden=size, units=size)

    async def __call__(self, x) -> float:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return float(np.asarray(model(np.asarray(x, "float32")))[0, 0])

    def statistics(self):
        return multiplexed_statistics(self)


deployment("budgeted", Budgeted)


def test_a_memory_budget_evicts_by_bytes_and_refuses_a_model_bigger_than_itself(handles):
    handle = handles["budgeted"]
    assert [ask(handle, model_id).result() for model_id in ("1", "2", "3")] == [1.0, 2.0, 3.0]
    statistics = handle.statistics.remote().result()
    assert statistics.model_ids == ("2", "3")
    assert statistics.bytes_held == 2 * model_bytes(256, 256) == 536_576
    assert statistics.models_evicted == 1

    # Model 9 does not fit even alone: its request says so, and nothing was evicted for it.
    with pytest.raises(Exception, match="BudgetExceededError") as refused:
        ask(handle, "9").result()
    assert f"holds {model_bytes(1024, 1024)} bytes" in str(refused.value)
    assert "memory_budget of 600000 bytes" in str(refused.value)
    assert handle.statistics.remote().result().model_ids == ("2", "3")
    # The replica still serves, within its budget.
    assert ask(handle, "1").result() == 1.0
    assert handle.statistics.remote().result().model_ids == ("3", "1")


def test_a_loader_that_returns_no_model_fails_its_request_clearly(handles):
    handle = handles["in-flight"]
    with pytest.raises(Exception, match="must return a Keras model or the path") as error:
        ask(handle, "not-a-model").result()
    assert "returned dict" in str(error.value)


@serve.deployment(ray_actor_options=NO_CPU, max_ongoing_requests=32)
class Missing:
    """Ids ``missing-*`` name files that do not exist: their loads fail in the registry."""

    @multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        if model_id.startswith("missing-"):
            return f"/nonexistent/{model_id}.keras"
        return model_for(model_id)

    async def __call__(self, x) -> float:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return float(np.asarray(model(np.asarray(x, "float32")))[0, 0])

    def kept(self) -> dict[str, int]:
        """The registry's versions and the size of every container the integration keeps."""
        from lifecycle.integrations.ray._serve import _STATE

        state = vars(self)[_STATE]
        sizes = {
            name: len(value)
            for name, value in vars(state).items()
            if isinstance(value, (dict, set, list, tuple))
        }
        return {"registry versions": len(state.registry.status()), **sizes}


deployment("missing", Missing)


def test_the_ids_clients_send_grow_nothing_on_a_replica(handles):
    handle = handles["missing"]
    for n in range(30):  # failed loads, each of another id
        with pytest.raises(Exception, match="No saved model at '/nonexistent/missing-"):
            ask(handle, f"missing-{n}").result()
    for n in range(1, 21):  # 20 ids loaded in turn, 2 kept
        assert ask(handle, str(n)).result() == float(n)
    kept = handle.kept.remote().result()
    # Evicted versions drain and go; nothing remembers the 50 ids.
    wait_until(
        lambda: handle.kept.remote().result()["registry versions"] == 2, "evicted versions gone"
    )
    assert all(size <= 2 for size in kept.values()), kept


def test_the_decorator_checks_its_arguments_as_rays_does():
    with pytest.raises(TypeError, match="async functions or methods"):
        multiplexed(lambda model_id: None)
    with pytest.raises(TypeError, match="max_num_models_per_replica must be an integer"):

        @multiplexed(max_num_models_per_replica=1.5)
        async def loader(model_id: str): ...

    with pytest.raises(ValueError, match=r"`memory_budget` must be a positive int or None"):
        multiplexed(memory_budget=0)
    with pytest.raises(TypeError, match="takes a deployment instance"):
        multiplexed_statistics(object())


# A function loader and a function deployment, as in Ray's own examples.
@multiplexed(max_num_models_per_replica=1)
async def get_model(model_id: str):
    return model_for(model_id)


@serve.deployment(ray_actor_options=NO_CPU)
async def answer(x) -> dict:
    model = await get_model(serve.get_multiplexed_model_id())
    statistics = multiplexed_statistics(get_model)
    value = float(np.asarray(model(np.asarray(x, "float32")))[0, 0])
    return {"value": value, "evicted": statistics.models_evicted}


deployment("function", answer)


@pytest.mark.slow
def test_a_function_loader_works_and_rays_metrics_export_the_replicas_figures(
    handles, metrics_port
):
    handle = handles["function"]
    answers = [ask(handle, model_id).result() for model_id in ("1", "2", "3")]
    assert answers == [{"value": float(n), "evicted": n - 1} for n in (1, 2, 3)]

    def exported() -> dict[str, float]:
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        return {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("ray_lifecycle_multiplexed") and 'deployment="function"' in line
        }

    # Ray pushes worker metrics to its agent every few seconds.
    wait_until(
        lambda: exported().get("ray_lifecycle_multiplexed_models_disposed_total") == 2,
        "the disposals exported as a Ray metric",
        timeout=45,
        poll=1,
    )
    figures = exported()
    assert figures["ray_lifecycle_multiplexed_models_evicted_total"] == 2
    assert figures["ray_lifecycle_multiplexed_bytes_held"] == (4 + 1) * 4
    assert figures["ray_lifecycle_multiplexed_models_draining"] == 0


@serve.deployment(ray_actor_options=NO_CPU)
class Plain:
    """The same models with Ray's own decorator: evicted models are only dropped."""

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        return model_for(model_id, hidden=1024, units=2048)

    async def __call__(self, x) -> float:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return float(np.asarray(model(np.asarray(x, "float32")))[0, 0])

    def rss(self) -> int:
        import psutil

        return psutil.Process().memory_info().rss


@serve.deployment(ray_actor_options=NO_CPU)
class Managed(Plain.func_or_class):
    @multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        return model_for(model_id, hidden=1024, units=2048)


deployment("plain", Plain)
deployment("managed", Managed)


@pytest.mark.slow
def test_cycling_20_ids_grows_a_plain_replica_by_its_models_and_ours_by_none(handles):
    # 20 model ids, 2 kept per replica, each model 8 MiB.
    growth = {}
    for name in ("plain", "managed"):
        handle = handles[name]
        for model_id in ("0", "1", "2", "3"):  # warm-up: the replica's own first allocations
            ask(handle, model_id).result()
        before = handle.rss.remote().result()
        for n in range(4, 24):
            assert ask(handle, str(n)).result() == float(n)
        growth[name] = handle.rss.remote().result() - before
    print(growth)
    assert growth["managed"] <= 0.1 * growth["plain"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_example_serves_and_disposes_every_evicted_model():
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples/ray_serve_multiplexed.py"), "--ids", "6"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = completed.stdout
    assert "requests: 24, answered by their own model: 24, by another: 0" in out, out
    assert "failed requests: 0" in out
    assert "models loaded 6, evicted 4, disposed 4, still draining 0; kept now: 4, 5" in out


@pytest.mark.subprocess
def test_the_integration_raises_no_warning_under_w_error():
    # The user's -W error, with only the filter docs/scaling.md gives for Ray's own
    # `import ray.serve` (a pydantic deprecation in Ray's config models).
    code = """
from lifecycle.integrations.ray import managed_trainable, multiplexed, worker_statistics

@multiplexed(max_num_models_per_replica=2, memory_budget=1 << 20)
async def get_model(model_id: str):
    return model_id

def train(config):
    return config

print(managed_trainable(train).__name__, worker_statistics().models_live)
"""
    completed = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-W",
            "ignore:Using extra keyword arguments on:DeprecationWarning",
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.splitlines()[-1] == "train 0"


def test_the_ray_internals_self_check_passes_on_the_pinned_ray():
    from lifecycle.integrations.ray import _internals

    _internals.check_ray_internals()
    assert _internals.multiplex_wrapper_class().__name__ == "_ModelMultiplexWrapper"


def test_a_moved_ray_internal_fails_loudly_naming_the_ray_version(monkeypatch):
    from lifecycle.integrations.ray import _internals

    monkeypatch.setattr(_internals, "RAY_MULTIPLEXER_ATTRIBUTE", "__renamed_wrapper")
    with pytest.raises(RuntimeError, match=rf"moved in ray {ray.__version__}: .*'__renamed_"):
        _internals.check_ray_internals(tune=False)
    monkeypatch.undo()
    wrapper = _internals.multiplex_wrapper_class()
    monkeypatch.delattr(wrapper, "unload_model_lru")
    with pytest.raises(RuntimeError, match=r"_ModelMultiplexWrapper.unload_model_lru\(\) is gone"):
        _internals.check_ray_internals(tune=False)
