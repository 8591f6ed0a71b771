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
import ipaddress
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .._registry import BatchingPolicy, SwapPolicy, VersionPolicy

__all__ = [
    "ADMIN_TOKEN_ENV",
    "ServedModel",
    "ServerConfig",
    "import_factory",
    "read_batching_parameters",
    "served_models",
]

# TensorFlow Serving's own label syntax.
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")

#: Where the admin token is read when ``--admin_token`` is not given: a secret
#: on a command line is visible to every user of the machine (``ps``).
ADMIN_TOKEN_ENV = "LIFECYCLE_ADMIN_TOKEN"

# An HTTP header name (RFC 9110 token characters).
_HEADER_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~"
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): other hosts cannot connect."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve beyond loopback
        return False


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
        for label in self.labels:
            if not label or not set(label) <= _LABEL_CHARS:
                raise ValueError(
                    f"Model {self.name!r}: version label {label!r} must match [a-zA-Z0-9_]+."
                )


def _port(flag: str) -> object:
    def check(_: object, __: object, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            raise ValueError(f"{flag} must be a port number, 0-65535. Received: {value!r}")

    return check


def _positive(flag: str, *, optional: bool = False) -> object:
    def check(_: object, __: object, value: float | None) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{flag} must be a number > 0. Received: {value!r}")

    return check


def _count(flag: str) -> object:
    def check(_: object, __: object, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{flag} must be an integer >= 1. Received: {value!r}")

    return check


def _non_negative(flag: str) -> object:
    def check(_: object, __: object, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{flag} must be a number >= 0. Received: {value!r}")

    return check


def _check_threads(flag: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{flag} must be an integer >= 0. Received: {value!r}")


def _threads(flag: str) -> object:
    def check(_: object, __: object, value: int) -> None:
        _check_threads(flag, value)

    return check


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
        drain_seconds: On SIGTERM/SIGINT, how long requests in flight may take
            to finish, and leases to drain, before the process exits.
        file_system_poll_wait_seconds: How often to look for new versions under
            the base paths (``--file_system_poll_wait_seconds``; every second
            by default, as in TensorFlow Serving); 0: only at start-up and on
            a repository load request.
        loader_nice: The registry's ``loader_nice`` (Linux): loads yield the
            cores to requests. ``None`` elsewhere.
        loader_gil_share: The registry's ``loader_gil_share``.
        freeze_heap: The registry's ``freeze_heap``.
        tune_allocator: Call :func:`lifecycle.tune_allocator` at start-up.
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

    Example:
        >>> from lifecycle.server import ServerConfig
        >>> config = ServerConfig.from_flags(rest_api_port=8601)
        >>> config.host, config.rest_api_port, config.models
        ('127.0.0.1', 8601, ())
    """

    models: tuple[ServedModel, ...] = attrs.field(default=(), converter=tuple)
    rest_api_port: int = attrs.field(default=8501, validator=_port("--rest_api_port"))
    grpc_port: int = attrs.field(default=8500, validator=_port("--port"))
    grpc_max_threads: int = attrs.field(default=16, validator=_count("--grpc_max_threads"))
    host: str = "127.0.0.1"
    memory_budget: int | None = attrs.field(
        default=None, validator=_positive("--memory_budget", optional=True)
    )
    max_loaded: int | None = attrs.field(
        default=None, validator=_positive("--max_loaded", optional=True)
    )
    max_request_bytes: int = attrs.field(
        default=64 * 2**20, validator=_positive("--max_request_bytes")
    )
    drain_seconds: float = attrs.field(default=10.0, validator=_positive("--drain_seconds"))
    file_system_poll_wait_seconds: float = attrs.field(
        default=1.0, validator=_non_negative("--file_system_poll_wait_seconds")
    )
    loader_nice: int | None = 10 if sys.platform.startswith("linux") else None
    loader_gil_share: float = 0.5
    freeze_heap: bool = True
    tune_allocator: bool = True
    admin_api: bool = True
    # Never in repr(): configs get logged.
    admin_token: str | None = attrs.field(default=None, repr=False)
    sticky_key_header: str = "X-Lifecycle-Key"
    swap_policy: SwapPolicy = attrs.field(
        default=SwapPolicy.AVAILABILITY_PRESERVING, converter=lambda p: _swap_policy(p)
    )
    routes: Mapping[str, Mapping[str | int, float]] = attrs.field(
        factory=dict, converter=lambda d: {name: dict(w) for name, w in dict(d).items()}
    )
    batching: BatchingPolicy | None = None
    intra_op_parallelism: int = attrs.field(
        default=0, validator=_threads("--tensorflow_intra_op_parallelism")
    )
    inter_op_parallelism: int = attrs.field(
        default=0, validator=_threads("--tensorflow_inter_op_parallelism")
    )
    access_log: bool = False

    def __attrs_post_init__(self) -> None:
        names = [model.name for model in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"--model_config_file names {twice} more than once.")
        unknown = sorted(set(self.routes) - set(names))
        if unknown:
            raise ValueError(f"--route names models that are not served: {unknown}")
        if self.admin_token is not None and (
            not self.admin_token or not self.admin_token.isprintable() or " " in self.admin_token
        ):
            raise ValueError(
                f"--admin_token (or {ADMIN_TOKEN_ENV}) must be a non-empty string of "
                "printable characters without spaces (it travels as "
                "'Authorization: Bearer <token>')."
            )
        if self.admin_api and self.admin_token is None and not is_loopback(self.host):
            raise ValueError(
                f"--host {self.host!r} accepts other hosts, so the admin API needs a token: "
                f"set --admin_token (or the {ADMIN_TOKEN_ENV} environment variable), or "
                "pass --no_admin_api to serve without the admin API."
            )
        if not self.sticky_key_header or not set(self.sticky_key_header) <= _HEADER_CHARS:
            raise ValueError(
                "--sticky_key_header must be an HTTP header name. "
                f"Received: {self.sticky_key_header!r}"
            )

    @classmethod
    def from_flags(
        cls,
        *,
        rest_api_port: int = 8501,
        port: int = 8500,
        grpc_max_threads: int = 16,
        model_name: str | None = None,
        model_base_path: str | None = None,
        model_config_file: str | None = None,
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
        swap_policy: str | SwapPolicy = SwapPolicy.AVAILABILITY_PRESERVING,
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
    ) -> ServerConfig:
        """A config from TensorFlow Serving-style flags.

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
            ValueError: A flag is out of range, both model flags are given, or
                the config file is malformed; the message names the flag.
            FileNotFoundError: The config file or a base path does not exist.
        """
        if model_config_file is not None and (model_base_path or model_name):
            raise ValueError(
                "--model_config_file cannot be combined with --model_name/--model_base_path."
            )
        models: tuple[ServedModel, ...] = ()
        if model_config_file is not None:
            models = read_model_config(model_config_file)
        elif model_base_path is not None:
            models = (ServedModel(model_name or "default", _base_path(model_base_path)),)
        elif model_name is not None:
            raise ValueError("--model_name needs --model_base_path.")
        models = _with_factories(models, model_factory)
        return cls(
            models=models,
            rest_api_port=rest_api_port,
            grpc_port=port,
            grpc_max_threads=grpc_max_threads,
            host=host,
            memory_budget=memory_budget,
            max_loaded=max_loaded,
            max_request_bytes=max_request_bytes,
            drain_seconds=drain_seconds,
            file_system_poll_wait_seconds=file_system_poll_wait_seconds,
            admin_api=admin_api,
            access_log=access_log,
            admin_token=admin_token if admin_token is not None else _env_token(),
            sticky_key_header=sticky_key_header,
            swap_policy=swap_policy,
            routes=dict(_route(spec) for spec in route),
            batching=_batching(
                enable_batching,
                batching_parameters_file,
                {
                    "max_batch_size": max_batch_size,
                    "batch_timeout_micros": batch_timeout_micros,
                    "allowed_batch_sizes": allowed_batch_sizes,
                    "num_batch_threads": num_batch_threads,
                    "max_enqueued_batches": max_enqueued_batches,
                },
                batch_return_wait,
            ),
            **_parallelism(
                tensorflow_session_parallelism,
                tensorflow_intra_op_parallelism,
                tensorflow_inter_op_parallelism,
            ),
        )


def _batching(
    enabled: bool, path: str | None, flags: dict[str, Any], return_wait: float | None
) -> BatchingPolicy | None:
    """The batching policy of the batching file or flags, or None without ``--enable_batching``.

    ``--batch_return_wait`` (``return_wait``) is not a TensorFlow Serving
    parameter, so it combines with the file as well as with the flags.
    """
    given = {name: value for name, value in flags.items() if value is not None}
    if path is not None and given:
        named = ", ".join(f"--{name}" for name in given)
        raise ValueError(
            f"--batching_parameters_file cannot be combined with {named}: set them in the file."
        )
    if not enabled:
        return None
    wait = {} if return_wait is None else {"return_wait": return_wait}
    allowed = given.get("allowed_batch_sizes", ())
    if isinstance(allowed, str):
        try:
            given["allowed_batch_sizes"] = [int(s) for s in allowed.split(",") if s.strip()]
        except ValueError:
            raise ValueError(
                f"--allowed_batch_sizes takes comma-separated integers. Received: {allowed!r}"
            ) from None
    try:
        if path is not None:
            return attrs.evolve(read_batching_parameters(path), **wait)
        return BatchingPolicy(**given, **wait)
    except ValueError as error:
        message = str(error).replace("`return_wait`", "--batch_return_wait")
        for name in flags:
            message = message.replace(f"`{name}`", f"--{name}")
        raise ValueError(message) from None


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
    parameters = _parse_text(path, flag, _batching_parameters_class()(), f" (fields read: {known})")
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


def _parallelism(session: int, intra: int, inter: int) -> dict[str, int]:
    """The thread counts of TensorFlow Serving's three parallelism flags."""
    _check_threads("--tensorflow_session_parallelism", session)
    if session and intra and inter:
        raise ValueError(
            "Set either --tensorflow_session_parallelism or --tensorflow_intra_op_parallelism"
            " and --tensorflow_inter_op_parallelism, not all three (as TensorFlow Serving)."
        )
    if not (intra or inter):  # as TensorFlow Serving: the two flags win over the one
        intra = inter = session
    return {"intra_op_parallelism": intra, "inter_op_parallelism": inter}


def _swap_policy(value: str | SwapPolicy) -> SwapPolicy:
    if isinstance(value, SwapPolicy):
        return value
    choices = [p.value for p in SwapPolicy]
    if isinstance(value, str) and value.lower() in choices:
        return SwapPolicy(value.lower())
    raise ValueError(f"--swap_policy must be one of {choices}. Received: {value!r}")


def _route(spec: str) -> tuple[str, dict[str | int, float]]:
    """``(model, {target: weight})`` of a ``--route`` value such as ``risk=stable:90,canary:10``."""
    usage = f"--route takes name=target:weight,target:weight... Received: {spec!r}"
    name, sep, targets = spec.partition("=")
    if not sep or not name or not targets:
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


def _with_factories(
    models: tuple[ServedModel, ...], specs: Sequence[str]
) -> tuple[ServedModel, ...]:
    """``models`` with the factories of ``--model_factory`` values, imported now."""
    if not specs:
        return models
    by_name = {model.name: model for model in models}
    for spec in specs:
        name, sep, target = spec.rpartition("=")
        if not sep:
            if len(models) != 1:
                raise ValueError(
                    f"--model_factory {spec!r}: with several models, name the model "
                    "(name=module:function)."
                )
            name = models[0].name
        if name not in by_name:
            raise ValueError(
                f"--model_factory {spec!r}: no served model is named {name!r}. "
                f"Served: {sorted(by_name)}"
            )
        by_name[name] = attrs.evolve(by_name[name], factory=import_factory(target))
    return tuple(by_name[model.name] for model in models)


def import_factory(target: str) -> Callable[[], Any]:
    """The function ``module:function`` names, imported.

    Raises:
        ValueError: ``target`` is malformed, or names nothing callable; the
            message says which.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"--model_factory takes module:function. Received: {target!r}")
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


def _env_token() -> str | None:
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def read_model_config(path: str) -> tuple[ServedModel, ...]:
    """The models of a TensorFlow Serving ``ModelServerConfig`` text file.

    Raises:
        FileNotFoundError: The file or a base path does not exist.
        ValueError: The file does not parse, or asks for what is not supported.
    """
    from tensorflow_serving.config import model_server_config_pb2

    flag = f"--model_config_file {path!r}"
    config = _parse_text(path, flag, model_server_config_pb2.ModelServerConfig())
    return served_models(config, flag)


def _parse_text(path: str, flag: str, message: Any, hint: str = "") -> Any:
    """``message`` filled from the protobuf text file at ``path``; errors name ``flag``."""
    from google.protobuf import text_format

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag} does not exist.") from None
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as error:
        raise ValueError(f"{flag} does not parse: {error}{hint}") from None


def served_models(config: object, source: str) -> tuple[ServedModel, ...]:
    """The models of a TensorFlow Serving ``ModelServerConfig`` message.

    Args:
        config: A ``ModelServerConfig``.
        source: Where it comes from, to begin error messages with.

    Raises:
        FileNotFoundError: A base path does not exist.
        ValueError: The config asks for what is not supported, or names a
            model twice.
    """
    if config.WhichOneof("config") != "model_config_list":  # type: ignore[attr-defined]
        raise ValueError(f"{source} has no model_config_list.")
    models = []
    for entry in config.model_config_list.config:  # type: ignore[attr-defined]
        where = f"{source}, model {entry.name!r}"
        if not entry.name or not entry.base_path:
            raise ValueError(f"{where}: every config needs a name and a base_path.")
        if entry.model_platform not in ("", "tensorflow"):
            raise ValueError(
                f"{where}: model_platform {entry.model_platform!r} is not served; "
                "use 'tensorflow' or leave it out."
            )
        try:
            model = ServedModel(
                entry.name,
                _base_path(entry.base_path, flag=where),
                _policy(entry.model_version_policy),
                dict(entry.version_labels),
            )
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        models.append(model)
    names = [model.name for model in models]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{source} names {twice} more than once.")
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


def _base_path(path: str, *, flag: str = "--model_base_path") -> str:
    if path.startswith(("gs://", "s3://", "hdfs://")):
        raise ValueError(f"{flag}: only local base paths are served. Received: {path!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{flag}: base path {path!r} is not a directory.")
    return os.path.abspath(path)
