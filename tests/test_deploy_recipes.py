"""The deployment recipes of deploy/ against the real server.

deploy/Dockerfile, deploy/kubernetes.yaml and deploy/kserve/*.yaml are parsed: every
argument they give `lifecycle serve` is parsed by the command itself and checked by the
server's own flag checks; their ports and probes are the ports those arguments open.
Then `lifecycle serve` runs once with the KServe runtime's arguments (the model
directory a temporary one holding an exported model, free ports, bound to loopback),
and each probe's path and a v2 inference request are sent to it as the kubelet and
KServe's router would send them. The image itself is not built here.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import keras
import numpy as np
import pytest
import typer.main
import yaml
from support import ROOT
from support.servers import SERVE, Served, free_port, stop
from support.waits import wait_until

from lifecycle import cli
from lifecycle.cli._serve import server_flags
from lifecycle.server import ServerConfig

DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
RUNTIME = DEPLOY / "kserve" / "serving-runtime.yaml"
INFERENCE_SERVICE = DEPLOY / "kserve" / "inference-service.yaml"
KUBERNETES = DEPLOY / "kubernetes.yaml"

LIVE, READY = "/v2/health/live", "/v2/health/ready"
NAME = "risk"  # what KServe puts for {{.Name}}: the InferenceService's name
X = np.array([[1.0, 2.0, 3.0]], "float32")


# -- reading the recipes ------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, ``(INSTRUCTION, arguments)``, continuations joined.

    Comment lines go first, as Docker drops them (a comment ending in a backslash
    continues nothing).
    """
    lines = [
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.strip().partition(" ") for line in joined.splitlines())
        if word
    ]


def instruction(name: str) -> list[str]:
    """The arguments of every ``name`` instruction of the Dockerfile."""
    return [arguments for word, arguments in dockerfile() if word == name]


def exec_form(name: str) -> list[str]:
    """The last ``name`` instruction (ENTRYPOINT, CMD), which must be in exec (JSON) form."""
    arguments = instruction(name)[-1]
    assert arguments.startswith("["), f"{name} {arguments}: exec form expected"
    return json.loads(arguments)


def manifests(path: Path) -> dict[str, dict[str, Any]]:
    """The objects of a YAML file, by kind."""
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text())}


def runtime_container() -> dict[str, Any]:
    return manifests(RUNTIME)["ServingRuntime"]["spec"]["containers"][0]


def deployment_container() -> dict[str, Any]:
    return manifests(KUBERNETES)["Deployment"]["spec"]["template"]["spec"]["containers"][0]


# Each recipe's container: (its `lifecycle serve` arguments, its container spec or None).
RECIPES = {
    "Dockerfile": lambda: (exec_form("CMD"), None),
    "ServingRuntime": lambda: (runtime_container()["args"], runtime_container()),
    "Deployment": lambda: (deployment_container()["args"], deployment_container()),
}
CONTAINERS = ["ServingRuntime", "Deployment"]


def parse(args: Sequence[str]) -> dict[str, Any]:
    """The options ``lifecycle serve args`` gets, parsed by the command itself."""
    command = typer.main.get_command(cli.build_app()).commands["serve"]
    with command.make_context("serve", list(args)) as context:
        return dict(context.params)


def value(args: Sequence[str], flag: str) -> str:
    """The value of ``--flag=value`` in ``args``; the recipes spell them so."""
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"{flag}=")]
    assert len(values) == 1, f"{flag}=... expected once in {args}"
    return values[0]


def replaced(args: Sequence[str], values: dict[str, str]) -> list[str]:
    """``args`` with the values of the flags in ``values`` replaced (each must be there)."""
    for flag in values:
        value(args, flag)
    return [
        f"{flag}={values[flag]}" if (flag := arg.split("=", 1)[0]) in values else arg
        for arg in args
    ]


def quantity(text: str) -> float:
    """A Kubernetes quantity: ``3Gi`` in bytes, ``500m`` or ``2`` in cores."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "m": 1e-3, "": 1}
    number, unit = re.fullmatch(r"([0-9.]+)(Ki|Mi|Gi|m|)", str(text)).groups()
    return float(number) * units[unit]


def container_port(container: dict[str, Any], port: str | int) -> int:
    """The number of a container's port, named or numbered, that it declares."""
    for declared in container["ports"]:
        if port in (declared["name"], declared["containerPort"]):
            return declared["containerPort"]
    raise AssertionError(f"port {port!r} is not one of the container's: {container['ports']}")


