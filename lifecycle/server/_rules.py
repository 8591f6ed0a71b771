"""The rules of the server's flags that need no TensorFlow: values, paths, files, batching.

:mod:`._flags` declares each flag once and checks it with these. The rules of
settings that go together (the models and the repository, the routes, the admin
token and the host) are one function, :func:`check_fields`, which
``ServerConfig`` applies to its fields. This module imports the library's
pure-Python core only, and protobuf for the config files: ``lifecycle serve``
runs them before it imports TensorFlow, which takes seconds. Every message names
the flag and shows the value received.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .._core._batcher import BatchingPolicy
from .._core._checks import check_label, check_number, invalid
from .._core._model_dirs import repository_models  # the registry's listing, TF-free

__all__ = [
    "ADMIN_TOKEN_ENV",
    "ALL_MODELS",
    "BATCHING_FLAGS",
    "CONTROL_MODES",
    "HEADER_CHARS",
    "LOADER_FOREGROUND_BYTES",
    "MIN_ADMIN_TOKEN_LENGTH",
    "REPOSITORY_POLL_SECS",
    "SWAP_POLICIES",
    "base_path",
    "batching_flags",
    "batching_message",
    "batching_policy",
    "check_admin",
    "check_fields",
    "check_header",
    "check_labels",
    "config_entries",
    "control_mode",
    "env_token",
    "factory_names",
    "factory_target",
    "is_loopback",
    "parse_route",
    "parse_text",
    "read_model_server_config",
    "repository_models",
    "repository_path",
    "startup_models",
    "swap_policy_name",
]

#: Where the admin token is read when ``--admin_token`` is not given: a secret
#: on a command line is visible to every user of the machine (``ps``).
ADMIN_TOKEN_ENV = "LIFECYCLE_ADMIN_TOKEN"
#: The shortest admin token accepted: 16 characters, too many to guess by trying
#: them against the server (``secrets.token_urlsafe(32)`` makes 43).
MIN_ADMIN_TOKEN_LENGTH = 16
# An HTTP header name (RFC 9110 token characters).
HEADER_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~"
)
#: The values of the registry's ``SwapPolicy`` (a test keeps the two equal).
SWAP_POLICIES = ("availability_preserving", "resource_preserving")
#: Triton's model control modes (``--model_control_mode``).
CONTROL_MODES = ("none", "poll", "explicit")
#: ``--load_model``'s name for every model of the repository, as in Triton.
ALL_MODELS = "*"
#: Triton's default ``--repository_poll_secs``.
REPOSITORY_POLL_SECS = 15.0
#: The server's ``--loader_foreground_bytes``: versions of at most this many bytes on
#: disk load in the foreground. Keras's ``model.export()`` writes each variable twice,
#: so this is about 20 MiB of weights (docs/benchmarks.md, "Swap to first response").
LOADER_FOREGROUND_BYTES = 40 * 2**20
_REMOTE = ("gs://", "s3://", "hdfs://")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): other hosts cannot connect."""
    import ipaddress  # here: the command's --help does not need it

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve beyond loopback
        return False


# -- words ----------------------------------------------------------------------------


