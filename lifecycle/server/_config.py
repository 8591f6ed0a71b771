"""ServerConfig: everything a server is told at start-up, validated once.

The flags follow TensorFlow Serving's model server where they mean the same
(``--port``, ``--rest_api_port``, ``--grpc_max_threads``, ``--model_name``, ``--model_base_path``,
``--model_config_file``); the others are the registry's. A model config file is
TensorFlow Serving's own ``ModelServerConfig`` in protobuf text format, parsed
with its generated code, so a file written for TensorFlow Serving works as is.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .._registry import BatchingPolicy, SwapPolicy, VersionPolicy
from . import _flags, _rules
from ._flags import validator
from ._rules import ADMIN_TOKEN_ENV, REPOSITORY_POLL_SECS, is_loopback

__all__ = [
    "ADMIN_TOKEN_ENV",
    "ServedModel",
    "ServerConfig",
    "import_factory",
    "is_loopback",
    "read_batching_parameters",
    "served_models",
]


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
        _rules.check_labels(self.name, self.labels)


@attrs.frozen
class ServerConfig:
    """How ``lifecycle serve`` runs: address, models, limits, the registry's settings.

    Build it from flags with :meth:`from_flags`, or directly. Fields are checked
    once, here, with messages naming the flag.

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
    rest_api_port: int = attrs.field(default=8501, validator=validator("rest_api_port"))
    grpc_port: int = attrs.field(default=8500, validator=validator("port"))
    grpc_max_threads: int = attrs.field(default=16, validator=validator("grpc_max_threads"))
    host: str = "127.0.0.1"
    memory_budget: int | None = attrs.field(default=None, validator=validator("memory_budget"))
    max_loaded: int | None = attrs.field(default=None, validator=validator("max_loaded"))
    max_request_bytes: int = attrs.field(
        default=64 * 2**20, validator=validator("max_request_bytes")
    )
    max_connections: int = attrs.field(default=512, validator=validator("max_connections"))
    body_read_timeout_seconds: float = attrs.field(
        default=30.0, validator=validator("body_read_timeout_seconds")
    )
    max_queued_requests: int = attrs.field(default=256, validator=validator("max_queued_requests"))
    max_json_depth: int = attrs.field(default=64, validator=validator("max_json_depth"))
    max_request_rows: int = attrs.field(default=65536, validator=validator("max_request_rows"))
    drain_seconds: float = attrs.field(default=10.0, validator=validator("drain_seconds"))
    file_system_poll_wait_seconds: float = attrs.field(
        default=1.0, validator=validator("file_system_poll_wait_seconds")
    )
    loader_nice: int | None = 10 if sys.platform.startswith("linux") else None
    loader_gil_share: float = 0.5
    loader_foreground_bytes: int = attrs.field(
        default=_rules.LOADER_FOREGROUND_BYTES,
        validator=validator("loader_foreground_bytes"),
    )
    freeze_heap: bool = True
    tune_allocator: bool = True
    admin_api: bool = True
    # Never in repr(): configs get logged.
    admin_token: str | None = attrs.field(default=None, repr=False)
    sticky_key_header: str = attrs.field(
        default="X-Lifecycle-Key", validator=validator("sticky_key_header")
    )
    swap_policy: SwapPolicy = attrs.field(
        default=SwapPolicy.AVAILABILITY_PRESERVING,
        converter=lambda p: (
            p if isinstance(p, SwapPolicy) else SwapPolicy(_rules.swap_policy_name(p))
        ),
    )
    routes: Mapping[str, Mapping[str | int, float]] = attrs.field(
        factory=dict, converter=lambda d: {name: dict(w) for name, w in dict(d).items()}
    )
    batching: BatchingPolicy | None = None
    intra_op_parallelism: int = attrs.field(
        default=0, validator=validator("tensorflow_intra_op_parallelism")
    )
    inter_op_parallelism: int = attrs.field(
        default=0, validator=validator("tensorflow_inter_op_parallelism")
    )
    access_log: bool = False

    model_repository: str | None = attrs.field(
        default=None,
        converter=lambda p: None if p is None else _rules.repository_path(p, models=False),
    )
    model_control_mode: str = attrs.field(default="none", converter=_rules.control_mode)
    load_models: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    repository_poll_secs: float = attrs.field(
        default=REPOSITORY_POLL_SECS,
        validator=validator("repository_poll_secs"),
    )

    def __attrs_post_init__(self) -> None:
        names = [model.name for model in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"--model_config_file names {twice} more than once.")
        started = self.startup_models()
        _rules.check_routes(self.routes, [*names, *started])
        _rules.check_admin(self.host, self.admin_api, self.admin_token)

    def startup_models(self) -> tuple[str, ...]:
        """The models of :attr:`model_repository` to load at start-up, as its control mode says.

        Raises:
            ValueError: The repository's models collide with :attr:`models`, or
                :attr:`load_models` names a model it does not hold.
        """
        return _rules.startup_models(
            self.model_repository,
            self.model_control_mode,
            self.load_models,
            self.repository_poll_secs,
            [model.name for model in self.models],
        )

    @classmethod
    def from_flags(cls, **flags: Any) -> ServerConfig:
        """A config from TensorFlow Serving-style flags.

        The keywords are the flags of ``lifecycle serve`` without their dashes,
        each declared once in ``lifecycle/server/_flags.py`` with its default and
        check (``inspect.signature(ServerConfig.from_flags)`` lists them).

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
            ValueError: A flag is out of range, both model flags are given, or
                the config file is malformed; the message names the flag.
            FileNotFoundError: The config file or a base path does not exist.
        """
        flags = _flags.with_defaults(flags)
        _flags.check_flags(**flags)  # what needs no TensorFlow, as the command checks first
        models: tuple[ServedModel, ...] = ()
        if flags["model_config_file"] is not None:
            models = read_model_config(flags["model_config_file"])
        elif flags["model_base_path"] is not None:
            base = _rules.base_path(flags["model_base_path"])
            models = (ServedModel(flags["model_name"] or "default", base),)
        models = _with_factories(models, flags["model_factory"])
        # Flags named as a field set it as given; the others are derived here.
        fields = attrs.fields_dict(cls)
        settings = {name: value for name, value in flags.items() if name in fields}
        token, poll_secs = flags["admin_token"], flags["repository_poll_secs"]
        settings.update(
            admin_token=token if token is not None else _rules.env_token(),
            repository_poll_secs=REPOSITORY_POLL_SECS if poll_secs is None else poll_secs,
        )
        return cls(
            models=models,
            grpc_port=flags["port"],
            load_models=flags["load_model"],
            routes=dict(_rules.parse_route(spec) for spec in flags["route"]),
            batching=_batching(
                flags["enable_batching"],
                flags["batching_parameters_file"],
                {name: flags[name] for name in _rules.BATCHING_FLAGS},
                flags["batch_return_wait"],
            ),
            **_rules.parallelism(
                flags["tensorflow_session_parallelism"],
                flags["tensorflow_intra_op_parallelism"],
                flags["tensorflow_inter_op_parallelism"],
            ),
            **settings,
        )


