"""The flags of ``lifecycle serve``, each declared once.

A :class:`~lifecycle._core._flag.Flag` says everything about one flag: its
name, type, default, help and check. From the one list, :data:`FLAGS`:

* ``lifecycle serve`` makes its command-line options (``lifecycle/cli/_serve.py``,
  which adds the process's ``--allocator``);
* :class:`~lifecycle.server.ServerConfig`'s fields that a flag sets take its
  default and check (:func:`flag_field`), and name it in their metadata, so
  :meth:`ServerConfig.from_flags <lifecycle.server.ServerConfig.from_flags>`
  sets them from it; it and :func:`check_flags` take the flags as keywords
  (:func:`signature`, :func:`with_defaults`);
* docs/serving.md's table of flags is ``docs_table``'s output, which a test
  compares (tests/test_flags.py).

Each rule is checked in one place: what exists only as flags (the model flags
together, the parallelism triple, the batching flags and file, a route's syntax)
in :func:`flag_rules`; what holds between fields (models, repository, routes,
admin token and host) in ``ServerConfig``, with :func:`._rules.check_fields`.
:func:`check_flags` runs both, without TensorFlow: ``lifecycle serve`` checks
its flags first, and refuses a bad one at once.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .._core._batcher import BatchingPolicy
from .._core._checks import check_number
from .._core._flag import Check, Flag, docs_table
from ._batching_file import read_batching_parameters
from ._rules import (
    ADMIN_TOKEN_ENV,
    BATCHING_FLAGS,
    LOADER_FOREGROUND_BYTES,
    REPOSITORY_POLL_SECS,
    base_path,
    batching_flags,
    batching_message,
    batching_policy,
    check_fields,
    check_header,
    config_entries,
    control_mode,
    env_token,
    factory_names,
    parse_route,
    read_model_server_config,
    repository_path,
    swap_policy_name,
)

# Also imported from here: the choices of --swap_policy.
from ._rules import SWAP_POLICIES as SWAP_POLICIES

__all__ = [
    "FLAG",
    "FLAGS",
    "Flag",
    "by_name",
    "check_flags",
    "docs_table",
    "flag_field",
    "flag_rules",
    "poll_secs",
    "signature",
    "validator",
    "with_defaults",
]


def _number(**rule: Any) -> Check:
    return functools.partial(check_number, **rule)


_PORT = _number(integer=True, maximum=65535, what="a port number, 0-65535")
_THREADS = _number(integer=True)

FLAGS: tuple[Flag, ...] = (
    Flag(
        "port",
        int,
        8500,
        "the port of both gRPC APIs (TensorFlow Serving's and KServe v2's); 0: no gRPC server",
        _PORT,
    ),
    Flag("rest_api_port", int, 8501, "the port of both REST protocols", _PORT),
    Flag(
        "grpc_max_threads",
        int,
        16,
        "the gRPC server's worker threads",
        _number(integer=True, minimum=1),
    ),
    Flag(
        "model_name",
        str,
        None,
        "the name of the model at `--model_base_path`",
        shown_default="`default`",
    ),
    Flag(
        "model_base_path",
        str,
        None,
        "`<base>/<version>/` directories, each holding a SavedModel or one `.keras` file",
    ),
    Flag(
        "model_config_file",
        str,
        None,
        "TensorFlow Serving's `ModelServerConfig` in text format: several models, version "
        "policies, version labels",
    ),
    Flag(
        "model_repository",
        str,
        None,
        "a Triton/KServe [model repository](#a-model-repository-triton-and-kserve), "
        "`<repository>/<model>/<version>/`; beside the two flags above, its model names must "
        "differ from theirs (Triton's flag)",
        aliases=("--model-repository",),
    ),
    Flag(
        "model_control_mode",
        str,
        None,
        "Triton's: `none` loads every model of the repository at start-up and refuses "
        "repository `load`/`unload`; `poll` too, and rescans the repository every "
        "`--repository_poll_secs`; `explicit` loads `--load_model` at start-up, then models "
        "by name",
        control_mode,
        shown_default="`none`",
        aliases=("--model-control-mode",),
    ),
    Flag(
        "load_model",
        list,
        (),
        "with `explicit`: a model of the repository loaded at start-up; repeat for several; "
        "`*`: all",
        aliases=("--load-model",),
        metavar="NAME",
    ),
    Flag(
        "repository_poll_secs",
        float,
        None,
        "with `poll`: rescan the repository this often, in seconds",
        _number(optional=True),
        shown_default=f"{REPOSITORY_POLL_SECS:g}",
        aliases=("--repository-poll-secs",),
    ),
    Flag(
        "host",
        str,
        "127.0.0.1",
        "the address to bind; `0.0.0.0` to accept other hosts (the admin API then needs "
        "`--admin_token`)",
    ),
    Flag(
        "memory_budget",
        int,
        None,
        "bytes the loaded versions may hold ([budget](registry.md#budget-and-swap-policies))",
        _number(integer=True, minimum=1, optional=True),
        shown_default="none",
    ),
    Flag(
        "max_loaded",
        int,
        None,
        "versions loaded at once",
        _number(integer=True, minimum=1, optional=True),
        shown_default="none",
    ),
    Flag(
        "max_request_bytes",
        int,
        64 * 2**20,
        "the largest request body, in bytes",
        _number(integer=True, minimum=1),
        shown_default="64 MiB",
    ),
    Flag(
        "max_connections",
        int,
        512,
        "HTTP connections open at once; a request beyond them is answered 503",
        _number(integer=True, minimum=1),
    ),
    Flag(
        "body_read_timeout_seconds",
        float,
        30.0,
        "how long an HTTP request's body may take to arrive; slower: 408, and the connection "
        "closes",
        _number(above=True),
    ),
    Flag(
        "max_queued_requests",
        int,
        256,
        "REST requests, and gRPC calls, waiting for a worker thread (each protocol its own "
        "queue); one beyond is answered at once with 503 / `RESOURCE_EXHAUSTED`",
        _number(integer=True, minimum=1),
    ),
    Flag(
        "max_json_depth",
        int,
        64,
        "how deep a request's JSON may nest (objects and arrays); deeper: 400; at most 254, "
        "the deepest orjson writes back (a v2 answer echoes the request's `id`)",
        _number(integer=True, minimum=1, maximum=254),
    ),
    Flag(
        "max_request_rows",
        int,
        65536,
        "rows (the first dimension of the inputs, or examples) one request may hold; more: "
        "400 (a model's activations grow with its rows, not with the request's bytes)",
        _number(integer=True, minimum=1),
    ),
    Flag(
        "drain_seconds",
        float,
        10.0,
        "on SIGTERM/SIGINT, how long requests in flight may take",
        _number(above=True),
    ),
    Flag(
        "file_system_poll_wait_seconds",
        float,
        1.0,
        "look for new versions this often, in seconds; 0: at start-up and on a repository "
        "`load` only",
        _number(),
    ),
    Flag(
        "admin_token",
        str,
        None,
        "the bearer token of admin calls and repository `load`/`unload`, better set in the "
        f"`{ADMIN_TOKEN_ENV}` environment variable; needed with a `--host` beyond loopback",
        shown_default=f"`${ADMIN_TOKEN_ENV}`",
    ),
    Flag(
        "admin_api",
        bool,
        True,
        "serve without the admin API and repository `load`/`unload`",
        option="--no_admin_api",
        shown_default="",
    ),
    Flag(
        "sticky_key_header",
        str,
        "X-Lifecycle-Key",
        "the request header holding a request's sticky routing key",
        check_header,
    ),
    Flag(
        "access_log",
        bool,
        False,
        "log a line per HTTP request; off as in TensorFlow Serving, which logs none (each line "
        "is written on the event loop, and a console or pipe nobody reads stops the server "
        "once full)",
    ),
    Flag(
        "loader_foreground_bytes",
        int,
        LOADER_FOREGROUND_BYTES,
        "versions of at most this many bytes on disk (a SavedModel's variables, which Keras's "
        "`model.export()` writes twice, so about 20 MiB of weights; a `.keras` archive's "
        "weights; read before the load) load in the foreground, unpaced and at normal "
        "priority, so that a new version of a small model takes traffic within about a second "
        "of its directory appearing; larger ones load in the background "
        "([why](registry.md#a-serving-process-memory-and-latency-across-many-swaps); "
        "[benchmark](benchmarks.md#swap-to-first-response)); 0: every load in the background",
        _number(integer=True),
        shown_default=f"40 MiB ({LOADER_FOREGROUND_BYTES})",
    ),
    Flag(
        "model_factory",
        list,
        (),
        "`[NAME=]module:function` building a model's architecture, for version directories "
        "of [checkpoints](#versions-of-checkpoints); repeat for several models; the current "
        "directory is importable, after the installed packages (a module there cannot shadow "
        "one of theirs); importing runs the module's code as the server",
        metavar="[NAME=]MODULE:FUNCTION",
    ),
    Flag(
        "swap_policy",
        str,
        "availability_preserving",
        "`availability_preserving`: a new version loads before the old one goes; "
        "`resource_preserving`: after, so memory never holds both "
        "([swap policies](registry.md#budget-and-swap-policies))",
        swap_policy_name,
    ),
    Flag(
        "route",
        list,
        (),
        "a weighted route set at start-up, `NAME=TARGET:WEIGHT,TARGET:WEIGHT` (a target is a "
        "label or a version): `--route risk=stable:90,canary:10`; repeat for several models",
        metavar="NAME=TARGET:WEIGHT,...",
    ),
    Flag(
        "enable_batching",
        bool,
        False,
        "merge concurrent requests to a version into one model call "
        "([request batching](registry.md#request-batching); "
        "[benchmark](benchmarks.md#request-batching-benchmarksbatchingpy))",
    ),
    Flag(
        "max_batch_size",
        int,
        None,
        "with batching: the most rows in one call",
        shown_default="32",
    ),
    Flag(
        "batch_timeout_micros",
        int,
        None,
        "with batching: how long a batch that is not full waits for more requests; 0: batches "
        "form only from requests that arrive while others run",
        shown_default="0",
    ),
    Flag(
        "allowed_batch_sizes",
        str,
        None,
        "with batching: comma-separated sizes a batch is padded up to, the last equal to "
        "`--max_batch_size`; empty: no padding",
    ),
    Flag(
        "num_batch_threads",
        int,
        None,
        "with batching: batches of one version that run at once "
        "([why](registry.md#request-batching))",
        shown_default="half the cores, at least 1",
    ),
    Flag(
        "max_enqueued_batches",
        int,
        None,
        "with batching: batches that may wait; a request beyond them is answered at once "
        "with 503 `UNAVAILABLE`",
        shown_default="none",
    ),
    Flag(
        "batching_parameters_file",
        str,
        None,
        "with batching: TensorFlow Serving's `BatchingParameters` in text format, instead of "
        "the five flags above ([below](#batching-parameters-file))",
    ),
    Flag(
        "batch_return_wait",
        float,
        None,
        "with batching, with the five flags or the file: how long a batch that is not full "
        "waits for the callers the previous batch served to send their next request, as a "
        "fraction of that batch's run; 0: never; a lone caller never waits "
        "([adaptive wait](registry.md#request-batching); not a TensorFlow Serving flag)",
        shown_default="1.0",
    ),
    Flag(
        "tensorflow_session_parallelism",
        int,
        0,
        "threads of TensorFlow's intra-op and inter-op pools both, unless the two flags below "
        "are given; 0: TensorFlow's choice",
        _THREADS,
    ),
    Flag(
        "tensorflow_intra_op_parallelism",
        int,
        0,
        "threads one TensorFlow op may use; 0: TensorFlow's choice",
        _THREADS,
    ),
    Flag(
        "tensorflow_inter_op_parallelism",
        int,
        0,
        "TensorFlow ops that may run at once; 0: TensorFlow's choice",
        _THREADS,
    ),
)

_BY_NAME = {flag.name: flag for flag in FLAGS}
#: The key of an attrs field's ``metadata`` that names the flag setting it (:func:`flag_field`).
FLAG = "lifecycle.flag"


def by_name(name: str) -> Flag:
    """The declaration of the flag whose keyword is ``name``.

    Raises:
        KeyError: No flag has that name.
    """
    return _BY_NAME[name]


def _annotation(flag: Flag) -> Any:
    if flag.type is list:
        return Sequence[str]
    return flag.type if flag.default is not None else flag.type | None


def signature(*, first: str | None = None, returns: Any = None) -> inspect.Signature:
    """The signature of a function that takes the server's flags as keywords.

    Args:
        first: The name of a positional parameter before them (``cls``).
        returns: The return annotation.
    """
    kind = inspect.Parameter.KEYWORD_ONLY
    parameters = (
        [] if first is None else [inspect.Parameter(first, inspect.Parameter.POSITIONAL_ONLY)]
    )
    parameters += [
        inspect.Parameter(flag.name, kind, default=flag.default, annotation=_annotation(flag))
        for flag in FLAGS
        if flag.server
    ]
    return inspect.Signature(parameters, return_annotation=returns)


def with_defaults(given: Mapping[str, Any], function: str = "from_flags") -> dict[str, Any]:
    """Every server flag's value: ``given``, else its default.

    Raises:
        TypeError: ``given`` names no flag, as a function given an unknown keyword.
    """
    unknown = sorted(set(given) - {flag.name for flag in FLAGS if flag.server})
    if unknown:
        raise TypeError(f"{function}() got unexpected keyword arguments: {unknown}")
    return {flag.name: given.get(flag.name, flag.default) for flag in FLAGS if flag.server}


def validator(name: str) -> Callable[[Any, Any, Any], None]:
    """An attrs validator that applies flag ``name``'s check to the field it sets."""
    flag = by_name(name)
    assert flag.check is not None, name

    def validate(_: object, attribute: attrs.Attribute, value: object) -> None:
        flag.check(value, flag.flag, field=attribute.name)

    return validate


