"""The server's flags, checked without TensorFlow.

``lifecycle serve`` refuses a bad flag with :func:`check_flags` before it imports
TensorFlow, which takes seconds; :class:`~lifecycle.server.ServerConfig` checks
its fields with the same functions, so each rule is written once. This module
imports nothing of the library (``import lifecycle`` imports TensorFlow), only
the standard library and, for the config files, protobuf: the command loads it
on its own (``lifecycle/cli/_serve.py``). Every message names the flag and shows
the value received.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "ADMIN_TOKEN_ENV",
    "ALL_MODELS",
    "BATCHING_FLAGS",
    "CONTROL_MODES",
    "HEADER_CHARS",
    "LABEL_CHARS",
    "LOADER_FOREGROUND_BYTES",
    "REPOSITORY_POLL_SECS",
    "SWAP_POLICIES",
    "base_path",
    "batching_message",
    "batching_policy",
    "check_flags",
    "is_loopback",
    "repository_models",
    "repository_path",
    "startup_models",
]

#: Where the admin token is read when ``--admin_token`` is not given: a secret
#: on a command line is visible to every user of the machine (``ps``).
ADMIN_TOKEN_ENV = "LIFECYCLE_ADMIN_TOKEN"
# TensorFlow Serving's own label syntax.
LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
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
_Policy = TypeVar("_Policy")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): other hosts cannot connect."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve beyond loopback
        return False


# -- numbers --------------------------------------------------------------------------


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def check_port(flag: str, value: object) -> None:
    """A port number, 0-65535."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ValueError(f"{flag} must be a port number, 0-65535. Received: {value!r}")


def check_bytes(flag: str, value: object) -> None:
    """A byte count: an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{flag} must be an integer >= 0 (bytes). Received: {value!r}")


def check_positive(flag: str, value: object, *, optional: bool = False) -> None:
    """A number > 0 (or ``None`` when ``optional``)."""
    if value is None and optional:
        return
    if not _number(value) or not value > 0:  # type: ignore[operator]
        raise ValueError(f"{flag} must be a number > 0. Received: {value!r}")


def check_count(flag: str, value: object) -> None:
    """An integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{flag} must be an integer >= 1. Received: {value!r}")


def check_non_negative(flag: str, value: object) -> None:
    """A number >= 0."""
    if not _number(value) or not value >= 0:  # type: ignore[operator]
        raise ValueError(f"{flag} must be a number >= 0. Received: {value!r}")


def check_threads(flag: str, value: object) -> None:
    """A thread count: an integer >= 0 (0: TensorFlow's choice)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{flag} must be an integer >= 0. Received: {value!r}")


def parallelism(session: int, intra: int, inter: int) -> dict[str, int]:
    """The thread counts of TensorFlow Serving's three parallelism flags."""
    check_threads("--tensorflow_session_parallelism", session)
    check_threads("--tensorflow_intra_op_parallelism", intra)
    check_threads("--tensorflow_inter_op_parallelism", inter)
    if session and intra and inter:
        raise ValueError(
            "Set either --tensorflow_session_parallelism or --tensorflow_intra_op_parallelism"
            " and --tensorflow_inter_op_parallelism, not all three (as TensorFlow Serving)."
        )
    if not (intra or inter):  # as TensorFlow Serving: the two flags win over the one
        intra = inter = session
    return {"intra_op_parallelism": intra, "inter_op_parallelism": inter}


# -- words ----------------------------------------------------------------------------


def env_token() -> str | None:
    """The admin token of the ``LIFECYCLE_ADMIN_TOKEN`` environment variable, if set."""
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def check_admin(host: str, admin_api: bool, admin_token: str | None) -> None:
    """The admin token is well formed, and there is one if other hosts may call."""
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
    if admin_api and admin_token is None and not is_loopback(host):
        raise ValueError(
            f"--host {host!r} accepts other hosts, so the admin API needs a token: "
            f"set --admin_token (or the {ADMIN_TOKEN_ENV} environment variable), or "
            "pass --no_admin_api to serve without the admin API."
        )


def check_header(value: object) -> None:
    """``--sticky_key_header`` is an HTTP header name."""
    if not isinstance(value, str) or not value or not set(value) <= HEADER_CHARS:
        raise ValueError(f"--sticky_key_header must be an HTTP header name. Received: {value!r}")


def check_labels(model: str, labels: Collection[str]) -> None:
    """Version labels follow TensorFlow Serving's ``[a-zA-Z0-9_]+``."""
    for label in labels:
        if not isinstance(label, str) or not label or not set(label) <= LABEL_CHARS:
            raise ValueError(f"Model {model!r}: version label {label!r} must match [a-zA-Z0-9_]+.")


def swap_policy_name(value: object) -> str:
    """The ``--swap_policy`` value, lower case."""
    if isinstance(value, str) and value.lower() in SWAP_POLICIES:
        return value.lower()
    raise ValueError(f"--swap_policy must be one of {list(SWAP_POLICIES)}. Received: {value!r}")


def control_mode(value: object) -> str:
    """The ``--model_control_mode`` value, lower case (Triton accepts either case)."""
    if isinstance(value, str) and value.lower() in CONTROL_MODES:
        return value.lower()
    raise ValueError(
        f"--model_control_mode must be one of {list(CONTROL_MODES)} (Triton's modes). "
        f"Received: {value!r}"
    )


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


def check_routes(names: Collection[str], served: Collection[str]) -> None:
    """Routes name models served from start-up."""
    unknown = sorted(set(names) - set(served))
    if unknown:
        raise ValueError(f"--route names models that are not served: {unknown}")


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