# The keywords of `from_flags`, for help() and inspect: one per flag of lifecycle/server/_flags.py.
ServerConfig.from_flags.__func__.__signature__ = _flags.signature(  # type: ignore[attr-defined]
    first="cls", returns="ServerConfig"
)


def _batching(
    enabled: bool, path: str | None, flags: dict[str, Any], return_wait: float | None
) -> BatchingPolicy | None:
    """The batching policy of the batching file or flags, or None without ``--enable_batching``.

    ``--batch_return_wait`` (``return_wait``) is not a TensorFlow Serving
    parameter, so it combines with the file as well as with the flags.
    """
    given = _rules.batching_flags(enabled, path, flags)
    if not enabled:
        return None
    if path is None:
        return _rules.batching_policy(given, return_wait)
    wait = {} if return_wait is None else {"return_wait": return_wait}
    try:
        return attrs.evolve(read_batching_parameters(path), **wait)
    except ValueError as error:
        raise ValueError(_rules.batching_message(error)) from None


# TensorFlow Serving's BatchingParameters (servables/tensorflow/session_bundle_config.proto),
# which its Python package does not ship: (number, name, type, wrapper, repeated).
_BATCHING_FIELDS = (
    (1, "max_batch_size", "TYPE_MESSAGE", "Int64Value", False),
    (2, "batch_timeout_micros", "TYPE_MESSAGE", "Int64Value", False),
    (3, "max_enqueued_batches", "TYPE_MESSAGE", "Int64Value", False),
    (4, "num_batch_threads", "TYPE_MESSAGE", "Int64Value", False),
    (5, "thread_pool_name", "TYPE_MESSAGE", "StringValue", False),
    (6, "allowed_batch_sizes", "TYPE_INT64", None, True),
    (7, "pad_variable_length_inputs", "TYPE_BOOL", None, False),
)
# TensorFlow Serving's defaults for the fields a file leaves out (BasicBatchScheduler::Options).
_BATCHING_DEFAULTS = {"max_batch_size": 1000, "batch_timeout_micros": 0, "max_enqueued_batches": 10}


