"""The flags of ``lifecycle serve``, each declared once.

:class:`Flags` declares them, a field per flag: its name, type (the annotation),
default, help and check. From it, :data:`FLAGS` (a
:class:`~lifecycle._core._flag.Flag` per field):

* ``lifecycle serve`` makes its command-line options (``lifecycle/cli/_serve.py``,
  which adds the process's ``--allocator``);
* :class:`~lifecycle.server.ServerConfig`'s fields that a flag sets take its
  default and check (:func:`flag_field`), and name it in their metadata;
  :meth:`ServerConfig.from_flags <lifecycle.server.ServerConfig.from_flags>`
  takes the flags as keywords (:func:`takes_flags`), and reads them in one pass;
* docs/serving.md's table of flags is ``docs_table``'s output, which a test
  compares (tests/test_flags.py).

What concerns one flag's value alone is here too: the checks and parsers of a
single flag (:func:`check_header`, :func:`swap_policy`, :func:`control_mode`,
:func:`parse_route`, :func:`factory_target`) and the facts its declaration shows
(:data:`ADMIN_TOKEN_ENV`, :data:`REPOSITORY_POLL_SECS`...). The rules between
flags, and what they name on disk, are the config's (``_config``), which imports
this module. Like the config, this module imports no TensorFlow: ``lifecycle
serve`` builds its config first, and refuses a bad flag at once.
"""

import functools
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._core._checks import check_number, invalid
from .._core._flag import Check, Flag
from .._core._policies import SwapPolicy

#: The key of a :class:`Flags` field's ``metadata`` that holds the rest of its declaration.
_DECLARED = "lifecycle.declared"


def _flag(default: Any, help: str, check: Check | None = None, **shown: Any) -> Any:
    """A field of :class:`Flags`: its default, help and check, and how the command shows it.

    ``shown`` holds :class:`~lifecycle._core._flag.Flag`'s ``shown_default``,
    ``option``, ``aliases`` or ``metavar``.
    """
    return attrs.field(default=default, metadata={_DECLARED: dict(help=help, check=check, **shown)})


def _number(**rule: Any) -> Check:
    return functools.partial(check_number, **rule)


_PORT = _number(integer=True, maximum=65535, what="a port number, 0-65535")
_THREADS = _number(integer=True)


# -- one flag's value -----------------------------------------------------------------

#: Where the admin token is read when ``--admin_token`` is not given: a secret
#: on a command line is visible to every user of the machine (``ps``).
ADMIN_TOKEN_ENV = "LIFECYCLE_ADMIN_TOKEN"
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


