"""ServerConfig: everything a server is told at start-up, validated once.

The flags follow TensorFlow Serving's model server where they mean the same
(``--port``, ``--rest_api_port``, ``--grpc_max_threads``, ``--model_name``, ``--model_base_path``,
``--model_config_file``); the others are the registry's. A model config file is
TensorFlow Serving's own ``ModelServerConfig`` in protobuf text format, parsed
with its generated code, so a file written for TensorFlow Serving works as is.

Here is what the config reads and checks when it is built, in the order
:meth:`ServerConfig.from_flags` reads it: the rules between its fields (the
repository's start-up models, the admin token), the directories the flags name,
the batching policy of the flags, the model config file and the
``--model_factory`` functions. Each flag's declaration and its own check are
``_flags``'s; TensorFlow Serving's batching parameters file, and the protobuf
text reader the model config file shares with it, are ``_batching_file``'s.
Every message names the flag and shows the value received.

This module imports no TensorFlow (the registry's policies are the pure-Python
core's): ``lifecycle serve`` builds its config first, so that a bad flag is
refused at once, before TensorFlow takes seconds to start.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from .._core._batcher import BatchingPolicy
from .._core._checks import check_label
from .._core._model_dirs import repository_models
from .._core._policies import SwapPolicy, VersionPolicy
from . import _flags
from ._batching_file import parse_text, read_batching_parameters
from ._flags import FLAG, FLAGS, flag_field, takes_flags

#: The shortest admin token accepted: 16 characters, too many to guess by trying
#: them against the server (``secrets.token_urlsafe(32)`` makes 43).
MIN_ADMIN_TOKEN_LENGTH = 16
#: TensorFlow Serving's batching flags, which a ``--batching_parameters_file`` replaces.
BATCHING_FLAGS = (
    "max_batch_size",
    "batch_timeout_micros",
    "allowed_batch_sizes",
    "num_batch_threads",
    "max_enqueued_batches",
)
_REMOTE = ("gs://", "s3://", "hdfs://")


@attrs.frozen
class ServedModel:
    """A model the server loads at start-up from a base path of version directories.

    Each version is ``<base_path>/<version>/`` holding a SavedModel, one
    ``.keras`` file, or checkpoints (which need ``factory``).

    Attributes:
        name: The model's name in every protocol.
        base_path: The directory of version directories (absolute).
        policy: Which versions to serve; the latest one by default.
        labels: ``{label: version}``, TensorFlow Serving's ``version_labels``.
        factory: Builds the model's architecture, for versions of checkpoints
            (``--model_factory``); ``None``: every version is a SavedModel or
            a ``.keras`` archive.
    """

    name: str
    base_path: str
    policy: VersionPolicy = attrs.field(factory=VersionPolicy.latest)
    labels: Mapping[str, int] = attrs.field(factory=dict, converter=lambda d: dict(d))
    factory: Callable[[], Any] | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        for label in self.labels:  # the library's one label rule
            try:
                check_label(label)
            except ValueError as error:
                raise ValueError(f"Model {self.name!r}: {error}") from None


@attrs.frozen
class ServerConfig:
    """How ``lifecycle serve`` runs: address, models, limits, the registry's settings.

    Build it from flags with :meth:`from_flags`, or directly. Each field is
    checked when it is made, then the rules between them, once, here; the
    messages name the flags.

    Attributes:
        models: The models to load before the server reports ready.
        rest_api_port: The HTTP port of both REST protocols (``--rest_api_port``).
        grpc_port: The port of TensorFlow Serving's gRPC API (``--port``); 0:
            no gRPC server.
        grpc_max_threads: The gRPC server's worker threads (``--grpc_max_threads``).
        host: The address to bind (``--host``); loopback unless told otherwise.
        memory_budget: Bytes the loaded versions may hold (``--memory_budget``).
        max_loaded: Versions loaded at once (``--max_loaded``).
        max_request_bytes: The largest request body accepted (``--max_request_bytes``).
        max_connections: HTTP connections open at once (``--max_connections``);
            a request beyond them is answered 503.
        body_read_timeout_seconds: How long an HTTP request's body may take to
            arrive (``--body_read_timeout_seconds``); slower: 408, and the
            connection closes.
        max_queued_requests: REST requests, and gRPC calls, that may wait for a
            worker thread (``--max_queued_requests``); one beyond is refused
            at once with 503 / ``RESOURCE_EXHAUSTED``.
        max_json_depth: How deep a request's JSON may nest
            (``--max_json_depth``); deeper: 400.
        max_request_rows: Rows (the inputs' first dimension, or examples) one
            request may hold (``--max_request_rows``); more: 400.
        drain_seconds: On SIGTERM/SIGINT, how long requests in flight may take
            to finish, and leases to drain, before the process exits.
        file_system_poll_wait_seconds: How often to look for new versions under
            the base paths (``--file_system_poll_wait_seconds``; every second
            by default, as in TensorFlow Serving); 0: only at start-up and on
            a repository load request.
        loader_nice: The registry's ``loader_nice`` (Linux): loads yield the
            cores to requests. ``None`` elsewhere.
        loader_gil_share: The registry's ``loader_gil_share``.
        loader_foreground_bytes: The registry's ``loader_foreground_bytes``
            (``--loader_foreground_bytes``): versions of at most this many
            bytes load in the foreground, unpaced and at normal priority, so
            that a small model serves well within a second of its directory
            appearing. 40 MiB by default: a SavedModel of Keras's
            ``model.export()`` stores each variable twice, so that is about
            20 MiB of weights. 0: every load in the background.
        freeze_heap: The registry's ``freeze_heap``.
        tune_allocator: Call :func:`lifecycle.tuning.tune_allocator` at start-up,
            unless TensorFlow takes every CPU block from malloc (the ``system``
            allocator choice), where its mmap threshold would slow every step.
        admin_api: Serve the admin API (promote, labels, routes) and KServe's
            repository load/unload (``--no_admin_api`` turns them off).
        admin_token: The bearer token admin calls must carry
            (``--admin_token``, or the ``LIFECYCLE_ADMIN_TOKEN`` environment
            variable). Without one, the admin API is served only when ``host``
            is loopback.
        sticky_key_header: The request header whose value is a request's
            sticky routing key (``--sticky_key_header``).
        swap_policy: The registry's swap policy (``--swap_policy``): whether a
            new version loads before the old one goes (the default) or after.
        routes: ``{model: {target: weight}}``, weighted routes set once the
            models are loaded (``--route``); a target is a label (str) or a
            version (int).
        batching: How concurrent requests to one version are merged
            (``--enable_batching`` with ``--batching_parameters_file`` or
            ``--max_batch_size``, ``--batch_timeout_micros``,
            ``--allowed_batch_sizes``, ``--num_batch_threads``,
            ``--max_enqueued_batches``, and ``--batch_return_wait`` with either);
            ``None``: one model call per request.
        intra_op_parallelism: Threads one TensorFlow op may use
            (``--tensorflow_intra_op_parallelism``); 0: TensorFlow's choice.
            Set when the server starts, before TensorFlow runs an op.
        inter_op_parallelism: Ops TensorFlow may run at once
            (``--tensorflow_inter_op_parallelism``); 0: TensorFlow's choice.
        access_log: Log a line per HTTP request (``--access_log``). Off by
            default, as TensorFlow Serving logs none: each line is written on
            the event loop, and a console or pipe nobody reads stalls the
            server once full.
        model_repository: A Triton/KServe model repository,
            ``<repository>/<model>/<version>/`` (``--model_repository``),
            beside :attr:`models`: each directory is a model, each of its
            version directories a SavedModel or a ``.keras`` file; its latest
            version serves. Names must not collide with :attr:`models`.
        model_control_mode: Triton's ``--model_control_mode``: ``"none"``
            loads every model of the repository at start-up and refuses
            repository loads and unloads of them; ``"poll"`` too, and rescans
            the repository every :attr:`repository_poll_secs`; ``"explicit"``
            loads :attr:`load_models` at start-up, and any model of the
            repository by name through the repository API.
        load_models: With ``"explicit"``: the models loaded at start-up
            (``--load_model``; ``"*"``: all).
        repository_poll_secs: With ``"poll"``: how often the repository is
            scanned (``--repository_poll_secs``; 15 by default, as in Triton).

    Example:
        >>> from lifecycle.server import ServerConfig
        >>> config = ServerConfig.from_flags(rest_api_port=8601)
        >>> config.host, config.rest_api_port, config.models
        ('127.0.0.1', 8601, ())
    """

    models: tuple[ServedModel, ...] = attrs.field(default=(), converter=tuple)
    # A field a flag sets takes the flag's default and check (lifecycle/server/_flags.py).
    rest_api_port: int = flag_field("rest_api_port")
    grpc_port: int = flag_field("port")
    grpc_max_threads: int = flag_field("grpc_max_threads")
    host: str = flag_field("host")
    memory_budget: int | None = flag_field("memory_budget")
    max_loaded: int | None = flag_field("max_loaded")
    max_request_bytes: int = flag_field("max_request_bytes")
    max_connections: int = flag_field("max_connections")
    body_read_timeout_seconds: float = flag_field("body_read_timeout_seconds")
    max_queued_requests: int = flag_field("max_queued_requests")
    max_json_depth: int = flag_field("max_json_depth")
    max_request_rows: int = flag_field("max_request_rows")
    drain_seconds: float = flag_field("drain_seconds")
    file_system_poll_wait_seconds: float = flag_field("file_system_poll_wait_seconds")
    loader_nice: int | None = 10 if sys.platform.startswith("linux") else None
    loader_gil_share: float = 0.5
    loader_foreground_bytes: int = flag_field("loader_foreground_bytes")
    freeze_heap: bool = True
    tune_allocator: bool = True
    admin_api: bool = flag_field("admin_api")
    # Never in repr(): configs get logged.
    admin_token: str | None = flag_field("admin_token", repr=False)
    sticky_key_header: str = flag_field("sticky_key_header")
    # An attrs field, not a default value shared by instances (ruff knows attrs.field only).
    swap_policy: SwapPolicy = flag_field(  # noqa: RUF009
        "swap_policy",
        converter=_flags.swap_policy,
        validator=None,  # the converter checks the name
    )
    # Derived from several flags by `from_flags`.
    routes: Mapping[str, Mapping[str | int, float]] = attrs.field(
        factory=dict, converter=lambda d: {name: dict(w) for name, w in dict(d).items()}
    )
    batching: BatchingPolicy | None = None
    intra_op_parallelism: int = flag_field("tensorflow_intra_op_parallelism")
    inter_op_parallelism: int = flag_field("tensorflow_inter_op_parallelism")
    access_log: bool = flag_field("access_log")

    model_repository: str | None = flag_field(
        "model_repository",
        # The path only: its model directories are checked at start-up (by `from_flags`),
        # as a model added later may be anything until it is loaded.
        converter=lambda p: None if p is None else repository_path(p, models=False),
    )
    # Not given (None): Triton's default, "none".
    model_control_mode: str = flag_field(
        "model_control_mode", converter=_flags.control_mode, validator=None
    )
    load_models: tuple[str, ...] = flag_field("load_model", converter=tuple)
    # Not given (None): Triton's default, 15 seconds.
    repository_poll_secs: float = flag_field(
        "repository_poll_secs",
        converter=lambda secs: _flags.REPOSITORY_POLL_SECS if secs is None else secs,
    )
    # The repository's models to load at start-up: scanned once, when the config is made.
    _startup: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        """The rules between the fields, here once: from flags or built directly."""
        names = [model.name for model in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"--model_config_file names {twice} more than once.")
        started = repository_startup_models(
            self.model_repository,
            self.model_control_mode,
            self.load_models,
            self.repository_poll_secs,
            names,
        )
        object.__setattr__(self, "_startup", started)  # frozen: set once, here
        unknown = sorted(set(self.routes) - {*names, *started})
        if unknown:
            raise ValueError(f"--route names models that are not served: {unknown}")
        token, env = self.admin_token, _flags.ADMIN_TOKEN_ENV
        # The messages never show the token: they are printed and logged.
        if token is not None and (
            not isinstance(token, str) or not token or not token.isprintable() or " " in token
        ):
            raise ValueError(
                f"--admin_token (or {env}) must be a non-empty string of printable characters "
                "without spaces (it travels as 'Authorization: Bearer <token>')."
            )
        if token is not None and len(token) < MIN_ADMIN_TOKEN_LENGTH:
            raise ValueError(
                f"--admin_token (or {env}) must be at least {MIN_ADMIN_TOKEN_LENGTH} "
                f"characters long; this one has {len(token)}. Make one with: "
                'python -c "import secrets; print(secrets.token_urlsafe(32))"'
            )
        if self.admin_api and token is None and not is_loopback(self.host):
            raise ValueError(
                f"--host {self.host!r} accepts other hosts, so the admin API needs a token: "
                f"set --admin_token (or the {env} environment variable), or pass "
                "--no_admin_api to serve without the admin API."
            )

    def startup_models(self) -> tuple[str, ...]:
        """The models of :attr:`model_repository` to load at start-up, as its control mode says.

        The repository was scanned when the config was made, and checked then:
        its models do not collide with :attr:`models`, and it holds every
        model of :attr:`load_models`.
        """
        return self._startup

    @classmethod
    @takes_flags
    def from_flags(cls, flags: dict[str, Any]) -> ServerConfig:
        """A config from TensorFlow Serving-style flags.

        The keywords are the flags of ``lifecycle serve`` without their dashes,
        each declared once in ``lifecycle/server/_flags.py`` with its default and
        check (``inspect.signature(ServerConfig.from_flags)`` lists them). They
        are read in one pass, without TensorFlow: each flag's own check, the
        rules of flags together, the models' files and directories; then the
        ``model_factory`` modules are imported, which runs their code; then the
        config checks the rules between its fields.

        Either ``model_base_path`` (with ``model_name``, default ``"default"``
        as in TensorFlow Serving) or ``model_config_file``, or neither (an
        empty server that models are loaded into through the repository API).
        Without ``admin_token``, the token is read from the
        ``LIFECYCLE_ADMIN_TOKEN`` environment variable, if set.

        ``model_factory`` entries are ``module:function`` (for the model of
        ``model_name``) or ``name=module:function``: the function builds the
        model's architecture, for version directories that hold checkpoints.
        ``route`` entries are ``name=target:weight,target:weight``, a target
        being a label or a version number (``risk=stable:90,canary:10``).
        With ``enable_batching``, concurrent requests to a version are merged
        into calls of at most ``max_batch_size`` rows (32 by default), padded
        up to ``allowed_batch_sizes`` (comma-separated in a flag), as
        TensorFlow Serving's ``--enable_batching`` does; or, instead of the
        batching flags, as ``batching_parameters_file`` says: TensorFlow
        Serving's ``BatchingParameters`` in protobuf text format (see
        :func:`read_batching_parameters`). Without ``enable_batching`` the
        file is not used, as in TensorFlow Serving.
        ``tensorflow_session_parallelism`` sets both thread counts unless
        ``tensorflow_intra_op_parallelism`` or ``tensorflow_inter_op_parallelism``
        is given, which then set one each; all three at once are refused, as
        in TensorFlow Serving.

        Raises:
            TypeError: A keyword names no flag.
            ValueError: A flag is out of range, both model flags are given, the
                config file is malformed, or a ``model_factory`` function cannot
                be imported; the message names the flag.
            FileNotFoundError: The config file or a base path does not exist.
        """
        # 1. Each flag's own check (the message shows the value as given).
        for flag in FLAGS:
            if flag.check is not None:
                flag.check(flags[flag.name], flag.flag)
        # 2. The rules of flags together; the fields made of several flags.
        config_file, base = flags["model_config_file"], flags["model_base_path"]
        name = flags["model_name"]
        if config_file is not None and (base or name):
            raise ValueError(
                "--model_config_file cannot be combined with --model_name/--model_base_path."
            )
        if name is not None and base is None:
            raise ValueError("--model_name needs --model_base_path.")
        session = flags["tensorflow_session_parallelism"]
        intra = flags["tensorflow_intra_op_parallelism"]
        inter = flags["tensorflow_inter_op_parallelism"]
        if session and intra and inter:
            raise ValueError(
                "Set either --tensorflow_session_parallelism or --tensorflow_intra_op_parallelism"
                " and --tensorflow_inter_op_parallelism, not all three (as TensorFlow Serving)."
            )
        if not (intra or inter):  # as TensorFlow Serving: the two flags win over the one
            intra = inter = session
        token, repository = flags["admin_token"], flags["model_repository"]
        if token is None:  # on a command line a secret is visible to every user (ps)
            token = os.environ.get(_flags.ADMIN_TOKEN_ENV) or None
        derived = {
            "admin_token": token,
            # Each model directory too, at start-up only: a model added later that is not a
            # directory of versions fails to load, and says so.
            "model_repository": None if repository is None else repository_path(repository),
            "routes": dict(_flags.parse_route(spec) for spec in flags["route"]),
            "batching": batching(flags),
            "intra_op_parallelism": intra,
            "inter_op_parallelism": inter,
        }
        # 3. The models: the config file's, or the base path's; then their factories,
        #    imported now, so that a bad one is refused before anything loads.
        models: tuple[ServedModel, ...] = ()
        if config_file is not None:
            models = read_model_config(config_file)
        elif base is not None:
            models = (ServedModel(name or "default", base_path(base)),)
        targets = factory_names(flags["model_factory"], [model.name for model in models])
        models = tuple(
            attrs.evolve(model, factory=import_factory(targets[model.name]))
            if model.name in targets
            else model
            for model in models
        )
        # 4. Each field set by the flag its metadata names; the config checks the rules
        #    between the fields, once.
        fields = {
            field.name: flags[field.metadata[FLAG]]
            for field in attrs.fields(cls)
            if FLAG in field.metadata
        }
        return cls(models=models, **(fields | derived))


# -- the rules between the fields -----------------------------------------------------


def repository_startup_models(
    repository: str | None,
    mode: str,
    load_models: Sequence[str],
    poll_secs: float,
    configured: Collection[str],
) -> tuple[str, ...]:
    """The repository's models to load at start-up, as ``--model_control_mode`` says.

    Args:
        repository: ``--model_repository``, or ``None``.
        mode: ``--model_control_mode``, checked.
        load_models: ``--load_model`` values.
        poll_secs: ``--repository_poll_secs``, checked.
        configured: The models of ``--model_base_path`` or ``--model_config_file``.

    Raises:
        ValueError: A flag does not go with the others.
    """
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
    if "*" in load_models and len(load_models) > 1:
        raise ValueError(
            "--load_model '*' loads every model of the repository and cannot be "
            f"combined with other --load_model names. Received: {list(load_models)}"
        )
    if mode != "explicit" or "*" in load_models:  # "*": Triton's name for every model
        return tuple(names)
    unknown = sorted(set(load_models) - set(names))
    if unknown:
        raise ValueError(
            f"--load_model {unknown}: no such model directory in --model_repository "
            f"{repository!r}. Its models: {names}"
        )
    return tuple(dict.fromkeys(load_models))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): other hosts cannot connect."""
    import ipaddress  # here: the command's --help does not need it

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve beyond loopback
        return False