def repository_models(path: str) -> list[str]:
    """The model names of a repository: its directories, but dot-directories, sorted.

    A name is a directory's name, so never empty and never with ``/``: a
    valid model name. Files and dot-directories (``.git``, a model being
    written aside) are ignored.
    """
    try:
        entries = list(os.scandir(path))
    except OSError:  # removed meanwhile: no models
        return []
    return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())


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
    check_non_negative("--repository_poll_secs", poll_secs)
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


def batching_policy(
    policy: Callable[..., _Policy], given: Mapping[str, Any], return_wait: float | None
) -> _Policy:
    """``policy`` (the registry's ``BatchingPolicy``) of the batching flags given.

    The policy checks its ranges itself; its messages name its fields, turned
    here into the flags.

    Raises:
        ValueError: A flag is out of range; the message names it.
    """
    wait = {} if return_wait is None else {"return_wait": return_wait}
    try:
        return policy(**given, **wait)
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


# -- all at once ----------------------------------------------------------------------


def check_flags(
    *,
    rest_api_port: int = 8501,
    port: int = 8500,
    grpc_max_threads: int = 16,
    model_name: str | None = None,
    model_base_path: str | None = None,
    model_config_file: str | None = None,
    model_repository: str | None = None,
    model_control_mode: str | None = None,
    load_model: Sequence[str] = (),
    repository_poll_secs: float | None = None,
    host: str = "127.0.0.1",
    memory_budget: int | None = None,
    max_loaded: int | None = None,
    max_request_bytes: int = 64 * 2**20,
    drain_seconds: float = 10.0,
    file_system_poll_wait_seconds: float = 1.0,
    admin_api: bool = True,
    admin_token: str | None = None,
    sticky_key_header: str = "X-Lifecycle-Key",
    model_factory: Sequence[str] = (),
    swap_policy: Any = "availability_preserving",
    route: Sequence[str] = (),
    enable_batching: bool = False,
    batching_parameters_file: str | None = None,
    max_batch_size: int | None = None,
    batch_timeout_micros: int | None = None,
    allowed_batch_sizes: str | Sequence[int] | None = None,
    num_batch_threads: int | None = None,
    max_enqueued_batches: int | None = None,
    batch_return_wait: float | None = None,
    tensorflow_session_parallelism: int = 0,
    tensorflow_intra_op_parallelism: int = 0,
    tensorflow_inter_op_parallelism: int = 0,
    access_log: bool = False,
    loader_foreground_bytes: int = LOADER_FOREGROUND_BYTES,
) -> None:
    """Check what can be checked of :meth:`ServerConfig.from_flags`'s flags without TensorFlow.

    Takes the same arguments as ``from_flags``, which calls it first. Left
    for later: the batching policy's ranges (:func:`batching_policy`, which the
    command runs with the policy of ``lifecycle._core``, free of TensorFlow
    too), importing ``--model_factory`` functions, and whether version
    directories hold versions that load.

    Raises:
        ValueError: A flag is out of range or does not go with the others;
            the message names the flag.
        FileNotFoundError: A path that a flag names does not exist.
    """
    check_port("--rest_api_port", rest_api_port)
    check_port("--port", port)
    check_count("--grpc_max_threads", grpc_max_threads)
    check_positive("--memory_budget", memory_budget, optional=True)
    check_positive("--max_loaded", max_loaded, optional=True)
    check_positive("--max_request_bytes", max_request_bytes)
    check_positive("--drain_seconds", drain_seconds)
    check_non_negative("--file_system_poll_wait_seconds", file_system_poll_wait_seconds)
    check_bytes("--loader_foreground_bytes", loader_foreground_bytes)
    check_admin(host, admin_api, admin_token if admin_token is not None else env_token())
    check_header(sticky_key_header)
    swap_policy_name(getattr(swap_policy, "value", swap_policy))
    parallelism(
        tensorflow_session_parallelism,
        tensorflow_intra_op_parallelism,
        tensorflow_inter_op_parallelism,
    )
    batching_flags(
        enable_batching,
        batching_parameters_file,
        {
            "max_batch_size": max_batch_size,
            "batch_timeout_micros": batch_timeout_micros,
            "allowed_batch_sizes": allowed_batch_sizes,
            "num_batch_threads": num_batch_threads,
            "max_enqueued_batches": max_enqueued_batches,
        },
    )
    configured = configured_models(model_name, model_base_path, model_config_file)
    if model_repository is not None:
        model_repository = repository_path(model_repository)
    started = startup_models(
        model_repository,
        "none" if model_control_mode is None else model_control_mode,
        load_model,
        REPOSITORY_POLL_SECS if repository_poll_secs is None else repository_poll_secs,
        configured,
    )
    check_routes([parse_route(spec)[0] for spec in route], [*configured, *started])
    factory_names(model_factory, configured)


def configured_models(
    model_name: str | None, model_base_path: str | None, model_config_file: str | None
) -> list[str]:
    """The names of the models of TensorFlow Serving's model flags, the flags checked.

    Raises:
        ValueError: The flags do not go together, or the config file is malformed.
        FileNotFoundError: The config file or a base path does not exist.
    """
    if model_config_file is not None and (model_base_path or model_name):
        raise ValueError(
            "--model_config_file cannot be combined with --model_name/--model_base_path."
        )
    if model_config_file is not None:
        config = read_model_server_config(model_config_file)
        flag = f"--model_config_file {model_config_file!r}"
        return [entry.name for entry, _ in config_entries(config, flag)]
    if model_base_path is not None:
        base_path(model_base_path)
        return [model_name or "default"]
    if model_name is not None:
        raise ValueError("--model_name needs --model_base_path.")
    return []
