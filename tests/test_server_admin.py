"""The server's admin API, sticky keys from a header, and bearer tokens.

The real server on 127.0.0.1 and a free port: the admin API and TensorFlow
Serving's REST API over plain HTTP, KServe's v2 protocol with tritonclient.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import keras
import numpy as np
import pytest
import tensorflow as tf
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from google.protobuf import text_format
from support.models import constant_model, save
from support.servers import free_port, grpc_running, running
from support.waits import wait_for_scans, wait_until
from tensorflow_serving.apis import (
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tritonclient.utils import InferenceServerException

import lifecycle as lc
from lifecycle.server import ServerConfig

TOKEN = "s3cret-token-of-the-admin"  # 16 characters or more: the server's minimum
ROW = {"instances": [[0.0, 0.0, 0.0]]}


@contextlib.contextmanager
def client_of(name: str, config: ServerConfig) -> Iterator[httpx.Client]:
    """A server over a registry of its own, and a client without a token."""
    with (
        lc.ModelRegistry(name=name) as registry,
        running(registry, config) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def labelled_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Model ``m``: versions 1 (label ``stable``) and 2, every version served."""
    root = tmp_path_factory.mktemp("models")
    save(constant_model(1.0), root / "m", 1)
    save(constant_model(2.0), root / "m", 2)
    (root / "models.config").write_text(
        'model_config_list { config { name: "m" base_path: "%s" '
        "model_version_policy { all {} } "
        'version_labels { key: "stable" value: 1 } } }' % (root / "m")
    )
    return root


@pytest.fixture(scope="module")
def served(labelled_root: Path) -> Iterator[tuple[str, lc.ModelRegistry]]:
    """A server with a token: versions 1 (label ``stable``) and 2, the default."""
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_config_file=str(labelled_root / "models.config"),
        admin_token=TOKEN,
    )
    with lc.ModelRegistry(name="admin") as registry, running(registry, config) as url:
        yield url, registry


@pytest.fixture
def admin(served: tuple[str, lc.ModelRegistry]) -> Iterator[httpx.Client]:
    """An authorised admin client, over a server reset to its start-up state."""
    url, registry = served
    registry.route("m", None)
    for status in registry.status("m"):
        for label in status.labels:
            if label != "stable":
                registry.remove_label("m", label)
    registry.set_label("m", "stable", 1)
    registry.promote("m", 2)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
        yield client


def served_by(client: httpx.Client, path: str = "/v1/models/m", **headers: str) -> int:
    """The version that answered a predict request (version n answers n)."""
    response = client.post(f"{path}:predict", json=ROW, headers=headers)
    assert response.status_code == 200, response.text
    return int(response.json()["predictions"][0][0])


def versions(body: dict) -> dict[int, tuple[bool, list[str], float | None]]:
    return {v["version"]: (v["default"], v["labels"], v["weight"]) for v in body["versions"]}


# -- the admin API -------------------------------------------------------------------


def test_status_shows_versions_default_labels_and_weights(admin):
    body = admin.get("/v1/admin/models/m").json()
    assert body["name"] == "m"
    assert versions(body) == {1: (False, ["stable"], None), 2: (True, [], None)}
    assert {v["state"] for v in body["versions"]} == {"READY"}
    assert all(v["bytes"] > 0 for v in body["versions"])


def test_promote_swaps_the_default(admin):
    assert served_by(admin) == 2
    body = admin.post("/v1/admin/models/m/promote", json={"version": 1}).json()
    assert versions(body)[1][0] is True
    assert served_by(admin) == 1
    admin.post("/v1/admin/models/m/promote", json={"version": "2"})  # TF Serving's string form
    assert served_by(admin) == 2


def test_set_move_and_remove_a_label(admin):
    body = admin.put("/v1/admin/models/m/labels/canary", json={"version": 2}).json()
    assert versions(body)[2] == (True, ["canary"], None)
    assert served_by(admin, "/v1/models/m/labels/canary") == 2
    admin.put("/v1/admin/models/m/labels/canary", json={"version": 1})
    assert served_by(admin, "/v1/models/m/labels/canary") == 1
    body = admin.delete("/v1/admin/models/m/labels/canary").json()
    assert versions(body)[1] == (False, ["stable"], None)
    gone = admin.post("/v1/models/m/labels/canary:predict", json=ROW)
    assert gone.status_code == 404
    assert "no label 'canary'" in gone.json()["error"]