# -- the recipes, checked ---------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A base path holding version 1, a SavedModel; the model's answer to ``X``."""
    keras.utils.set_random_seed(7)
    features = keras.Input((3,), name="features")
    model = keras.Model(features, keras.layers.Dense(2)(features))
    base = tmp_path_factory.mktemp("mnt") / "models"
    model.export(base / "1", verbose=False)
    return base, np.asarray(model(X))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_flag_a_recipe_passes_is_accepted_and_passes_the_servers_checks(recipe, exported):
    args, _ = RECIPES[recipe]()
    # Bound to every interface, or nothing outside the container reaches it.
    assert value(args, "--host") == "0.0.0.0"
    given = parse(replaced(args, {"--model_base_path": str(exported[0])}))
    config = ServerConfig.from_flags(**server_flags(given))
    assert config.host == "0.0.0.0" and config.admin_api is False
    assert config.models[0].base_path == str(exported[0])


def test_a_flag_the_command_does_not_have_is_refused():
    with pytest.raises(Exception, match="No such option: --rest_port"):  # typer's own click
        parse(["--rest_port=8080"])
    with pytest.raises(ValueError, match="--rest_api_port must be a port number"):
        ServerConfig.from_flags(**server_flags(parse(["--rest_api_port=80800"])))


def test_the_image_runs_lifecycle_serve_as_a_non_root_user_on_the_ports_it_exposes():
    assert instruction("FROM") == ["python:3.11-slim"]
    assert exec_form("ENTRYPOINT") == ["lifecycle", "serve"]
    project = importlib.metadata.distribution("keras-lifecycle")
    scripts = project.entry_points.select(group="console_scripts")
    assert scripts["lifecycle"].value == "lifecycle.cli:main"
    (user,) = instruction("USER")
    assert user.isdigit() and int(user) != 0  # runAsNonRoot can check only a numeric user
    # What it installs: this tree, with extras the project has.
    (install,) = [run for run in instruction("RUN") if "pip install" in run]
    target = next(word for word in shlex.split(install) if word.startswith("."))
    extras = set(re.fullmatch(r"\.\[([a-z,]+)\]", target).group(1).split(","))
    assert {"cli", "serve"} <= extras <= set(project.metadata.get_all("Provides-Extra"))
    for copy in instruction("COPY"):
        *sources, _ = copy.split()
        assert all((ROOT / source).exists() for source in sources), copy
    args = exec_form("CMD")
    exposed = {int(port) for line in instruction("EXPOSE") for port in line.split()}
    assert exposed == {int(value(args, "--port")), int(value(args, "--rest_api_port"))}


