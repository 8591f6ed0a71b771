"""The rules of the server's flags that need no TensorFlow: values, paths, files, batching.

:mod:`._flags` declares each flag once and checks it with these;
``ServerConfig`` converts its fields with them, and applies the rules between
its fields itself (with :func:`startup_models`, the repository's). This module
imports the library's pure-Python core only, and protobuf for the config files:
``lifecycle serve`` builds its config before it imports TensorFlow, which takes
seconds. Every message names the flag and shows the value received.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs

from .._core._batcher import BatchingPolicy
from .._core._checks import invalid
from .._core._model_dirs import repository_models
from .._core._policies import SwapPolicy

#: Where the admin token is read when ``--admin_token`` is not given: a secret
#: on a command line is visible to every user of the machine (``ps``).
ADMIN_TOKEN_ENV = "LIFECYCLE_ADMIN_TOKEN"
#: The shortest admin token accepted: 16 characters, too many to guess by trying
#: them against the server (``secrets.token_urlsafe(32)`` makes 43).
MIN_ADMIN_TOKEN_LENGTH = 16
# An HTTP header name (RFC 9110 token characters).
_HEADER_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~"
)
#: Triton's model control modes (``--model_control_mode``).
CONTROL_MODES = ("none", "poll", "explicit")
#: Triton's default ``--repository_poll_secs``.
REPOSITORY_POLL_SECS = 15.0
#: The server's ``--loader_foreground_bytes``: versions of at most this many bytes on
#: disk load in the foreground. Keras's ``model.export()`` writes each variable twice,
#: so this is about 20 MiB of weights (docs/benchmarks.md, "Swap to first response").
LOADER_FOREGROUND_BYTES = 40 * 2**20
#: TensorFlow Serving's batching flags, which a ``--batching_parameters_file`` replaces.
BATCHING_FLAGS = (
    "max_batch_size",
    "batch_timeout_micros",
    "allowed_batch_sizes",
    "num_batch_threads",
    "max_enqueued_batches",
)
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


def check_header(value: object, flag: str, field: str | None = None) -> str:
    """An HTTP header name (``--sticky_key_header``)."""
    if not isinstance(value, str) or not value or not set(value) <= _HEADER_CHARS:
        raise invalid(flag, "an HTTP header name", value, field=field)
    return value


def swap_policy(value: object, flag: str = "--swap_policy") -> SwapPolicy:
    """The registry's ``SwapPolicy`` that ``--swap_policy`` (either case) or a policy names."""
    value = getattr(value, "value", value)  # a SwapPolicy
    names = [policy.value for policy in SwapPolicy]
    if isinstance(value, str) and value.lower() in names:
        return SwapPolicy(value.lower())
    raise invalid(flag, f"one of {names}", value)


def control_mode(value: object, flag: str = "--model_control_mode") -> str:
    """The ``--model_control_mode`` value, lower case (Triton accepts either case)."""
    if value is None:  # not given: Triton's default
        return "none"
    if isinstance(value, str) and value.lower() in CONTROL_MODES:
        return value.lower()
    raise invalid(flag, f"one of {list(CONTROL_MODES)} (Triton's modes)", value)


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


def startup_models(
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
    text format, parsed by protobuf itself (from a message class built here from
    its fields, so without TensorFlow), so a file written for TensorFlow
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
    parameters = parse_text(path, flag, _batching_parameters_class()(), f" (fields read: {known})")
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