def test_a_route_splits_by_weight_and_a_sticky_key_keeps_its_version(admin):
    admin.put("/v1/admin/models/m/labels/canary", json={"version": 2})
    body = admin.put("/v1/admin/models/m/route", json={"labels": {"stable": 1, "canary": 1}}).json()
    assert versions(body) == {1: (False, ["stable"], 0.5), 2: (True, ["canary"], 0.5)}
    v2 = triton.InferenceServerClient(admin.base_url.netloc.decode(), network_timeout=30)
    x = triton.InferInput("features", [1, 3], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3), "float32"), binary_data=False)
    try:
        chosen = {}
        for i in range(40):
            key = f"user-{i}"
            answers = {served_by(admin, **{"X-Lifecycle-Key": key}) for _ in range(3)}
            answers.add(
                int(v2.infer("m", [x], headers={"X-Lifecycle-Key": key}).as_numpy("output_0")[0, 0])
            )
            assert len(answers) == 1, f"key {key!r} was answered by versions {answers}"
            chosen[key] = answers.pop()
    finally:
        v2.close()
    assert 8 <= list(chosen.values()).count(1) <= 32  # both versions get keys
    # A route through the label follows it when it moves.
    admin.put("/v1/admin/models/m/labels/canary", json={"version": 1})
    assert {served_by(admin, **{"X-Lifecycle-Key": k}) for k in chosen} == {1}
    body = admin.delete("/v1/admin/models/m/route").json()
    assert {v[2] for v in versions(body).values()} == {None}
    assert served_by(admin, **{"X-Lifecycle-Key": "user-0"}) == 2  # the default again


def test_a_route_by_versions(admin):
    admin.put("/v1/admin/models/m/route", json={"versions": {"1": 3, "2": 1}})
    weights = {v: w for v, (_, _, w) in versions(admin.get("/v1/admin/models/m").json()).items()}
    assert weights == {1: 0.75, 2: 0.25}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "fragment"),
    [
        ("GET", "/v1/admin/models/nope", None, 404, "No model named 'nope'"),
        ("POST", "/v1/admin/models/m/promote", {"version": 9}, 404, "no ready version 9"),
        ("POST", "/v1/admin/models/m/promote", {"v": 1}, 400, '{"version": <int >= 0>}'),
        ("POST", "/v1/admin/models/m/promote", {"version": True}, 400, "<int >= 0>"),
        ("PUT", "/v1/admin/models/m/labels/bad-label", {"version": 1}, 400, "[a-zA-Z0-9_]+"),
        ("DELETE", "/v1/admin/models/m/labels/gold", None, 404, "no label 'gold'"),
        ("PUT", "/v1/admin/models/m/route", {"weights": {}}, 400, '{"labels": {label: weight}'),
        ("PUT", "/v1/admin/models/m/route", {"versions": {"x": 1}}, 400, "version numbers"),
        ("PUT", "/v1/admin/models/m/route", {"labels": {"gold": 1}}, 404, "no label 'gold'"),
        ("PUT", "/v1/admin/models/m/route", {"versions": {"1": -1}}, 400, "finite and >= 0"),
        ("PUT", "/v1/admin/models/m/route", {"labels": {"stable": "a"}}, 400, "be numbers"),
    ],
)
def test_bad_admin_calls_are_refused_with_a_message_and_change_nothing(
    admin, method, path, body, status, fragment
):
    before = admin.get("/v1/admin/models/m").json()
    response = admin.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]
    assert versions(admin.get("/v1/admin/models/m").json()) == versions(before)


def test_a_label_in_the_route_is_not_removed(admin):
    admin.put("/v1/admin/models/m/route", json={"labels": {"stable": 1}})
    response = admin.delete("/v1/admin/models/m/labels/stable")
    assert response.status_code == 400
    assert "change or remove the route first" in response.json()["error"]


def model_with_input(name: str, value: float) -> keras.Model:
    """``constant_model`` with its one input named ``name``."""
    x = keras.Input((3,), name=name)
    dense = keras.layers.Dense(
        2, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(value)
    )
    return keras.Model(x, dense(x))


def test_a_split_between_versions_whose_inputs_differ_decodes_each_request_for_its_version():
    """Every request is read by the input names of the version that runs it (one lease)."""
    config = ServerConfig.from_flags(rest_api_port=free_port())
    with lc.ModelRegistry(name="split") as registry:
        registry.load("m", 1, lambda: model_with_input("features", 1.0))
        registry.load("m", 2, lambda: model_with_input("x", 2.0))
        registry.route("m", {1: 1.0, 2: 1.0})
        with running(registry, config) as url, httpx.Client(base_url=url, timeout=30) as client:
            answered = []
            for i in range(40):
                for body in ({"instances": [[0.0, 0.0, 0.0]]}, {"inputs": [[0.0, 0.0, 0.0]]}):
                    sticky = {"X-Lifecycle-Key": f"user-{i}"}
                    for headers in ({}, sticky):
                        response = client.post("/v1/models/m:predict", json=body, headers=headers)
                        assert response.status_code == 200, response.text
                        answered.append(int(np.ravel(next(iter(response.json().values())))[0]))
    assert set(answered) == {1, 2}


# -- bearer tokens ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ({}, "is an admin call: it needs 'Authorization: Bearer <token>'"),
        ({"Authorization": "Basic czNjcmV0"}, "it needs 'Authorization: Bearer <token>'"),
        ({"Authorization": "Bearer wrong"}, "not the server's --admin_token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "not the server's --admin_token"),
    ],
)
def test_admin_calls_without_the_token_are_401(admin, headers, fragment):
    url = str(admin.base_url)
    for method, path in [
        ("GET", "/v1/admin/models/m"),
        ("POST", "/v1/admin/models/m/promote"),
        ("POST", "/v2/repository/models/m/unload"),
        ("POST", "/v2/repository/models/m/load"),
    ]:
        response = httpx.request(method, url + path, json={"version": 1}, headers=headers)
        assert response.status_code == 401, (path, response.text)
        assert fragment in response.json()["error"]
        assert response.headers["www-authenticate"] == "Bearer"
    assert served_by(admin) == 2  # nothing changed; requests need no token


