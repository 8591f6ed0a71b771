"""The flags of `lifecycle serve`: declared once, and everything made from the declarations."""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import typer.main
from typer.testing import CliRunner

from lifecycle import cli
from lifecycle._core._flag import docs_table
from lifecycle.cli._serve import serve_flags
from lifecycle.server import ServedModel, ServerConfig, _flags

ROOT = Path(__file__).resolve().parents[1]
SERVING_DOCS = ROOT / "docs" / "serving.md"


def documented_table() -> str:
    """The table of flags in docs/serving.md's "Flags" section, as written."""
    text = SERVING_DOCS.read_text()
    section = text[text.index("\n## Flags\n") :]
    start = section.index("| flag | default | meaning |\n")
    return section[start : section.index("\n\n", start) + 1]


def test_the_docs_table_of_flags_is_the_declarations():
    expected = docs_table(serve_flags())
    assert documented_table() == expected, (
        "docs/serving.md's table of flags differs from the declarations "
        "(lifecycle/server/_flags.py, lifecycle/cli/_allocator.py); paste this table there:\n"
        + expected
    )


def test_the_command_has_one_option_per_declared_flag():
    command = typer.main.get_command(cli.build_app()).commands["serve"]
    options = {param.name: param.opts for param in command.params if param.name != "help"}
    assert options == {flag.name: [flag.flag, *flag.aliases] for flag in serve_flags()}


def test_from_flags_takes_the_declared_flags():
    declared = [(flag.name, flag.default) for flag in _flags.FLAGS]
    parameters = inspect.signature(ServerConfig.from_flags).parameters.values()
    assert [(p.name, p.default) for p in parameters] == declared
    assert "allocator" not in inspect.signature(ServerConfig.from_flags).parameters


def test_an_unknown_flag_is_a_type_error():
    with pytest.raises(
        TypeError, match=r"from_flags\(\) got unexpected keyword arguments: \['nope'\]"
    ):
        ServerConfig.from_flags(nope=1)


def test_every_default_passes_its_check():
    for flag in serve_flags():
        if flag.check is not None:
            flag.check(flag.default, flag.flag)
    assert ServerConfig.from_flags() == ServerConfig()


def test_every_flag_has_a_help_and_the_command_shows_it_plain():
    for flag in serve_flags():
        assert flag.help and not flag.help.endswith("."), flag.name
        assert "`" not in flag.plain_help and "](" not in flag.plain_help, flag.name
        assert flag.plain_help.endswith("."), flag.name


# (flag, bad value, fragment): each refused by from_flags, with the flag named.
BAD_VALUES = [
    ("port", 70000, "--port must be a port number, 0-65535. Received: 70000"),
    ("rest_api_port", -1, "--rest_api_port must be a port number, 0-65535. Received: -1"),
    ("grpc_max_threads", 0, "--grpc_max_threads must be an integer >= 1. Received: 0"),
    ("memory_budget", 1.5, "--memory_budget must be an integer >= 1 or None. Received: 1.5"),
    ("memory_budget", 0, "--memory_budget must be an integer >= 1 or None. Received: 0"),
    ("max_loaded", 1.5, "--max_loaded must be an integer >= 1 or None. Received: 1.5"),
    ("max_loaded", True, "--max_loaded must be an integer >= 1 or None. Received: True"),
    ("max_request_bytes", 0.5, "--max_request_bytes must be an integer >= 1. Received: 0.5"),
    ("drain_seconds", 0, "--drain_seconds must be a number > 0. Received: 0"),
    ("drain_seconds", math.nan, "--drain_seconds must be a number > 0. Received: nan"),
    ("file_system_poll_wait_seconds", -1, "--file_system_poll_wait_seconds must be a number >= 0"),
    ("repository_poll_secs", -1.0, "--repository_poll_secs must be a number >= 0 or None"),
    ("loader_foreground_bytes", "20", "--loader_foreground_bytes must be an integer >= 0"),
    ("sticky_key_header", "a key", "--sticky_key_header must be an HTTP header name"),
    ("swap_policy", "fast", "--swap_policy must be one of"),
    ("model_control_mode", "lazy", "--model_control_mode must be one of"),
    ("tensorflow_session_parallelism", -1, "--tensorflow_session_parallelism must be an integer"),
]