# -- directories ----------------------------------------------------------------------


def _local_directory(path: str, flag: str, what: str, plural: str) -> str:
    """``path`` made absolute, once it names a local directory."""
    if path.startswith(_REMOTE):
        raise ValueError(f"{flag}: only local {plural} are served. Received: {path!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{flag}: {what} {path!r} is not a directory.")
    return os.path.abspath(path)


def _not_a_model(directory: str, what: str, layout: str, versions: str, hint: str = "") -> None:
    """Refuse a directory meant to hold version directories that is a model itself.

    A model itself holds ``saved_model.pb`` or a ``.keras`` file; the message
    shows where that file belongs, under ``versions/1/``.
    """
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if entry.is_file())
    except OSError:
        return
    if "saved_model.pb" in names:
        found, kind = "saved_model.pb", "a SavedModel"
    else:
        found, kind = (
            next((name for name in names if name.endswith(".keras")), None),
            "a .keras file",
        )
    if found is not None:
        raise ValueError(
            f"{what} holds {kind} itself ({found}), but models are served from version "
            f"directories: {layout}{found}, e.g. {os.path.join(versions, '1', found)}{hint}."
        )


def base_path(path: str, flag: str = "--model_base_path") -> str:
    """The absolute base path of version directories that ``path`` names, checked.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        ValueError: ``path`` is remote, or is a model itself (it holds
            ``saved_model.pb`` or a ``.keras`` file, not version directories).
    """
    path = _local_directory(path, flag, "base path", "base paths")
    name, parent = os.path.basename(path), os.path.dirname(path)
    hint = f" ({name!r} looks like a version: pass its parent, {parent})" if name.isdigit() else ""
    _not_a_model(path, f"{flag} {path!r}", "<base_path>/<version>/", path, hint)
    return path