def env_token() -> str | None:
    """The admin token of the ``LIFECYCLE_ADMIN_TOKEN`` environment variable, if set."""
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def check_admin(host: str, admin_api: bool, admin_token: str | None) -> None:
    """The admin token is well formed and long enough, and there is one if other hosts may call.

    The messages never show the token: they are printed and logged.
    """
    if admin_token is not None and (
        not isinstance(admin_token, str)
        or not admin_token
        or not admin_token.isprintable()
        or " " in admin_token
    ):
        raise ValueError(
            f"--admin_token (or {ADMIN_TOKEN_ENV}) must be a non-empty string of "
            "printable characters without spaces (it travels as "
            "'Authorization: Bearer <token>')."
        )
    if admin_token is not None and len(admin_token) < MIN_ADMIN_TOKEN_LENGTH:
        raise ValueError(
            f"--admin_token (or {ADMIN_TOKEN_ENV}) must be at least {MIN_ADMIN_TOKEN_LENGTH} "
            f"characters long; this one has {len(admin_token)}. Make one with: "
            'python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    if admin_api and admin_token is None and not is_loopback(host):
        raise ValueError(
            f"--host {host!r} accepts other hosts, so the admin API needs a token: "
            f"set --admin_token (or the {ADMIN_TOKEN_ENV} environment variable), or "
            "pass --no_admin_api to serve without the admin API."
        )


def check_header(value: object, flag: str = "--sticky_key_header", field: str | None = None) -> str:
    """An HTTP header name (``--sticky_key_header``)."""
    if not isinstance(value, str) or not value or not set(value) <= HEADER_CHARS:
        raise invalid(flag, "an HTTP header name", value, field=field)
    return value


def check_labels(model: str, labels: Collection[str]) -> None:
    """Each of a model's version labels follows the library's one label rule."""
    for label in labels:
        try:
            check_label(label)
        except ValueError as error:
            raise ValueError(f"Model {model!r}: {error}") from None


def swap_policy_name(value: object, flag: str = "--swap_policy", field: str | None = None) -> str:
    """The ``--swap_policy`` value, lower case."""
    value = getattr(value, "value", value)  # a SwapPolicy
    if isinstance(value, str) and value.lower() in SWAP_POLICIES:
        return value.lower()
    raise invalid(flag, f"one of {list(SWAP_POLICIES)}", value, field=field)


def control_mode(
    value: object, flag: str = "--model_control_mode", field: str | None = None
) -> str:
    """The ``--model_control_mode`` value, lower case (Triton accepts either case)."""
    if value is None:  # not given: Triton's default
        return "none"
    if isinstance(value, str) and value.lower() in CONTROL_MODES:
        return value.lower()
    raise invalid(flag, f"one of {list(CONTROL_MODES)} (Triton's modes)", value, field=field)


def parse_route(spec: str) -> tuple[str, dict[str | int, float]]:
    """``(model, {target: weight})`` of a ``--route`` value such as ``risk=stable:90,canary:10``."""
    usage = f"--route takes name=target:weight,target:weight... Received: {spec!r}"
    name, sep, targets = spec.partition("=")
    if not sep or not name.strip() or not targets:
        raise ValueError(usage)
    weights: dict[str | int, float] = {}
    for part in targets.split(","):
        target, sep, weight = part.strip().rpartition(":")
        if not sep or not target:
            raise ValueError(usage)
        try:
            value = float(weight)
        except ValueError:
            raise ValueError(f"{usage} ({weight!r} is not a number)") from None
        weights[int(target) if target.isdigit() else target] = value
    return name.strip(), weights


def factory_target(target: str) -> tuple[str, str]:
    """``(module, function)`` of a ``--model_factory`` ``module:function``."""
    module, sep, function = target.partition(":")
    if not sep or not module or not function:
        raise ValueError(f"--model_factory takes module:function. Received: {target!r}")
    return module, function


def factory_names(specs: Sequence[str], models: Sequence[str]) -> dict[str, str]:
    """``{model: module:function}`` of the ``--model_factory`` values, for ``models``."""
    targets: dict[str, str] = {}
    for spec in specs:
        name, sep, target = spec.rpartition("=")
        if not sep:
            if len(models) != 1:
                raise ValueError(
                    f"--model_factory {spec!r}: with several models, name the model "
                    "(name=module:function)."
                )
            name = models[0]
        if name not in models:
            raise ValueError(
                f"--model_factory {spec!r}: no served model is named {name!r}. "
                f"Served: {sorted(models)}"
            )
        factory_target(target)
        targets[name] = target
    return targets


# -- directories ----------------------------------------------------------------------


def _model_file(directory: str) -> str | None:
    """What makes ``directory`` a model itself: ``saved_model.pb`` or a ``.keras`` file."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
    names = sorted(e.name for e in entries if e.is_file())
    if "saved_model.pb" in names:
        return "saved_model.pb"
    return next((name for name in names if name.endswith(".keras")), None)


def _not_a_model(directory: str, what: str, layout: str, example: str, hint: str = "") -> None:
    """Refuse a directory meant to hold version directories that is a model itself."""
    found = _model_file(directory)
    if found is None:
        return
    kind = "a SavedModel" if found == "saved_model.pb" else "a .keras file"
    example_file = "saved_model.pb" if found == "saved_model.pb" else found
    raise ValueError(
        f"{what} holds {kind} itself ({found}), but models are served from version "
        f"directories: {layout}{example_file}, e.g. {example}{example_file}{hint}."
    )


def base_path(path: str, flag: str = "--model_base_path") -> str:
    """The absolute base path of version directories that ``path`` names, checked.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        ValueError: ``path`` is remote, or is a model itself (it holds
            ``saved_model.pb`` or a ``.keras`` file, not version directories).
    """
    if path.startswith(_REMOTE):
        raise ValueError(f"{flag}: only local base paths are served. Received: {path!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{flag}: base path {path!r} is not a directory.")
    path = os.path.abspath(path)
    name, parent = os.path.basename(path), os.path.dirname(path)
    hint = f" ({name!r} looks like a version: pass its parent, {parent})" if name.isdigit() else ""
    layout = "<base_path>/<version>/"
    _not_a_model(path, f"{flag} {path!r}", layout, os.path.join(path, "1", ""), hint)
    return path


def repository_path(path: str, flag: str = "--model_repository", *, models: bool = True) -> str:
    """The absolute path of a model repository, ``<repository>/<model>/<version>/``, checked.

    With ``models``, each model directory is checked too (at start-up; a model
    added later that is not a directory of versions fails to load, and says so).

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        ValueError: ``path`` is remote, or it or one of its model directories
            is a model itself rather than a directory of versions.
    """
    if path.startswith(_REMOTE):
        raise ValueError(f"{flag}: only local repositories are served. Received: {path!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{flag}: repository {path!r} is not a directory.")
    path = os.path.abspath(path)
    layout = "<repository>/<model>/<version>/"
    _not_a_model(path, f"{flag} {path!r}", layout, os.path.join(path, "<model>", "1", ""))
    for name in repository_models(path) if models else ():
        model = os.path.join(path, name)
        hint = (
            f" (the repository looks like a base path of versions: serve it with "
            f"--model_base_path {path})"
            if name.isdigit()
            else ""
        )
        where = f"{flag} {path!r}: model {name!r}"
        _not_a_model(model, where, layout, os.path.join(model, "1", ""), hint)
    return path


def startup_models(
    repository: str | None,
    mode: str,
    load_models: Sequence[str],
    poll_secs: float,
    configured: Collection[str],
) -> tuple[str, ...]:
    """The repository's models to load at start-up, once the repository flags are checked.

    Args:
        repository: ``--model_repository``, or ``None``.
        mode: ``--model_control_mode``.
        load_models: ``--load_model`` values.
        poll_secs: ``--repository_poll_secs``.
        configured: The models of ``--model_base_path`` or ``--model_config_file``.

    Raises:
        ValueError: A flag is out of range, or does not go with the others.
    """
    mode = control_mode(mode)
    check_number(poll_secs, "--repository_poll_secs")
    if repository is None:
        if mode != "none" or load_models:
            raise ValueError("--model_control_mode and --load_model need --model_repository.")
        return ()
    if mode == "poll" and not poll_secs > 0:
        raise ValueError(
            f"--model_control_mode poll needs --repository_poll_secs > 0. Received: {poll_secs!r}"
        )
    names = repository_models(repository)
    clash = sorted(set(names) & set(configured))
    if clash:
        raise ValueError(
            f"--model_repository {repository!r} holds models named as models of "
            f"--model_base_path or --model_config_file: {clash}. Rename one or the other."
        )
    if load_models and mode != "explicit":
        raise ValueError(
            f"--load_model takes effect only with --model_control_mode explicit, as in "
            f"Triton; in mode {mode!r} every model of the repository loads at start-up. "
            f"Received: --load_model {list(load_models)}"
        )
    if mode != "explicit":
        return tuple(names)
    if ALL_MODELS in load_models:
        if len(load_models) > 1:
            raise ValueError(
                "--load_model '*' loads every model of the repository and cannot be "
                f"combined with other --load_model names. Received: {list(load_models)}"
            )
        return tuple(names)
    unknown = sorted(set(load_models) - set(names))
    if unknown:
        raise ValueError(
            f"--load_model {unknown}: no such model directory in --model_repository "
            f"{repository!r}. Its models: {names}"
        )
    return tuple(dict.fromkeys(load_models))


def check_fields(
    *,
    models: Sequence[str],
    routes: Collection[str],
    repository: str | None,
    mode: str,
    load_models: Sequence[str],
    poll_secs: float,
    host: str,
    admin_api: bool,
    admin_token: str | None,
) -> tuple[str, ...]:
    """The rules of the server's settings that go together; the repository's start-up models.

    ``ServerConfig`` checks its fields with these once, when built; ``lifecycle
    serve`` checks the values its flags give them before it imports TensorFlow.
    The repository is scanned once, here, for the start-up models.

    Args:
        models: The names of the models of ``--model_base_path`` or
            ``--model_config_file``.
        routes: The models ``--route`` sets routes of.
        repository: ``--model_repository``, checked, or ``None``.
        mode: ``--model_control_mode``.
        load_models: ``--load_model`` values.
        poll_secs: ``--repository_poll_secs``.
        host: ``--host``.
        admin_api: Whether the admin API is served (``--no_admin_api`` not given).
        admin_token: ``--admin_token``, or the one of the environment.

    Returns:
        The repository's models to load at start-up.

    Raises:
        ValueError: The settings do not go together; the message names the flags.
    """
    twice = sorted({name for name in models if models.count(name) > 1})
    if twice:
        raise ValueError(f"--model_config_file names {twice} more than once.")
    started = startup_models(repository, mode, load_models, poll_secs, models)
    unknown = sorted(set(routes) - {*models, *started})
    if unknown:
        raise ValueError(f"--route names models that are not served: {unknown}")
    check_admin(host, admin_api, admin_token)
    return started


# -- files ----------------------------------------------------------------------------


def parse_text(path: str, flag: str, message: Any, hint: str = "") -> Any:
    """``message`` filled from the protobuf text file at ``path``; errors name ``flag``."""
    from google.protobuf import text_format

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag} does not exist.") from None
    except IsADirectoryError:
        raise FileNotFoundError(f"{flag} is a directory, not a file.") from None
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as error:
        raise ValueError(f"{flag} does not parse: {error}{hint}") from None


def read_model_server_config(path: str) -> Any:
    """TensorFlow Serving's ``ModelServerConfig`` of a ``--model_config_file``, parsed."""
    from tensorflow_serving.config import model_server_config_pb2

    flag = f"--model_config_file {path!r}"
    return parse_text(path, flag, model_server_config_pb2.ModelServerConfig())


def config_entries(config: Any, source: str) -> list[tuple[Any, str]]:
    """``(entry, absolute base path)`` of each model of a ``ModelServerConfig``, checked.

    Raises:
        FileNotFoundError: A base path does not exist.
        ValueError: The config asks for what is not supported, or names a
            model twice; the message begins with ``source``.
    """
    if config.WhichOneof("config") != "model_config_list":
        raise ValueError(f"{source} has no model_config_list.")
    entries = []
    for entry in config.model_config_list.config:
        where = f"{source}, model {entry.name!r}"
        if not entry.name or not entry.base_path:
            raise ValueError(f"{where}: every config needs a name and a base_path.")
        if entry.model_platform not in ("", "tensorflow"):
            raise ValueError(
                f"{where}: model_platform {entry.model_platform!r} is not served; "
                "use 'tensorflow' or leave it out."
            )
        path = base_path(entry.base_path, flag=where)
        try:
            check_labels(entry.name, entry.version_labels)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        entries.append((entry, path))
    names = [entry.name for entry, _ in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{source} names {twice} more than once.")
    return entries


#: TensorFlow Serving's batching flags, which a ``--batching_parameters_file`` replaces.
BATCHING_FLAGS = (
    "max_batch_size",
    "batch_timeout_micros",
    "allowed_batch_sizes",
    "num_batch_threads",
    "max_enqueued_batches",
)


def batching_policy(given: Mapping[str, Any], return_wait: float | None) -> BatchingPolicy:
    """The registry's batching policy of the batching flags given.

    The policy checks its ranges itself, so that the flags and the library have
    one rule; its messages name its fields, turned here into the flags.

    Raises:
        ValueError: A flag is out of range; the message names it.
    """
    wait = {} if return_wait is None else {"return_wait": return_wait}
    try:
        return BatchingPolicy(**given, **wait)
    except ValueError as error:
        raise ValueError(batching_message(error)) from None


def batching_message(error: ValueError) -> str:
    """A batching policy's message, its fields named as the flags that set them."""
    message = str(error).replace("`return_wait`", "--batch_return_wait")
    for name in BATCHING_FLAGS:
        message = message.replace(f"`{name}`", f"--{name}")
    return message


def batching_flags(enabled: bool, path: str | None, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The batching flags given (``allowed_batch_sizes`` as a list), checked against the file.

    Their ranges are the batching policy's own checks, made when it is built.
    """
    given = {name: value for name, value in flags.items() if value is not None}
    if path is not None and given:
        named = ", ".join(f"--{name}" for name in given)
        raise ValueError(
            f"--batching_parameters_file cannot be combined with {named}: set them in the file."
        )
    if enabled and path is not None and not os.path.isfile(path):
        raise FileNotFoundError(f"--batching_parameters_file {path!r} does not exist.")
    allowed = given.get("allowed_batch_sizes")
    if isinstance(allowed, str):
        try:
            given["allowed_batch_sizes"] = [int(s) for s in allowed.split(",") if s.strip()]
        except ValueError:
            raise ValueError(
                f"--allowed_batch_sizes takes comma-separated integers. Received: {allowed!r}"
            ) from None
    return given