def test_repository_load_and_unload_take_the_token(admin):
    v2 = triton.InferenceServerClient(admin.base_url.netloc.decode(), network_timeout=30)
    try:
        with pytest.raises(InferenceServerException, match="Authorization: Bearer"):
            v2.unload_model("m")
        admin.delete("/v1/admin/models/m/labels/stable")
        v2.unload_model("m", headers={"Authorization": f"Bearer {TOKEN}"})
        wait_until(lambda: not v2.is_model_ready("m"), "m unloaded")
        v2.load_model("m", headers={"Authorization": f"Bearer {TOKEN}"})
        assert v2.is_model_ready("m")
        assert served_by(admin) == 2
    finally:
        v2.close()


# -- without a token: programs on this machine, never a web page --------------------------

EVIL = "http://evil.example"
# Requests a web page can make a browser send to a loopback server, without asking it
# first (no preflight): (method, path, headers, body, what the refusal says). "{port}"
# is the server's port.
BROWSER_REQUESTS = [
    pytest.param(
        "POST",
        "/v2/repository/models/m/unload",
        {"Origin": EVIL, "Host": "evil.example", "Content-Type": "text/plain"},
        b"{}",
        "carries an Origin ('http://evil.example'), which browsers send",
        id="unload-from-a-page",
    ),
    pytest.param(
        "POST",
        "/v1/admin/models/m/promote",
        {"Origin": EVIL, "Host": "evil.example", "Content-Type": "text/plain"},
        b'{"version": 1}',
        "carries an Origin ('http://evil.example')",
        id="promote-from-a-page",
    ),
    pytest.param(
        "POST",
        "/v1/admin/models/m/promote",
        {"Origin": "http://127.0.0.1:{port}", "Content-Type": "application/json"},
        b'{"version": 1}',
        "carries an Origin ('http://127.0.0.1:{port}')",
        id="any-origin",
    ),
    pytest.param(
        "DELETE",
        "/v1/admin/models/m/labels/stable",
        {"Origin": "null"},
        b"",
        "carries an Origin ('null')",
        id="sandboxed-page",
    ),
    pytest.param(
        "POST",
        "/v2/repository/models/m/unload",
        {"Host": "evil.example", "Content-Type": "application/json"},
        b"{}",
        "'Host: evil.example', which is not this server's address",
        id="foreign-host",
    ),
    pytest.param(
        "POST",
        "/v2/repository/models/m/unload",
        {"Host": "evil.example:{port}"},
        b"",
        "'Host: evil.example:{port}', which is not this server's address",
        id="dns-rebinding",
    ),
    pytest.param(
        "GET",
        "/v1/admin/models/m",
        {"Host": "evil.example:{port}"},
        b"",
        "Call http://127.0.0.1:{port}/... instead",
        id="dns-rebinding-read",
    ),
    pytest.param(
        "POST",
        "/v2/repository/models/m/load",
        {"Host": "127.0.0.1:1"},
        b"",
        "with or without the port {port}",
        id="another-port",
    ),
    pytest.param(
        "POST",
        "/v1/admin/models/m/promote",
        {"Content-Type": "text/plain"},
        b'{"version": 1}',
        "a body of Content-Type 'text/plain', as a web page's form or fetch() sends",
        id="text-plain",
    ),
    pytest.param(
        "PUT",
        "/v1/admin/models/m/route",
        {"Content-Type": "application/x-www-form-urlencoded"},
        b'{"labels": {"stable": 1}}',
        "Admin bodies are JSON: send 'Content-Type: application/json' (curl --json",
        id="form",
    ),
]


@pytest.fixture(scope="module")
def open_served(labelled_root: Path) -> Iterator[tuple[str, int, lc.ModelRegistry]]:
    """A server on loopback without a token: model ``m``, versions 1 (``stable``) and 2."""
    port = free_port()
    config = ServerConfig.from_flags(
        rest_api_port=port, model_config_file=str(labelled_root / "models.config")
    )
    assert config.admin_token is None
    with lc.ModelRegistry(name="open-admin") as registry, running(registry, config) as url:
        yield url, port, registry


@pytest.fixture
def open_admin(open_served: tuple[str, int, lc.ModelRegistry]) -> Iterator[tuple[str, int]]:
    """The tokenless server's URL and port, its model reset to version 2 as the default."""
    url, port, registry = open_served
    wait_until(lambda: {s.version for s in registry.status("m")} == {1, 2}, "m loaded")
    registry.route("m", None)
    registry.set_label("m", "stable", 1)
    registry.promote("m", 2)
    yield url, port