# -- the flags ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Flags:
    """The flags of ``lifecycle serve``, as keywords: each field one flag.

    A field's name is the flag's (``--<name>``), its annotation the flag's type,
    and :func:`_flag` gives its default, its help (Markdown: the docs' table shows
    it as is, ``--help`` without links and backticks), its check and how the
    command shows it (:class:`~lifecycle._core._flag.Flag`).
    """

    port: int = _flag(
        8500,
        "the port of both gRPC APIs (TensorFlow Serving's and KServe v2's); 0: no gRPC server",
        _PORT,
    )
    rest_api_port: int = _flag(8501, "the port of both REST protocols", _PORT)
    grpc_max_threads: int = _flag(
        16, "the gRPC server's worker threads", _number(integer=True, minimum=1)
    )
    model_name: str | None = _flag(
        None, "the name of the model at `--model_base_path`", shown_default="`default`"
    )
    model_base_path: str | None = _flag(
        None, "`<base>/<version>/` directories, each holding a SavedModel or one `.keras` file"
    )
    model_config_file: str | None = _flag(
        None,
        "TensorFlow Serving's `ModelServerConfig` in text format: several models, version "
        "policies, version labels",
    )
    model_repository: str | None = _flag(
        None,
        "a Triton/KServe [model repository](#a-model-repository-triton-and-kserve), "
        "`<repository>/<model>/<version>/`; beside the two flags above, its model names must "
        "differ from theirs (Triton's flag)",
        aliases=("--model-repository",),
    )
    model_control_mode: str | None = _flag(
        None,
        "Triton's: `none` loads every model of the repository at start-up and refuses "
        "repository `load`/`unload`; `poll` too, and rescans the repository every "
        "`--repository_poll_secs`; `explicit` loads `--load_model` at start-up, then models "
        "by name",
        control_mode,
        shown_default="`none`",
        aliases=("--model-control-mode",),
    )
    load_model: Sequence[str] = _flag(
        (),
        "with `explicit`: a model of the repository loaded at start-up; repeat for several; "
        "`*`: all",
        aliases=("--load-model",),
        metavar="NAME",
    )
    repository_poll_secs: float | None = _flag(
        None,
        "with `poll`: rescan the repository this often, in seconds",
        _number(optional=True),
        shown_default=f"{REPOSITORY_POLL_SECS:g}",
        aliases=("--repository-poll-secs",),
    )
    host: str = _flag(
        "127.0.0.1",
        "the address to bind; `0.0.0.0` to accept other hosts (the admin API then needs "
        "`--admin_token`)",
    )
    memory_budget: int | None = _flag(
        None,
        "bytes the loaded versions may hold ([budget](registry.md#budget-and-swap-policies))",
        _number(integer=True, minimum=1, optional=True),
        shown_default="none",
    )
    max_loaded: int | None = _flag(
        None,
        "versions loaded at once",
        _number(integer=True, minimum=1, optional=True),
        shown_default="none",
    )
    max_request_bytes: int = _flag(
        64 * 2**20,
        "the largest request body, in bytes",
        _number(integer=True, minimum=1),
        shown_default="64 MiB",
    )
    max_connections: int = _flag(
        512,
        "HTTP connections open at once; a request beyond them is answered 503",
        _number(integer=True, minimum=1),
    )
    body_read_timeout_seconds: float = _flag(
        30.0,
        "how long an HTTP request's body may take to arrive; slower: 408, and the connection "
        "closes",
        _number(above=True),
    )
    max_queued_requests: int = _flag(
        256,
        "REST requests, and gRPC calls, waiting for a worker thread (each protocol its own "
        "queue); one beyond is answered at once with 503 / `RESOURCE_EXHAUSTED`",
        _number(integer=True, minimum=1),
    )
    max_json_depth: int = _flag(
        64,
        "how deep a request's JSON may nest (objects and arrays); deeper: 400; at most 254, "
        "the deepest orjson writes back (a v2 answer echoes the request's `id`)",
        _number(integer=True, minimum=1, maximum=254),
    )
    max_request_rows: int = _flag(
        65536,
        "rows (the first dimension of the inputs, or examples) one request may hold; more: "
        "400 (a model's activations grow with its rows, not with the request's bytes)",
        _number(integer=True, minimum=1),
    )
    drain_seconds: float = _flag(
        10.0, "on SIGTERM/SIGINT, how long requests in flight may take", _number(above=True)
    )
    file_system_poll_wait_seconds: float = _flag(
        1.0,
        "look for new versions this often, in seconds; 0: at start-up and on a repository "
        "`load` only",
        _number(),
    )
    admin_token: str | None = _flag(
        None,
        "the bearer token of admin calls and repository `load`/`unload`, better set in the "
        f"`{ADMIN_TOKEN_ENV}` environment variable; needed with a `--host` beyond loopback",
        shown_default=f"`${ADMIN_TOKEN_ENV}`",
    )
    admin_api: bool = _flag(
        True,
        "serve without the admin API and repository `load`/`unload`",
        option="--no_admin_api",
        shown_default="",
    )
    sticky_key_header: str = _flag(
        "X-Lifecycle-Key",
        "the request header holding a request's sticky routing key",
        check_header,
    )
    access_log: bool = _flag(
        False,
        "log a line per HTTP request; off as in TensorFlow Serving, which logs none (each line "
        "is written on the event loop, and a console or pipe nobody reads stops the server "
        "once full)",
    )
    loader_foreground_bytes: int = _flag(
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
    )
    model_factory: Sequence[str] = _flag(
        (),
        "`[NAME=]module:function` building a model's architecture, for version directories "
        "of [checkpoints](#versions-of-checkpoints); repeat for several models; the current "
        "directory is importable, after the installed packages (a module there cannot shadow "
        "one of theirs); importing runs the module's code as the server",
        metavar="[NAME=]MODULE:FUNCTION",
    )
    swap_policy: str = _flag(
        "availability_preserving",
        "`availability_preserving`: a new version loads before the old one goes; "
        "`resource_preserving`: after, so memory never holds both "
        "([swap policies](registry.md#budget-and-swap-policies))",
        swap_policy,
    )
    route: Sequence[str] = _flag(
        (),
        "a weighted route set at start-up, `NAME=TARGET:WEIGHT,TARGET:WEIGHT` (a target is a "
        "label or a version): `--route risk=stable:90,canary:10`; repeat for several models",
        metavar="NAME=TARGET:WEIGHT,...",
    )
    enable_batching: bool = _flag(
        False,
        "merge concurrent requests to a version into one model call "
        "([request batching](registry.md#request-batching); "
        "[benchmark](benchmarks.md#request-batching-benchmarksbatchingpy))",
    )
    max_batch_size: int | None = _flag(
        None, "with batching: the most rows in one call", shown_default="32"
    )
    batch_timeout_micros: int | None = _flag(
        None,
        "with batching: how long a batch that is not full waits for more requests; 0: batches "
        "form only from requests that arrive while others run",
        shown_default="0",
    )
    allowed_batch_sizes: str | None = _flag(
        None,
        "with batching: comma-separated sizes a batch is padded up to, the last equal to "
        "`--max_batch_size`; empty: no padding",
    )
    num_batch_threads: int | None = _flag(
        None,
        "with batching: batches of one version that run at once "
        "([why](registry.md#request-batching))",
        shown_default="half the cores, at least 1",
    )
    max_enqueued_batches: int | None = _flag(
        None,
        "with batching: batches that may wait; a request beyond them is answered at once "
        "with 503 `UNAVAILABLE`",
        shown_default="none",
    )
    batching_parameters_file: str | None = _flag(
        None,
        "with batching: TensorFlow Serving's `BatchingParameters` in text format, instead of "
        "the five flags above ([below](#batching-parameters-file))",
    )
    batch_return_wait: float | None = _flag(
        None,
        "with batching, with the five flags or the file: how long a batch that is not full "
        "waits for the callers the previous batch served to send their next request, as a "
        "fraction of that batch's run; 0: never; a lone caller never waits "
        "([adaptive wait](registry.md#request-batching); not a TensorFlow Serving flag)",
        shown_default="1.0",
    )
    tensorflow_session_parallelism: int = _flag(
        0,
        "threads of TensorFlow's intra-op and inter-op pools both, unless the two flags below "
        "are given; 0: TensorFlow's choice",
        _THREADS,
    )
    tensorflow_intra_op_parallelism: int = _flag(
        0, "threads one TensorFlow op may use; 0: TensorFlow's choice", _THREADS
    )
    tensorflow_inter_op_parallelism: int = _flag(
        0, "TensorFlow ops that may run at once; 0: TensorFlow's choice", _THREADS
    )