@pytest.mark.parametrize("recipe", CONTAINERS)
def test_the_ports_and_probes_of_a_container_are_the_ports_its_arguments_open(recipe):
    args, container = RECIPES[recipe]()
    rest, grpc = int(value(args, "--rest_api_port")), int(value(args, "--port"))
    assert sorted(port["containerPort"] for port in container["ports"]) == sorted([rest, grpc])
    probes = {
        kind: container[kind]["httpGet"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert {kind: probe["path"] for kind, probe in probes.items()} == {
        "startupProbe": LIVE,
        "livenessProbe": LIVE,
        "readinessProbe": READY,
    }
    for probe in probes.values():
        assert container_port(container, probe["port"]) == rest
    # The startup probe covers the load: liveness does not restart a replica still loading.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


@pytest.mark.parametrize("recipe", CONTAINERS)
def test_a_containers_threads_and_memory_budget_fit_its_limits(recipe):
    args, container = RECIPES[recipe]()
    limits = container["resources"]["limits"]
    assert container["resources"]["requests"] == limits  # Guaranteed: evicted last
    for flag in ("--tensorflow_intra_op_parallelism", "--tensorflow_inter_op_parallelism"):
        assert 1 <= int(value(args, flag)) <= quantity(limits["cpu"]), flag
    # What else the process holds is measured by the test that runs the server.
    assert int(value(args, "--memory_budget")) < quantity(limits["memory"])


def test_the_kserve_runtime_serves_v2_from_kserves_model_directory():
    runtime = manifests(RUNTIME)["ServingRuntime"]
    spec, container = runtime["spec"], runtime_container()
    assert container["name"] == "kserve-container"  # the container KServe fills in
    args = container["args"]
    assert value(args, "--model_base_path") == "/mnt/models"
    assert value(args, "--model_name") == "{{.Name}}"
    assert "v2" in spec["protocolVersions"]
    assert ("grpc-v2" in spec["protocolVersions"]) == (int(value(args, "--port")) != 0)
    # KServe's Service sends port 80 to the first port: it must be the REST one.
    assert container["ports"][0]["containerPort"] == int(value(args, "--rest_api_port"))
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == int(
        value(args, "--rest_api_port")
    )
    service = manifests(INFERENCE_SERVICE)["InferenceService"]
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    assert model["protocolVersion"] in spec["protocolVersions"]


def test_the_kubernetes_service_reaches_the_deployments_pods_on_their_ports():
    objects = manifests(KUBERNETES)
    deployment, service = objects["Deployment"], objects["Service"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["replicas"] >= 2
    container = deployment_container()
    targets = {container_port(container, port["targetPort"]) for port in service["spec"]["ports"]}
    assert targets == {port["containerPort"] for port in container["ports"]}
    # Terminating: the preStop pause, then the drain, within the grace period.
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(value(container["args"], "--drain_seconds"))
    assert pause + drain < deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/models/risk")
    assert value(container["args"], "--model_base_path") == mount["mountPath"]


# -- the server, run with the KServe runtime's arguments ------------------------------------


@attrs.frozen
class Replica:
    """``lifecycle serve`` run with the runtime's arguments, as KServe runs it."""

    process: Served
    rest: int  # the ports in place of the runtime's
    grpc: int
    status_before_ready: int | None  # the readiness probe's answer right after the start
    expected: np.ndarray  # what the model answers X


@pytest.fixture(scope="module")
def replica(exported) -> Iterator[Replica]:
    base, expected = exported
    rest, grpc = free_port(), free_port()
    args = replaced(
        [arg.replace("{{.Name}}", NAME) for arg in runtime_container()["args"]],
        {
            "--host": "127.0.0.1",
            "--rest_api_port": str(rest),
            "--port": str(grpc),
            "--model_base_path": str(base),
        },
    )
    process = Served([*SERVE, *args])  # the image's ENTRYPOINT, installed here
    try:
        # Right after the start TensorFlow is still importing and the model not loaded.
        try:
            before = httpx.get(f"http://127.0.0.1:{rest}{READY}", timeout=5).status_code
        except httpx.ConnectError:
            before = None  # the port is not open yet
        assert process.poll() is None, process.output()

        def ready() -> bool:
            assert process.poll() is None, process.output()
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"http://127.0.0.1:{rest}{READY}", timeout=5).status_code == 200
            return False

        wait_until(ready, "lifecycle serve ready", timeout=120)
        yield Replica(process, rest, grpc, before, expected)
    finally:
        try:
            if process.poll() is None:
                stop(process)  # SIGTERM, as the kubelet sends it: drains, exits 0
        finally:
            if process.poll() is None:
                process.kill()
                process.output(timeout=30)


def test_the_probes_fail_while_the_model_loads_and_answer_200_once_it_is_ready(replica):
    # The kubelet counts 200-399 as success; a refused connection as failure.
    before = replica.status_before_ready
    assert before is None or not 200 <= before < 400, before
    base, container = f"http://127.0.0.1:{replica.rest}", runtime_container()
    # Each probe as the kubelet sends it: its path, on the port it names.
    answers = {
        kind: httpx.get(base + container[kind]["httpGet"]["path"], timeout=10)
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert {kind: (r.status_code, r.json()) for kind, r in answers.items()} == {
        "startupProbe": (200, {"live": True}),
        "livenessProbe": (200, {"live": True}),
        "readinessProbe": (200, {"ready": True}),
    }
    spec = manifests(RUNTIME)["ServingRuntime"]["spec"]
    metrics = httpx.get(base + spec["annotations"]["prometheus.kserve.io/path"], timeout=10)
    assert metrics.status_code == 200 and "# TYPE" in metrics.text


def test_a_v2_request_through_the_rest_port_is_answered_by_the_model(replica):
    body = {
        "inputs": [{"name": "features", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]
    }
    response = httpx.post(
        f"http://127.0.0.1:{replica.rest}/v2/models/{NAME}/infer", json=body, timeout=30
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["model_name"], answer["model_version"]) == (NAME, "1")
    (output,) = answer["outputs"]
    assert output["shape"] == [1, 2] and output["datatype"] == "FP32"
    np.testing.assert_allclose(output["data"], replica.expected.ravel(), rtol=1e-5)


def test_the_grpc_port_serves_kserves_v2_health(replica):
    tritonclient = pytest.importorskip("tritonclient.grpc")
    with tritonclient.InferenceServerClient(f"127.0.0.1:{replica.grpc}") as client:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(NAME)


def test_the_memory_budget_and_the_servers_own_memory_fit_the_limit(replica):
    status = Path(f"/proc/{replica.process.pid}/status").read_text()
    resident = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
    container = runtime_container()
    budget = int(value(container["args"], "--memory_budget"))
    limit = quantity(container["resources"]["limits"]["memory"])
    # Measured here: ~0.8 GiB resident with this model; the rest of the limit is for requests.
    assert budget + resident <= limit - 256 * 2**20, (budget, resident, limit)