def raw_request(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as it is on a new connection: the answer's status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536) or b"\r\n\r\n"
        head, _, body = answer.partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length: *(\d+)", head)
        while length and len(body) < int(length.group(1)):
            body += sock.recv(65536)
    return int(head.split()[1]), body


def curl_request(method: str, path: str, host: str, body: bytes = b"") -> bytes:
    """A request as ``curl -X METHOD http://HOST/PATH --json BODY`` writes it (curl 7.88)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "User-Agent: curl/7.88.1"]
    if body:
        lines += ["Content-Type: application/json", "Accept: application/json"]
        lines.append(f"Content-Length: {len(body)}")
    else:
        lines.append("Accept: */*")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.mark.parametrize(("method", "path", "headers", "body", "fragment"), BROWSER_REQUESTS)
def test_without_a_token_an_admin_call_a_web_page_can_send_is_refused_and_changes_nothing(
    open_admin, method, path, headers, body, fragment
):
    url, port = open_admin
    before = httpx.get(f"{url}/v1/admin/models/m", timeout=30).json()
    headers = {name: value.format(port=port) for name, value in headers.items()}
    response = httpx.request(method, url + path, headers=headers, content=body, timeout=30)
    assert response.status_code == 403, response.text
    message = response.json()["error"]
    assert fragment.format(port=port) in message
    assert "never from a web page: call it from the command line" in message
    assert "set --admin_token (or the LIFECYCLE_ADMIN_TOKEN environment variable)" in message
    after = httpx.get(f"{url}/v1/admin/models/m", timeout=30).json()
    assert (
        versions(after)
        == versions(before)
        == {
            1: (False, ["stable"], None),
            2: (True, [], None),
        }
    )
    assert {v["state"] for v in after["versions"]} == {"READY"}
    with httpx.Client(base_url=url, timeout=30) as client:
        assert served_by(client) == 2  # still served
        assert served_by(client, "/v1/models/m/labels/stable") == 1


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "127.0.0.1", "LOCALHOST"]
)
def test_without_a_token_curl_style_admin_calls_from_loopback_work(open_admin, host):
    url, port = open_admin
    host = host.format(port=port)
    status, body = raw_request(port, curl_request("GET", "/v1/admin/models/m", host))
    assert status == 200, body
    promote = b'{"version": 1}'
    status, body = raw_request(
        port, curl_request("POST", "/v1/admin/models/m/promote", host, promote)
    )
    assert status == 200, body
    with httpx.Client(base_url=url, timeout=30) as client:
        assert served_by(client) == 1
    status, body = raw_request(port, curl_request("DELETE", "/v1/admin/models/m/route", host))
    assert status == 200, body


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_without_a_token_curl_itself_calls_the_admin_api_and_hears_why_a_form_is_refused(
    open_admin,
):
    url, port = open_admin

    def curl(*args: str) -> str:
        done = subprocess.run(
            ["curl", "-s", "-w", " %{http_code}", *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    json_body = ["-H", "Content-Type: application/json", "-d", '{"version": 1}']
    answer = curl("-X", "POST", f"{url}/v1/admin/models/m/promote", *json_body)
    assert answer.endswith(" 200"), answer
    assert versions(httpx.get(f"{url}/v1/admin/models/m", timeout=30).json())[1][0] is True
    # Without a Content-Type curl -d sends a form, as a web page's <form> does.
    answer = curl(
        "-X", "POST", f"localhost:{port}/v1/admin/models/m/promote", "-d", '{"version": 2}'
    )
    assert answer.endswith(" 403"), answer
    assert "'application/x-www-form-urlencoded'" in answer and "curl --json" in answer
    # A call without a body needs no Content-Type.
    assert curl("-X", "POST", f"localhost:{port}/v2/repository/models/m/load").endswith(" 200")


def test_without_a_token_tritonclient_loads_and_unloads_over_http(open_admin):
    url, port = open_admin
    with triton.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30) as client:
        assert {m["name"] for m in client.get_model_repository_index()} == {"m"}
        client.unload_model("m")  # a JSON body without a Content-Type
        wait_until(lambda: not client.is_model_ready("m"), "m unloaded")
        client.load_model("m")
        assert client.is_model_ready("m")
    with httpx.Client(base_url=url, timeout=30) as client:
        assert served_by(client) == 2


def test_with_a_token_the_token_is_the_authority_whatever_the_origin(admin):
    """Behind a proxy a dashboard may call with its own Origin and Host: the token decides."""
    from_a_page = {"Origin": EVIL, "Host": "proxy.example", "Content-Type": "text/plain"}
    body = b'{"version": 1}'
    refused = admin.post(
        "/v1/admin/models/m/promote",
        content=body,
        headers={**from_a_page, "Authorization": "Bearer not-the-token-at-all"},
    )
    assert refused.status_code == 401, refused.text
    response = admin.post("/v1/admin/models/m/promote", content=body, headers=from_a_page)
    assert response.status_code == 200, response.text
    assert served_by(admin) == 1


@pytest.fixture
def open_grpc(labelled_root: Path) -> Iterator[tuple[int, lc.ModelRegistry]]:
    """A gRPC server on loopback without a token, serving ``m``."""
    config = ServerConfig.from_flags(
        port=free_port(), model_config_file=str(labelled_root / "models.config")
    )
    with lc.ModelRegistry(name="open-grpc") as registry, grpc_running(registry, config):
        yield config.grpc_port, registry


def test_without_a_token_grpc_admin_calls_with_an_origin_are_refused(open_grpc, labelled_root):
    port, registry = open_grpc
    from_a_page = {"origin": EVIL}  # what a gRPC-web client in a browser sends
    with triton_grpc.InferenceServerClient(f"127.0.0.1:{port}") as client:
        for call in (client.unload_model, client.load_model):
            with pytest.raises(InferenceServerException) as caught:
                call("m", headers=from_a_page, client_timeout=30)
            assert caught.value.status() == str(grpc.StatusCode.PERMISSION_DENIED)
            assert "carries an Origin ('http://evil.example')" in caught.value.message()
        assert client.is_model_ready("m", client_timeout=30)
        assert {s.version for s in registry.status("m")} == {1, 2}  # untouched
        # Without an origin, as tritonclient sends it: admitted.
        client.unload_model("m", client_timeout=30)
        wait_until(lambda: not client.is_model_ready("m", client_timeout=30), "m unloaded")
        client.load_model("m", client_timeout=30)
        assert client.is_model_ready("m", client_timeout=30)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        nothing = model_management_pb2.ReloadConfigRequest()
        text_format.Parse("model_config_list { }", nothing.config)
        with pytest.raises(grpc.RpcError) as caught:
            models.HandleReloadConfigRequest(nothing, metadata=(("origin", EVIL),), timeout=30)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "gRPC /tensorflow.serving.ModelService/HandleReloadConfigRequest" in (
            caught.value.details()
        )
        assert {s.name for s in registry.status()} == {"m"}  # nothing unloaded


# -- the admin token ----------------------------------------------------------------------


@pytest.mark.parametrize("short", ["x" * 15, "s3cret-token"])
def test_a_short_admin_token_is_refused_saying_how_to_make_one(monkeypatch, short):
    monkeypatch.delenv("LIFECYCLE_ADMIN_TOKEN", raising=False)
    with pytest.raises(ValueError) as caught:
        ServerConfig.from_flags(admin_token=short)
    message = str(caught.value)
    assert (
        "--admin_token (or LIFECYCLE_ADMIN_TOKEN) must be at least 16 characters long; "
        f"this one has {len(short)}." in message
    )
    assert 'python -c "import secrets; print(secrets.token_urlsafe(32))"' in message
    assert short not in message  # never shown: messages are printed and logged
    monkeypatch.setenv("LIFECYCLE_ADMIN_TOKEN", short)
    with pytest.raises(ValueError, match="must be at least 16 characters long"):
        ServerConfig.from_flags(host="0.0.0.0")
    assert ServerConfig.from_flags(admin_token="x" * 16).admin_token == "x" * 16


# -- polling and the admin API -----------------------------------------------------------


def test_polling_keeps_a_promoted_default_until_a_new_version_arrives(tmp_path):
    save(constant_model(1.0), tmp_path / "m", 1)
    save(constant_model(2.0), tmp_path / "m", 2)
    config_file = tmp_path / "models.config"
    config_file.write_text(
        'model_config_list { config { name: "m" base_path: "%s" '
        "model_version_policy { all {} } } }" % (tmp_path / "m")
    )
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_config_file=str(config_file),
        file_system_poll_wait_seconds=0.1,
    )
    with (
        lc.ModelRegistry(name="admin-polling") as registry,
        running(registry, config) as url,
        httpx.Client(base_url=url, timeout=30) as client,  # loopback: no token needed
    ):
        assert served_by(client) == 2
        assert client.post("/v1/admin/models/m/promote", json={"version": 1}).is_success
        wait_for_scans(registry, "m")  # polls ran: the promoted default stays
        assert served_by(client) == 1
        save(constant_model(3.0), tmp_path / "m", 3)
        wait_until(lambda: served_by(client) == 3, "the new version 3 promoted")


# -- configuration ---------------------------------------------------------------------


def test_beyond_loopback_the_admin_api_needs_a_token_or_is_turned_off(monkeypatch):
    monkeypatch.delenv("LIFECYCLE_ADMIN_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"--host '0\.0\.0\.0' accepts other hosts") as caught:
        ServerConfig.from_flags(host="0.0.0.0")
    assert "set --admin_token (or the LIFECYCLE_ADMIN_TOKEN" in str(caught.value)
    assert "--no_admin_api" in str(caught.value)
    with pytest.raises(ValueError, match="needs a token"):
        ServerConfig.from_flags(host="server.example")
    assert not ServerConfig.from_flags(host="0.0.0.0", admin_api=False).admin_api
    assert ServerConfig.from_flags(host="0.0.0.0", admin_token=TOKEN).admin_token == TOKEN
    for loopback in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert ServerConfig.from_flags(host=loopback).admin_token is None


def test_the_token_comes_from_the_environment_and_stays_out_of_repr(monkeypatch):
    monkeypatch.setenv("LIFECYCLE_ADMIN_TOKEN", TOKEN)
    config = ServerConfig.from_flags(host="0.0.0.0")
    assert config.admin_token == TOKEN
    assert TOKEN not in repr(config)
    flag = "the-flag-s-own-token"
    assert ServerConfig.from_flags(admin_token=flag).admin_token == flag  # the flag wins


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        ({"admin_token": ""}, "--admin_token (or LIFECYCLE_ADMIN_TOKEN) must be a non-empty"),
        ({"admin_token": "two words"}, "without spaces"),
        ({"sticky_key_header": "X Key"}, "--sticky_key_header must be an HTTP header name"),
        ({"sticky_key_header": ""}, "--sticky_key_header"),
    ],
)
def test_bad_admin_flags_are_refused_naming_the_flag(monkeypatch, flags, fragment):
    monkeypatch.delenv("LIFECYCLE_ADMIN_TOKEN", raising=False)
    with pytest.raises(ValueError, match="--") as caught:
        ServerConfig.from_flags(**flags)
    assert fragment in str(caught.value)


def test_with_the_admin_api_turned_off_admin_calls_are_403_and_requests_served(tmp_path):
    save(constant_model(1.0), tmp_path / "m", 1)
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_name="m",
        model_base_path=str(tmp_path / "m"),
        admin_api=False,
    )
    with client_of("no-admin", config) as client:
        for method, path in [
            ("GET", "/v1/admin/models/m"),
            ("POST", "/v2/repository/models/m/unload"),
        ]:
            response = client.request(method, path, json={})
            assert response.status_code == 403
            assert "turned off on this server (--no_admin_api)" in response.json()["error"]
        assert served_by(client) == 1


def test_lifecycle_serve_beyond_loopback_without_a_token_exits_2_naming_the_flag(monkeypatch):
    from typer.testing import CliRunner

    from lifecycle import cli

    monkeypatch.delenv("LIFECYCLE_ADMIN_TOKEN", raising=False)
    result = CliRunner().invoke(cli.build_app(), ["serve", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert "the admin API needs a token: set --admin_token (or the LIFECYCLE_ADMIN_TOKEN" in output
    assert "--no_admin_api" in output
    turned_off = ["serve", "--host", "0.0.0.0", "--no_admin_api", "--model_base_path", "/no/such"]
    result = CliRunner().invoke(cli.build_app(), turned_off)
    assert result.exit_code == 2
    assert "'/no/such' is not a directory" in result.output  # the next check, not the token


def test_routes_and_swap_policy_from_flags(tmp_path):
    save(constant_model(1.0), tmp_path / "m", 1)
    save(constant_model(2.0), tmp_path / "m", 2)
    config_file = tmp_path / "models.config"
    config_file.write_text(
        'model_config_list { config { name: "m" base_path: "%s" '
        "model_version_policy { all {} } "
        'version_labels { key: "stable" value: 1 } } }' % (tmp_path / "m")
    )
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_config_file=str(config_file),
        route=["m=stable:3,2:1"],
        swap_policy="RESOURCE_PRESERVING",
    )
    assert config.routes == {"m": {"stable": 3.0, 2: 1.0}}
    assert config.swap_policy is lc.SwapPolicy.RESOURCE_PRESERVING
    with client_of("routes", config) as client:  # the route is set once the models load
        weights = {
            row["version"]: row["weight"]
            for row in client.get("/v1/admin/models/m").json()["versions"]
        }
        assert weights == {1: 0.75, 2: 0.25}
        served = {
            key: client.post(
                "/v1/models/m:predict", json=ROW, headers={"X-Lifecycle-Key": key}
            ).json()["predictions"][0][0]
            for key in map(str, range(40))
        }
        assert set(served.values()) == {1.0, 2.0}

    for bad, fragment in [
        ({"route": ["m"]}, "--route takes name=target:weight"),
        ({"route": ["m=stable:lots"]}, "'lots' is not a number"),
        ({"route": ["other=1:1"]}, "--route names models that are not served: ['other']"),
        ({"swap_policy": "fastest"}, "--swap_policy must be one of"),
    ]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            ServerConfig.from_flags(model_config_file=str(config_file), **bad)


FACTORY_MODULE = """
import keras


def build():
    x = keras.Input((3,), name="features")
    return keras.Model(x, keras.layers.Dense(2)(x))
"""


def test_versions_of_checkpoints_are_served_with_a_model_factory(tmp_path, monkeypatch):
    (tmp_path / "served_architecture.py").write_text(FACTORY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from served_architecture import build

    with lc.LifecycleSession(name="publish"):
        model = lc.manage(build())
        model.layers[-1].bias.assign([7.0, 7.0])
        model.checkpoints(tmp_path / "m" / "1").save()
        model.dispose()
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_name="m",
        model_base_path=str(tmp_path / "m"),
        model_factory=["served_architecture:build"],
    )
    assert config.models[0].factory is build
    with client_of("factory", config) as client:
        assert client.post("/v1/models/m:predict", json=ROW).json() == {"predictions": [[7.0, 7.0]]}

    for spec, fragment in [
        ("served_architecture", "--model_factory takes module:function"),
        ("no_such_module:build", "cannot import 'no_such_module'"),
        ("served_architecture:nothing", "has no function 'nothing'"),
        ("other=served_architecture:build", "no served model is named 'other'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            ServerConfig.from_flags(model_base_path=str(tmp_path / "m"), model_factory=[spec])


def predicted(channel: grpc.Channel, name: str) -> float:
    """What ``name`` answers to a row of zeros over TensorFlow Serving's gRPC ``Predict``."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(np.zeros((1, 3), "float32")))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    (output,) = stub.Predict(request, timeout=30).outputs.values()
    return float(tf.make_ndarray(output)[0, 0])


def test_a_tensorflow_serving_reload_keeps_the_model_factories_of_start_up(tmp_path, monkeypatch):
    """A ModelServerConfig cannot name code: reloaded models keep --model_factory's by name."""
    (tmp_path / "reloaded_architecture.py").write_text(FACTORY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from reloaded_architecture import build

    for base, version, bias in [("m", 1, 7.0), ("moved", 2, 8.0)]:
        with lc.LifecycleSession(name="publish-for-reload"):
            model = lc.manage(build())
            model.layers[-1].bias.assign([bias, bias])
            model.checkpoints(tmp_path / base / str(version)).save()
            model.dispose()
    config = ServerConfig.from_flags(
        port=free_port(),
        model_name="m",
        model_base_path=str(tmp_path / "m"),
        model_factory=["reloaded_architecture:build"],
    )

    def reload(text: str) -> None:
        request = model_management_pb2.ReloadConfigRequest()
        text_format.Parse(text, request.config)
        models.HandleReloadConfigRequest(request, timeout=60)

    entry = 'model_config_list { config { name: "m" base_path: "%s" } }'
    with (
        lc.ModelRegistry(name="reload-factory") as registry,
        grpc_running(registry, config) as channel,
    ):
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        assert predicted(channel, "m") == 7.0
        reload(entry % (tmp_path / "moved"))  # versions of checkpoints elsewhere
        assert [s.version for s in registry.status("m")] == [2]
        assert predicted(channel, "m") == 8.0
        reload("model_config_list { }")  # dropped, then back: the start-up factory still
        assert "m" not in {s.name for s in registry.status()}
        reload(entry % (tmp_path / "m"))
        assert predicted(channel, "m") == 7.0


def test_batching_merges_concurrent_requests_and_reports_it(tmp_path):
    save(constant_model(4.0), tmp_path / "m", 1)
    config = ServerConfig.from_flags(
        rest_api_port=free_port(),
        model_name="m",
        model_base_path=str(tmp_path / "m"),
        enable_batching=True,
        max_batch_size=8,
        allowed_batch_sizes="2,4,8",
    )
    assert config.batching == lc.BatchingPolicy(8, 0, (2, 4, 8))
    with client_of("batching", config) as client:
        url = str(client.base_url)
        answers: list[object] = []

        def calls() -> None:
            with httpx.Client(base_url=url, timeout=30) as own:
                for _ in range(20):
                    answers.append(own.post("/v1/models/m:predict", json=ROW).json())

        threads = [threading.Thread(target=calls) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert answers == [{"predictions": [[4.0, 4.0]]}] * 120
        batching = client.get("/v1/admin/models/m").json()["versions"][0]["batching"]
        assert batching["requests"] == 120  # every request went through the batcher
        assert sum(int(size) * n for size, n in batching["sizes"].items()) == 120
        assert (batching["retried"], batching["rejected"]) == (0, 0)  # no limit, no bad input
        metrics = client.get("/monitoring/prometheus/metrics").text
        assert 'lifecycle_version_batch_requests_bucket{le="+Inf"' in metrics
        assert re.search(r"^lifecycle_version_batch_rejected_total\{.*\} 0\.0$", metrics, re.M)

    for flags, fragment in [
        ({"max_batch_size": 0}, "--max_batch_size must be an integer >= 1"),
        ({"allowed_batch_sizes": "2,x"}, "--allowed_batch_sizes takes comma-separated"),
        ({"allowed_batch_sizes": "2,4"}, "must be --max_batch_size (32)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            ServerConfig.from_flags(enable_batching=True, **flags)
    assert ServerConfig.from_flags(max_batch_size=0).batching is None  # batching off
    config = ServerConfig.from_flags(
        enable_batching=True, num_batch_threads=1, max_enqueued_batches=4, max_batch_size=8
    )
    assert config.batching == lc.BatchingPolicy(8, num_batch_threads=1, max_enqueued_batches=4)
    assert config.batching.return_wait == 1.0  # the adaptive wait by default
    config = ServerConfig.from_flags(enable_batching=True, batch_return_wait=0)
    assert config.batching == lc.BatchingPolicy(return_wait=0.0)
    with pytest.raises(ValueError, match="--batch_return_wait must be a finite number >= 0"):
        ServerConfig.from_flags(enable_batching=True, batch_return_wait=-1.0)


BATCHING_FILE = """
# As written for TensorFlow Serving's --batching_parameters_file.
max_batch_size { value: 16 }
batch_timeout_micros { value: 500 }
max_enqueued_batches { value: 100 }
num_batch_threads { value: 3 }
thread_pool_name { value: "model_server_batch_threads" }
allowed_batch_sizes: [4, 8, 16]
pad_variable_length_inputs: false
"""


def test_a_tensorflow_serving_batching_parameters_file_is_read_as_is(tmp_path):
    path = tmp_path / "batching.config"
    path.write_text(BATCHING_FILE)
    config = ServerConfig.from_flags(enable_batching=True, batching_parameters_file=str(path))
    assert config.batching == lc.BatchingPolicy(
        max_batch_size=16,
        batch_timeout_micros=500,
        allowed_batch_sizes=(4, 8, 16),
        num_batch_threads=3,
        max_enqueued_batches=100,
    )
    # Left out: TensorFlow Serving's defaults; without --enable_batching: not used.
    path.write_text("allowed_batch_sizes: 1000\n")
    config = ServerConfig.from_flags(enable_batching=True, batching_parameters_file=str(path))
    assert config.batching == lc.BatchingPolicy(1000, 0, (1000,), max_enqueued_batches=10)
    assert ServerConfig.from_flags(batching_parameters_file=str(path)).batching is None
    # Not a TensorFlow Serving parameter: --batch_return_wait goes with the file.
    config = ServerConfig.from_flags(
        enable_batching=True, batching_parameters_file=str(path), batch_return_wait=0.5
    )
    assert config.batching == lc.BatchingPolicy(
        1000, 0, (1000,), max_enqueued_batches=10, return_wait=0.5
    )

    for text, fragment in [
        ("max_batch_size: 16", "does not parse"),
        ("enable_large_batch_splitting: true", 'no field named "enable_large_batch_splitting"'),
        ("pad_variable_length_inputs: true", "asks for pad_variable_length_inputs"),
        ("max_batch_size { value: 8 } allowed_batch_sizes: [4]", "must be max_batch_size (8)"),
        ("num_batch_threads { value: 0 }", "num_batch_threads must be an integer >= 1"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match="--batching_parameters_file") as caught:
            ServerConfig.from_flags(enable_batching=True, batching_parameters_file=str(path))
        assert fragment in str(caught.value)
    with pytest.raises(ValueError, match="cannot be combined with --max_batch_size"):
        ServerConfig.from_flags(
            enable_batching=True, batching_parameters_file=str(path), max_batch_size=8
        )
    with pytest.raises(FileNotFoundError, match="--batching_parameters_file"):
        ServerConfig.from_flags(
            enable_batching=True, batching_parameters_file=str(tmp_path / "missing")
        )


def test_a_full_batch_queue_is_503_unavailable_on_every_protocol():
    from lifecycle.server._errors import error_status

    status = error_status(lc.QueueFullError("full"))
    assert (status.status, status.code, status.grpc_code.name) == (
        503,
        "UNAVAILABLE",
        "UNAVAILABLE",
    )


def test_a_grpc_overload_refusal_is_not_logged_as_a_failure_but_an_error_is(caplog):
    from lifecycle.server._errors import grpc_answered

    class Context:
        def abort(self, code, message):
            raise grpc.RpcError(code, message)

    def failing(error):
        @grpc_answered
        def Predict(request, context):
            raise error

        return Predict

    caplog.set_level(logging.INFO, logger="lifecycle.server")
    with pytest.raises(grpc.RpcError) as refused:
        failing(lc.QueueFullError("The batch queue is full."))(None, Context())
    assert refused.value.args == (grpc.StatusCode.UNAVAILABLE, "The batch queue is full.")
    assert caplog.records == []  # a flood of refusals would fill the log
    with pytest.raises(grpc.RpcError) as failed:
        failing(RuntimeError("boom"))(None, Context())
    assert failed.value.args[0] is grpc.StatusCode.INTERNAL
    assert [(r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("gRPC Predict failed", True)
    ]


def test_tensorflow_serving_parallelism_flags():
    assert ServerConfig.from_flags(tensorflow_session_parallelism=2).intra_op_parallelism == 2
    config = ServerConfig.from_flags(
        tensorflow_intra_op_parallelism=1, tensorflow_inter_op_parallelism=3
    )
    assert (config.intra_op_parallelism, config.inter_op_parallelism) == (1, 3)
    # As TensorFlow Serving: the two specific flags win over the session one; not all three.
    config = ServerConfig.from_flags(
        tensorflow_session_parallelism=2, tensorflow_intra_op_parallelism=1
    )
    assert (config.intra_op_parallelism, config.inter_op_parallelism) == (1, 0)
    with pytest.raises(ValueError, match="not all three"):
        ServerConfig.from_flags(
            tensorflow_session_parallelism=2,
            tensorflow_intra_op_parallelism=1,
            tensorflow_inter_op_parallelism=1,
        )
    with pytest.raises(ValueError, match="--tensorflow_inter_op_parallelism must be an integer"):
        ServerConfig.from_flags(tensorflow_inter_op_parallelism=-1)