def _type(annotation: Any) -> type:
    """A flag's type, of its annotation: ``int`` of ``int | None``; ``list`` of ``Sequence[str]``.

    (``list``: a flag that is repeated.)
    """
    if typing.get_origin(annotation) is Sequence:
        return list
    return typing.get_args(annotation)[0] if isinstance(annotation, types.UnionType) else annotation


#: Every flag, in the order of the command's ``--help`` and of the docs' table.
FLAGS: tuple[Flag, ...] = tuple(
    Flag(field.name, _type(field.type), field.default, **field.metadata[_DECLARED])
    for field in attrs.fields(Flags)
)

_BY_NAME = {flag.name: flag for flag in FLAGS}
#: The key of an attrs field's ``metadata`` that names the flag setting it (:func:`flag_field`).
FLAG = "lifecycle.flag"


def flag_field(name: str, **kwargs: Any) -> Any:
    """An attrs field that flag ``name`` sets: its default and its check are the flag's.

    The field's ``metadata[FLAG]`` names the flag, which is how
    ``ServerConfig.from_flags`` knows which flag sets it, and a test that no
    default is written twice. The check's message names the flag and the field.

    Args:
        name: The flag's keyword (``"port"`` for the field ``grpc_port``).
        **kwargs: More of ``attrs.field``'s arguments (``converter``, ``repr``);
            ``validator=None`` where the converter is the check.
    """
    flag = _BY_NAME[name]

    def validate(_: object, attribute: attrs.Attribute, value: object) -> None:
        flag.check(value, flag.flag, field=attribute.name)  # type: ignore[misc]

    kwargs.setdefault("validator", None if flag.check is None else validate)
    return attrs.field(default=flag.default, metadata={FLAG: name}, **kwargs)


def takes_flags(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function(..., flags)`` called with the flags as keywords, each defaulting to its own.

    Its signature lists them, as :class:`Flags` does (for ``help()`` and
    ``inspect``); a keyword that names no flag is a ``TypeError``, as for any
    function.
    """
    signature = inspect.signature(function)
    positional = list(signature.parameters.values())[:-1]

    @functools.wraps(function)
    def call(*args: Any, **given: Any) -> Any:
        unknown = sorted(set(given) - set(attrs.fields_dict(Flags)))
        if unknown:
            raise TypeError(f"{function.__name__}() got unexpected keyword arguments: {unknown}")
        return function(*args, attrs.asdict(Flags(**given), recurse=False))

    keywords = inspect.signature(Flags).parameters.values()
    call.__signature__ = signature.replace(parameters=[*positional, *keywords])  # type: ignore[attr-defined]
    return call