@pytest.mark.parametrize(("name", "value", "fragment"), BAD_VALUES)
def test_a_bad_value_is_refused_naming_the_flag_and_showing_the_value(name, value, fragment):
    with pytest.raises(ValueError) as caught:
        ServerConfig.from_flags(**{name: value})
    assert fragment in str(caught.value)


# ServerConfig's fields are checked with the declarations' checks; the message names the
# flag and the field.
BAD_FIELDS = [
    ({"max_loaded": 1.5}, "--max_loaded must be an integer >= 1 or None. Received: max_loaded=1.5"),
    (
        {"memory_budget": 0},
        "--memory_budget must be an integer >= 1 or None. Received: memory_budget=0",
    ),
    ({"grpc_port": -1}, "--port must be a port number, 0-65535. Received: grpc_port=-1"),
    (
        {"max_request_bytes": 2.5},
        "--max_request_bytes must be an integer >= 1. Received: max_request_bytes=2.5",
    ),
    ({"drain_seconds": -1}, "--drain_seconds must be a number > 0. Received: drain_seconds=-1"),
    (
        {"intra_op_parallelism": -2},
        "--tensorflow_intra_op_parallelism must be an integer >= 0. "
        "Received: intra_op_parallelism=-2",
    ),
    (
        {"sticky_key_header": ""},
        "--sticky_key_header must be an HTTP header name. Received: sticky_key_header=''",
    ),
]


@pytest.mark.parametrize(("fields", "message"), BAD_FIELDS)
def test_server_config_checks_its_fields_with_the_flags_checks(fields, message):
    with pytest.raises(ValueError) as caught:
        ServerConfig(**fields)
    assert str(caught.value) == message


def test_the_command_turns_the_switches_and_lists_into_from_flags_keywords():
    from lifecycle.cli._serve import server_flags

    given = {flag.name: (None if flag.type is list else flag.default) for flag in serve_flags()}
    given |= {"admin_api": True, "load_model": ["a", "b"]}  # --no_admin_api given
    flags = server_flags(given)
    assert set(flags) == {flag.name for flag in _flags.FLAGS}
    assert flags["admin_api"] is False
    assert flags["load_model"] == ("a", "b") and flags["route"] == ()


def test_serve_passes_the_flags_to_the_server(monkeypatch):
    import lifecycle.server

    served: list[ServerConfig] = []
    monkeypatch.setattr(lifecycle.server, "serve", served.append)
    args = ["serve", "--port", "0", "--no_admin_api", "--max_loaded", "2", "--drain_seconds", "3"]
    result = CliRunner().invoke(cli.build_app(), args)
    assert result.exit_code == 0, result.output
    (config,) = served
    assert (config.grpc_port, config.admin_api, config.max_loaded) == (0, False, 2)
    assert config.drain_seconds == 3.0


def test_serve_imports_factories_from_the_current_directory_after_the_installed_packages(
    tmp_path, monkeypatch
):
    """A file in the directory the server starts in cannot shadow the standard library."""
    import importlib.util
    import sys

    import lifecycle.server

    (tmp_path / "cwd_architecture.py").write_text("def build():\n    return 'built'\n")
    (tmp_path / "this.py").write_text("raise SystemExit('the current directory came first')\n")
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    served: list[ServerConfig] = []
    monkeypatch.setattr(lifecycle.server, "serve", served.append)
    args = ["serve", "--model_base_path", "m", "--model_factory", "cwd_architecture:build"]
    result = CliRunner().invoke(cli.build_app(), args)
    assert result.exit_code == 0, result.output
    (config,) = served
    assert config.models[0].factory() == "built"  # the project's module, imported
    assert sys.path[-1] == str(tmp_path)
    this = importlib.util.find_spec("this")
    assert this is not None and this.origin != str(tmp_path / "this.py")