def flag_field(name: str, **kwargs: Any) -> Any:
    """An attrs field that flag ``name`` sets: its default and its check are the flag's.

    The field's ``metadata[FLAG]`` names the flag, which is how
    ``ServerConfig.from_flags`` knows which flag sets it, and a test that no
    default is written twice.

    Args:
        name: The flag's keyword (``"port"`` for the field ``grpc_port``).
        **kwargs: More of ``attrs.field``'s arguments (``converter``, ``repr``);
            ``validator=None`` where the converter is the check.
    """
    flag = by_name(name)
    kwargs.setdefault("validator", None if flag.check is None else validator(name))
    return attrs.field(default=flag.default, metadata={FLAG: name}, **kwargs)


def poll_secs(value: float | None) -> float:
    """``--repository_poll_secs``, Triton's 15 seconds when not given."""
    return REPOSITORY_POLL_SECS if value is None else value


def flag_rules(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Check what exists only as flags; the ``ServerConfig`` fields they make.

    Each flag's own check (its message shows the flag's value), then the rules of
    flags that only flags have: the model flags together, the three parallelism
    flags, the batching flags and their file, each ``--route``'s syntax. The
    rules of the fields they make are ``ServerConfig``'s (:func:`._rules.check_fields`).

    Args:
        flags: Every server flag's value (:func:`with_defaults`).

    Returns:
        The keywords of ``ServerConfig`` that a flag does not set as given:
        ``admin_token`` (or the environment's), ``model_repository`` (absolute),
        ``routes``, ``batching``, ``intra_op_parallelism`` and
        ``inter_op_parallelism``.

    Raises:
        ValueError: A flag is out of range or does not go with the others.
        FileNotFoundError: The batching parameters file or the repository does not
            exist.
    """
    for flag in FLAGS:
        if flag.server and flag.check is not None:
            flag.check(flags[flag.name], flag.flag)
    if flags["model_config_file"] is not None and (flags["model_base_path"] or flags["model_name"]):
        raise ValueError(
            "--model_config_file cannot be combined with --model_name/--model_base_path."
        )
    if flags["model_name"] is not None and flags["model_base_path"] is None:
        raise ValueError("--model_name needs --model_base_path.")
    session, intra, inter = (
        flags["tensorflow_session_parallelism"],
        flags["tensorflow_intra_op_parallelism"],
        flags["tensorflow_inter_op_parallelism"],
    )
    if session and intra and inter:
        raise ValueError(
            "Set either --tensorflow_session_parallelism or --tensorflow_intra_op_parallelism"
            " and --tensorflow_inter_op_parallelism, not all three (as TensorFlow Serving)."
        )
    if not (intra or inter):  # as TensorFlow Serving: the two flags win over the one
        intra = inter = session
    token, repository = flags["admin_token"], flags["model_repository"]
    return {
        # On a command line a secret is visible to every user of the machine (ps).
        "admin_token": token if token is not None else env_token(),
        # Each model directory too, at start-up only: a model added later that is not a
        # directory of versions fails to load, and says so.
        "model_repository": None if repository is None else repository_path(repository),
        "routes": dict(parse_route(spec) for spec in flags["route"]),
        "batching": _batching(flags),
        "intra_op_parallelism": intra,
        "inter_op_parallelism": inter,
    }


def _batching(flags: Mapping[str, Any]) -> BatchingPolicy | None:
    """The batching policy of the batching file or flags; ``None`` without ``--enable_batching``.

    Without ``--enable_batching`` the file is not read, as in TensorFlow Serving.
    ``--batch_return_wait`` is not a TensorFlow Serving parameter, so it goes
    with the file as well as with the flags.
    """
    path, wait = flags["batching_parameters_file"], flags["batch_return_wait"]
    given = batching_flags(
        flags["enable_batching"], path, {name: flags[name] for name in BATCHING_FLAGS}
    )
    if not flags["enable_batching"]:
        return None
    if path is None:
        return batching_policy(given, wait)
    try:
        policy = read_batching_parameters(path)
        return policy if wait is None else attrs.evolve(policy, return_wait=wait)
    except ValueError as error:
        raise ValueError(batching_message(error)) from None


def check_flags(**given: Any) -> dict[str, Any]:
    """Check the server's flags, without TensorFlow; returns them with the defaults.

    What ``lifecycle serve`` runs before it imports TensorFlow, which takes
    seconds, so that a bad flag is refused at once. Takes the keywords of
    :meth:`ServerConfig.from_flags`, and checks what it checks, with the same
    rules: :func:`flag_rules`, then ``ServerConfig``'s rules of its fields
    (:func:`._rules.check_fields`) on the values the flags give them. Left for
    ``from_flags``: importing ``--model_factory`` functions; for the server:
    whether version directories hold versions that load.

    Raises:
        TypeError: A keyword names no flag.
        ValueError: A flag is out of range or does not go with the others;
            the message names the flag.
        FileNotFoundError: A path that a flag names does not exist.
    """
    flags = with_defaults(given, "check_flags")
    fields = flag_rules(flags)
    # The models' names, as ServerConfig.from_flags reads them (without their policies).
    config_file = flags["model_config_file"]
    models: list[str] = []
    if config_file is not None:
        config = read_model_server_config(config_file)
        entries = config_entries(config, f"--model_config_file {config_file!r}")
        models = [entry.name for entry, _ in entries]
    elif flags["model_base_path"] is not None:
        base_path(flags["model_base_path"])
        models = [flags["model_name"] or "default"]
    factory_names(flags["model_factory"], models)
    check_fields(
        models=models,
        routes=fields["routes"],
        repository=fields["model_repository"],
        mode=flags["model_control_mode"],
        load_models=flags["load_model"],
        poll_secs=poll_secs(flags["repository_poll_secs"]),
        host=flags["host"],
        admin_api=flags["admin_api"],
        admin_token=fields["admin_token"],
    )
    return flags


check_flags.__signature__ = signature(returns="dict[str, Any]")  # type: ignore[attr-defined]