def repository_path(path: str, *, models: bool = True) -> str:
    """The absolute path of a model repository, ``<repository>/<model>/<version>/``, checked.

    With ``models``, each model directory is checked too (at start-up; a model
    added later that is not a directory of versions fails to load, and says so).

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        ValueError: ``path`` is remote, or it or one of its model directories
            is a model itself rather than a directory of versions.
    """
    flag = "--model_repository"
    path = _local_directory(path, flag, "repository", "repositories")
    layout = "<repository>/<model>/<version>/"
    _not_a_model(path, f"{flag} {path!r}", layout, os.path.join(path, "<model>"))
    for name in repository_models(path) if models else ():
        hint = (
            f" (the repository looks like a base path of versions: serve it with "
            f"--model_base_path {path})"
            if name.isdigit()
            else ""
        )
        model = os.path.join(path, name)
        _not_a_model(model, f"{flag} {path!r}: model {name!r}", layout, model, hint)
    return path


# -- batching -------------------------------------------------------------------------


def batching(flags: Mapping[str, Any]) -> BatchingPolicy | None:
    """The batching policy of the batching flags or file; ``None`` without ``--enable_batching``.

    The policy checks its ranges itself, so that the flags and the library have
    one rule; its messages name its fields, turned here into the flags. Without
    ``--enable_batching`` the file is not read, as in TensorFlow Serving.
    ``--batch_return_wait`` is not a TensorFlow Serving parameter, so it goes
    with the file as well as with the flags.

    Raises:
        ValueError: A flag is out of range, or a flag is given with the file.
        FileNotFoundError: The file does not exist.
    """
    path = flags["batching_parameters_file"]
    given = {name: flags[name] for name in BATCHING_FLAGS if flags[name] is not None}
    if path is not None and given:
        named = ", ".join(f"--{name}" for name in given)
        raise ValueError(
            f"--batching_parameters_file cannot be combined with {named}: set them in the file."
        )
    allowed = given.get("allowed_batch_sizes")
    if isinstance(allowed, str):
        try:
            given["allowed_batch_sizes"] = [int(s) for s in allowed.split(",") if s.strip()]
        except ValueError:
            raise ValueError(
                f"--allowed_batch_sizes takes comma-separated integers. Received: {allowed!r}"
            ) from None
    if not flags["enable_batching"]:
        return None
    if flags["batch_return_wait"] is not None:
        given["return_wait"] = flags["batch_return_wait"]
    try:
        if path is None:
            return BatchingPolicy(**given)
        return attrs.evolve(read_batching_parameters(path), **given)
    except ValueError as error:
        message = str(error).replace("`return_wait`", "--batch_return_wait")
        for name in BATCHING_FLAGS:
            message = message.replace(f"`{name}`", f"--{name}")
        raise ValueError(message) from None