def test_a_short_admin_token_is_refused_before_tensorflow_is_imported(monkeypatch):
    monkeypatch.delenv("LIFECYCLE_ADMIN_TOKEN", raising=False)
    with pytest.raises(ValueError, match="must be at least 16 characters long; this one has 15"):
        ServerConfig.from_flags(admin_token="a" * 15)
    result = CliRunner().invoke(cli.build_app(), ["serve", "--admin_token", "short-token"])
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert "--admin_token (or LIFECYCLE_ADMIN_TOKEN) must be at least 16 characters" in output
    assert "secrets.token_urlsafe(32)" in output and "short-token" not in output


# -- one label rule -------------------------------------------------------------------------


def test_a_config_file_label_follows_the_label_rule(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "m" base_path: "{tmp_path / "m"}" '
        'version_labels { key: "canary-1" value: 1 } } }'
    )
    with pytest.raises(ValueError) as caught:
        ServerConfig.from_flags(model_config_file=str(config))
    message = str(caught.value)
    assert "model 'm': Model 'm': A version label must match [a-zA-Z0-9_]+" in message
    assert "Received: label='canary-1'" in message


def test_the_registry_and_the_server_refuse_the_labels_the_config_file_refuses():
    import lifecycle as lc

    # The admin API sets labels on the registry itself (tests/test_server_admin.py).
    with lc.ModelRegistry() as registry:
        for bad in ("canary-1", "a b", "", "é"):
            with pytest.raises(ValueError, match=r"must match \[a-zA-Z0-9_\]\+"):
                registry.set_label("m", bad, 1)
        with pytest.raises(lc.UnknownModelError):  # a good label: then the model is looked up
            registry.set_label("m", "canary_1", 1)


# -- each default declared once ----------------------------------------------------------------

# Flags that set no field as given: ServerConfig.from_flags reads the models, or derives a
# field of several flags (routes, batching, the thread counts), from them.
NOT_A_FIELD = {
    "model_name",
    "model_base_path",
    "model_config_file",
    "model_factory",
    "route",
    "enable_batching",
    "max_batch_size",
    "batch_timeout_micros",
    "allowed_batch_sizes",
    "num_batch_threads",
    "max_enqueued_batches",
    "batching_parameters_file",
    "batch_return_wait",
    "tensorflow_session_parallelism",
}


def flag_fields() -> dict[str, attrs.Attribute]:
    """ServerConfig's fields that a flag sets, by the flag's name."""
    return {
        field.metadata[_flags.FLAG]: field
        for field in attrs.fields(ServerConfig)
        if _flags.FLAG in field.metadata
    }


def test_every_flag_sets_a_field_declared_from_it_or_is_listed_as_deriving_one():
    server = {flag.name for flag in _flags.FLAGS}
    assert set(flag_fields()) == server - NOT_A_FIELD
    # A field named as a flag but declared by hand would copy its default.
    for field in attrs.fields(ServerConfig):
        if field.name in server:
            assert field.metadata.get(_flags.FLAG) == field.name, field.name


def test_each_fields_default_is_its_flags_default_or_the_one_the_docs_show():
    config = ServerConfig()
    declared = {flag.name: flag for flag in _flags.FLAGS}
    for name, field in flag_fields().items():
        flag, value = declared[name], getattr(config, field.name)
        assert field.default == flag.default, name  # declared once, in the flag table
        value = getattr(value, "value", value)  # an enum: --swap_policy
        if flag.default is None and value is not None:
            # Converted from "not given", as the docs' table of flags says.
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            assert shown == flag.plain_default, name
        else:
            assert value == (tuple(flag.default) if flag.type is list else flag.default), name
    assert (config.repository_poll_secs, config.model_control_mode) == (15.0, "none")
    assert (config.grpc_port, config.load_models, config.rest_api_port) == (8500, (), 8501)


# -- each rule checked once --------------------------------------------------------------------


@pytest.fixture
def scans(monkeypatch) -> list[tuple]:
    """The scans of a model repository for its start-up models, as made."""
    from lifecycle.server import _config

    made: list[tuple] = []
    scan = _config.repository_startup_models

    def counted(*args):
        made.append(args)
        return scan(*args)

    monkeypatch.setattr(_config, "repository_startup_models", counted)
    return made