@functools.cache
def _batching_parameters_class() -> Any:
    """The message class of ``tensorflow.serving.BatchingParameters``, built from its fields."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="lifecycle/batching_parameters.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    message = proto.message_type.add(name="BatchingParameters")
    field = descriptor_pb2.FieldDescriptorProto
    for number, name, kind, wrapper, repeated in _BATCHING_FIELDS:
        message.field.add(
            name=name,
            number=number,
            type=getattr(field, kind),
            label=field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL,
            type_name=f".google.protobuf.{wrapper}" if wrapper else None,
        )
    pool.Add(proto)
    descriptor = pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    return message_factory.GetMessageClass(descriptor)


def read_batching_parameters(path: str) -> BatchingPolicy:
    """The batching policy of a TensorFlow Serving ``--batching_parameters_file``.

    The file is TensorFlow Serving's ``BatchingParameters`` message in protobuf
    text format, parsed by protobuf itself, so a file written for TensorFlow
    Serving works as is::

        max_batch_size { value: 32 }
        batch_timeout_micros { value: 1000 }
        max_enqueued_batches { value: 100 }
        num_batch_threads { value: 2 }
        allowed_batch_sizes: [8, 16, 32]

    Fields left out take TensorFlow Serving's defaults: ``max_batch_size``
    1000, ``batch_timeout_micros`` 0, ``max_enqueued_batches`` 10 and
    ``num_batch_threads`` :class:`~lifecycle.BatchingPolicy`'s default.
    ``thread_pool_name`` is accepted and has no effect (the callers run the
    batches; there is no pool to name).

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file does not parse, a value is out of range, or it
            asks for ``pad_variable_length_inputs`` (requests of different
            shapes are batched apart, never padded to each other).
    """
    flag = f"--batching_parameters_file {path!r}"
    known = ", ".join(name for _, name, *_ in _BATCHING_FIELDS)
    parameters = _rules.parse_text(
        path, flag, _batching_parameters_class()(), f" (fields read: {known})"
    )
    if parameters.pad_variable_length_inputs:
        raise ValueError(
            f"{flag} asks for pad_variable_length_inputs, which lifecycle serve does not "
            "do: requests whose inputs differ in shape beyond the batch dimension go in "
            "separate batches. Leave it out or set it to false."
        )
    values: dict[str, Any] = dict(_BATCHING_DEFAULTS)
    for _, name, _, wrapper, _ in _BATCHING_FIELDS:
        if wrapper == "Int64Value" and parameters.HasField(name):
            values[name] = getattr(parameters, name).value
    values["allowed_batch_sizes"] = tuple(parameters.allowed_batch_sizes)
    try:
        return BatchingPolicy(**values)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}".replace("`", "")) from None


def _with_factories(
    models: tuple[ServedModel, ...], specs: Sequence[str]
) -> tuple[ServedModel, ...]:
    """``models`` with the factories of ``--model_factory`` values, imported now."""
    targets = _rules.factory_names(specs, [model.name for model in models])
    return tuple(
        attrs.evolve(model, factory=import_factory(targets[model.name]))
        if model.name in targets
        else model
        for model in models
    )


def import_factory(target: str) -> Callable[[], Any]:
    """The function ``module:function`` names, imported.

    The module is found on ``sys.path`` as it stands: ``lifecycle serve``
    appends the current directory to it, after the installed packages, so a
    file there cannot shadow one of theirs. Importing runs the module's code.

    Raises:
        ValueError: ``target`` is malformed, or names nothing callable; the
            message says which.
    """
    module_name, attribute = _rules.factory_target(target)
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


def read_model_config(path: str) -> tuple[ServedModel, ...]:
    """The models of a TensorFlow Serving ``ModelServerConfig`` text file.

    Raises:
        FileNotFoundError: The file or a base path does not exist.
        ValueError: The file does not parse, or asks for what is not supported.
    """
    config = _rules.read_model_server_config(path)
    return served_models(config, f"--model_config_file {path!r}")


def served_models(config: object, source: str) -> tuple[ServedModel, ...]:
    """The models of a TensorFlow Serving ``ModelServerConfig`` message.

    Args:
        config: A ``ModelServerConfig``.
        source: Where it comes from, to begin error messages with.

    Raises:
        FileNotFoundError: A base path does not exist.
        ValueError: The config asks for what is not supported, names a model
            twice, or gives a base path that is a model itself.
    """
    models = []
    for entry, path in _rules.config_entries(config, source):
        try:
            policy = _policy(entry.model_version_policy)
        except ValueError as error:
            raise ValueError(f"{source}, model {entry.name!r}: {error}") from None
        models.append(ServedModel(entry.name, path, policy, dict(entry.version_labels)))
    return tuple(models)


def _policy(policy: object) -> VersionPolicy:
    """A :class:`VersionPolicy` from TensorFlow Serving's ``ServableVersionPolicy``."""
    which = policy.WhichOneof("policy_choice")  # type: ignore[attr-defined]
    if which == "all":
        return VersionPolicy.all()
    if which == "specific":
        return VersionPolicy.specific(policy.specific.versions)  # type: ignore[attr-defined]
    if which == "latest" and policy.latest.num_versions:  # type: ignore[attr-defined]
        return VersionPolicy.latest(policy.latest.num_versions)  # type: ignore[attr-defined]
    return VersionPolicy.latest()