# -- the models' files and factories --------------------------------------------------


def read_model_config(path: str) -> tuple[ServedModel, ...]:
    """The models of a TensorFlow Serving ``ModelServerConfig`` text file.

    Raises:
        FileNotFoundError: The file or a base path does not exist.
        ValueError: The file does not parse, or asks for what is not supported.
    """
    from tensorflow_serving.config import model_server_config_pb2  # protobuf only

    source = f"--model_config_file {path!r}"
    config = parse_text(path, source, model_server_config_pb2.ModelServerConfig())
    return served_models(config, source)


def served_models(config: Any, source: str) -> tuple[ServedModel, ...]:
    """The models of a TensorFlow Serving ``ModelServerConfig`` message.

    Args:
        config: A ``ModelServerConfig``.
        source: Where it comes from, to begin error messages with.

    Raises:
        FileNotFoundError: A base path does not exist.
        ValueError: The config asks for what is not supported, names a model
            twice, or gives a base path that is a model itself.
    """
    if config.WhichOneof("config") != "model_config_list":
        raise ValueError(f"{source} has no model_config_list.")
    models = []
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
        policy = entry.model_version_policy
        which = policy.WhichOneof("policy_choice")
        try:
            if which == "all":
                version_policy = VersionPolicy.all()
            elif which == "specific":
                version_policy = VersionPolicy.specific(policy.specific.versions)
            else:  # TensorFlow Serving's default: the latest version
                version_policy = VersionPolicy.latest(policy.latest.num_versions or 1)
            models.append(ServedModel(entry.name, path, version_policy, entry.version_labels))
        except ValueError as error:  # a version policy's, or a label's
            raise ValueError(f"{where}: {error}") from None
    names = [model.name for model in models]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{source} names {twice} more than once.")
    return tuple(models)


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
        _flags.factory_target(target)
        targets[name] = target
    return targets


def import_factory(target: str) -> Callable[[], Any]:
    """The function ``module:function`` names, imported.

    The module is found on ``sys.path`` as it stands: ``lifecycle serve``
    appends the current directory to it, after the installed packages, so a
    file there cannot shadow one of theirs. Importing runs the module's code.

    Raises:
        ValueError: ``target`` is malformed, or names nothing callable; the
            message says which.
    """
    module_name, attribute = _flags.factory_target(target)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"--model_factory {target!r}: cannot import {module_name!r}: {error}"
        ) from None
    function: Any = module
    for part in attribute.split("."):
        function = getattr(function, part, None)
    if not callable(function):
        raise ValueError(
            f"--model_factory {target!r}: {module_name!r} has no function {attribute!r}."
        )
    return function