@pytest.fixture
def repository(tmp_path) -> Path:
    """A repository of two models, each with a version directory (never loaded here)."""
    for name in ("a", "b"):
        (tmp_path / "repo" / name / "1").mkdir(parents=True)
    return tmp_path / "repo"


def test_from_flags_scans_the_repository_once_and_the_config_keeps_the_start_up_models(
    scans, repository
):
    config = ServerConfig.from_flags(
        model_repository=str(repository), model_control_mode="explicit", load_model=["b"]
    )
    assert len(scans) == 1
    assert config.startup_models() == ("b",)
    assert config.startup_models() == ("b",)  # what the service reads when it starts
    assert len(scans) == 1
    config = ServerConfig.from_flags(model_repository=str(repository))
    assert config.startup_models() == ("a", "b") and len(scans) == 2


def test_from_flags_with_a_route_scans_the_repository_once(scans, repository):
    config = ServerConfig.from_flags(model_repository=str(repository), route=["a=1:1"])
    assert len(scans) == 1
    assert config.model_repository == str(repository) and config.routes == {"a": {1: 1.0}}


# ServerConfig built directly: the rules between its fields, with the flags' messages.
BAD_CONFIGS = [
    ({"routes": {"risk": {1: 1.0}}}, "--route names models that are not served: ['risk']"),
    ({"host": "0.0.0.0"}, "--host '0.0.0.0' accepts other hosts, so the admin API needs a token"),
    ({"admin_token": "short"}, "must be at least 16 characters long; this one has 5"),
    ({"load_models": ["a"]}, "--model_control_mode and --load_model need --model_repository."),
    ({"model_control_mode": "poll"}, "--model_control_mode and --load_model need"),
    (
        {"models": [ServedModel("m", "/a"), ServedModel("m", "/b")]},
        "--model_config_file names ['m'] more than once.",
    ),
]


@pytest.mark.parametrize(("fields", "fragment"), BAD_CONFIGS)
def test_server_config_checks_the_rules_between_its_fields(fields, fragment):
    with pytest.raises(ValueError) as caught:
        ServerConfig(**fields)
    assert fragment in str(caught.value)


def test_server_config_checks_its_repository_fields_against_the_repository(repository):
    with pytest.raises(ValueError) as caught:
        ServerConfig(model_repository=str(repository), load_models=["a"])
    assert "--load_model takes effect only with --model_control_mode explicit" in str(caught.value)
    with pytest.raises(ValueError) as caught:
        ServerConfig(models=[ServedModel("a", "/a")], model_repository=str(repository))
    assert "holds models named as models of --model_base_path" in str(caught.value)
    config = ServerConfig(model_repository=str(repository), routes={"b": {1: 1.0}})
    assert config.startup_models() == ("a", "b")


@pytest.mark.subprocess
def test_from_flags_refuses_bad_flags_without_importing_tensorflow(tmp_path):
    """What ``lifecycle serve`` runs first: the flags' rules and the fields' rules, no TF."""
    code = """
import sys
from lifecycle.server import ServerConfig
for flags in ({"route": ["risk=1:1"]}, {"tensorflow_session_parallelism": 1,
        "tensorflow_intra_op_parallelism": 1, "tensorflow_inter_op_parallelism": 1},
        {"enable_batching": True, "batching_parameters_file": sys.argv[1]}):
    try:
        ServerConfig.from_flags(**flags)
    except ValueError as error:
        print(str(error).split(":")[0].split(" or ")[0])
print(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
"""
    path = tmp_path / "batching.config"
    path.write_text("pad_variable_length_inputs: true\n")
    env = {k: v for k, v in os.environ.items() if k != "LIFECYCLE_ADMIN_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "--route names models that are not served",
        "Set either --tensorflow_session_parallelism",
        f"--batching_parameters_file '{path}' asks for pad_variable_length_inputs, which "
        "lifecycle serve does not do",
        "[]",
    ]
