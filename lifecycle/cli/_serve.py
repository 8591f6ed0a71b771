"""``lifecycle serve``: the model registry behind TensorFlow Serving's and KServe's APIs.

The flags are TensorFlow Serving's model server's where they mean the same
(``--port``, ``--rest_api_port``, ``--grpc_max_threads``, ``--model_name``, ``--model_base_path``,
``--model_config_file``, ``--enable_batching``, ``--batching_parameters_file``, the
``--tensorflow_*_parallelism`` flags), and Triton's for its model repository
(``--model_repository``, ``--model_control_mode``, ``--load_model``,
``--repository_poll_secs``). The library, TensorFlow and the server's extra are
imported only when the command runs, so ``--help`` answers at once; and the flags
are checked before that (``lifecycle/server/_flags.py``, which imports no
TensorFlow), so a bad one is refused at once too.
"""

# No `from __future__ import annotations`: typer reads the command's annotations
# at run time.
import os
import sys
from types import ModuleType
from typing import Annotated, Any

import typer

from ._allocator import allocator_option, choose_allocator
from ._console import console
from ._quiet import import_library
from ._standalone import PACKAGE, standalone

SERVE_INSTALL = 'pip install "keras-lifecycle[serve]"'


def flag_checks() -> ModuleType:
    """``lifecycle.server._flags``, the server's flag checks, without importing TensorFlow."""
    return standalone("lifecycle.server._flags", PACKAGE / "server" / "_flags.py")


def batching_policy_class() -> type:
    """The registry's ``BatchingPolicy`` (``lifecycle/_core/_batcher.py``), without TensorFlow.

    Its module imports nothing of the library but its exceptions and its
    sibling ``_checks``, both pure Python: they are loaded first.
    """
    standalone("lifecycle.errors", PACKAGE / "errors.py")
    standalone("lifecycle._core._checks", PACKAGE / "_core" / "_checks.py")
    return standalone("lifecycle._core._batcher", PACKAGE / "_core" / "_batcher.py").BatchingPolicy


def refuse(error: Exception) -> typer.Exit:
    """Print ``error`` on one line of stderr, as a usage error; the exit (status 2) to raise."""
    message = " ".join(str(error).split())
    typer.echo(f"lifecycle serve: {message}", err=True)
    return typer.Exit(2)


def serve(
    port: int = typer.Option(
        8500,
        "--port",
        help="Port of both gRPC APIs (TF Serving's and KServe v2's); 0: no gRPC server.",
    ),
    rest_api_port: int = typer.Option(
        8501, "--rest_api_port", help="Port of both REST APIs (TF Serving's and KServe v2)."
    ),
    grpc_max_threads: int = typer.Option(
        16, "--grpc_max_threads", help="Threads of the gRPC server."
    ),
    model_name: str = typer.Option(
        None, "--model_name", help="Name of the model at --model_base_path (default: default)."
    ),
    model_base_path: str = typer.Option(
        None,
        "--model_base_path",
        help="Base path of version directories <base>/<version>/ (SavedModels or .keras files).",
    ),
    model_config_file: str = typer.Option(
        None,
        "--model_config_file",
        help="TensorFlow Serving ModelServerConfig in text format: several models, "
        "version policies, version labels.",
    ),
    model_repository: str = typer.Option(
        None,
        "--model_repository",
        "--model-repository",
        help="Triton/KServe model repository <repository>/<model>/<version>/ (SavedModels "
        "or .keras files); with --model_base_path or --model_config_file, names must differ.",
    ),
    model_control_mode: str = typer.Option(
        None,
        "--model_control_mode",
        "--model-control-mode",
        help="How --model_repository is served, as in Triton. none (default): every model "
        "loaded at start-up, repository load/unload refused; poll: as none, and the "
        "repository rescanned every --repository_poll_secs; explicit: --load_model at "
        "start-up, then any model loaded and unloaded by name.",
    ),
    load_model: Annotated[
        list[str] | None,
        typer.Option(
            "--load_model",
            "--load-model",
            metavar="NAME",
            help="With --model_control_mode explicit: a model loaded at start-up (repeat for "
            "several; '*': all).",
        ),
    ] = None,
    repository_poll_secs: float = typer.Option(
        None,
        "--repository_poll_secs",
        "--repository-poll-secs",
        help="With --model_control_mode poll: rescan the repository this often (default: 15).",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind; 0.0.0.0 to accept other hosts."
    ),
    memory_budget: int = typer.Option(
        None, "--memory_budget", help="Bytes the loaded versions may hold together."
    ),
    max_loaded: int = typer.Option(None, "--max_loaded", help="Versions loaded at once."),
    max_request_bytes: int = typer.Option(
        64 * 2**20, "--max_request_bytes", help="Largest request body accepted."
    ),
    drain_seconds: float = typer.Option(
        10.0, "--drain_seconds", help="On SIGTERM/SIGINT, seconds requests in flight may take."
    ),
    file_system_poll_wait_seconds: float = typer.Option(
        1.0,
        "--file_system_poll_wait_seconds",
        help="Look for new versions under the base paths this often; 0: only at start-up.",
    ),
    model_factory: Annotated[
        list[str] | None,
        typer.Option(
            "--model_factory",
            metavar="[NAME=]MODULE:FUNCTION",
            help="[NAME=]module:function building the model's architecture, for version "
            "directories of checkpoints (repeat for several models). The current "
            "directory is importable.",
        ),
    ] = None,
    swap_policy: str = typer.Option(
        "availability_preserving",
        "--swap_policy",
        help="availability_preserving: a new version loads before the old one goes; "
        "resource_preserving: after (never both in memory).",
    ),
    route: Annotated[
        list[str] | None,
        typer.Option(
            "--route",
            metavar="NAME=TARGET:WEIGHT,...",
            help="Weighted A/B route set at start-up: NAME=TARGET:WEIGHT,TARGET:WEIGHT "
            "(a target is a label or a version; repeat for several models).",
        ),
    ] = None,
    enable_batching: bool = typer.Option(
        False,
        "--enable_batching",
        help="Merge concurrent requests to a version into one model call.",
    ),
    batching_parameters_file: str = typer.Option(
        None,
        "--batching_parameters_file",
        help="With --enable_batching: TensorFlow Serving's BatchingParameters in text format "
        "(max_batch_size, batch_timeout_micros, max_enqueued_batches, num_batch_threads, "
        "allowed_batch_sizes), instead of the batching flags below.",
    ),
    max_batch_size: int = typer.Option(
        None,
        "--max_batch_size",
        help="With --enable_batching: the most rows in one call (default: 32).",
    ),
    batch_timeout_micros: int = typer.Option(
        None,
        "--batch_timeout_micros",
        help="With --enable_batching: how long a batch that is not full waits for more "
        "requests; 0 (the default): batches form only from requests that arrive while one runs.",
    ),
    allowed_batch_sizes: str = typer.Option(
        None,
        "--allowed_batch_sizes",
        help="With --enable_batching: comma-separated sizes a batch is padded up to, the "
        "last equal to --max_batch_size; empty (the default): no padding.",
    ),
    num_batch_threads: int = typer.Option(
        None,
        "--num_batch_threads",
        help="With --enable_batching: batches of one version that run at once "
        "(default: half the cores, at least 1).",
    ),
    max_enqueued_batches: int = typer.Option(
        None,
        "--max_enqueued_batches",
        help="With --enable_batching: batches that may wait; a request beyond them is "
        "answered 503 UNAVAILABLE at once (default: no limit).",
    ),
    batch_return_wait: float = typer.Option(
        None,
        "--batch_return_wait",
        help="With --enable_batching: how long a batch that is not full waits for the "
        "callers the previous batch served to send their next request, as a fraction of "
        "that batch's run; 0: never (default: 1.0). Also with --batching_parameters_file.",
    ),
    tensorflow_session_parallelism: int = typer.Option(
        0,
        "--tensorflow_session_parallelism",
        help="Threads of TensorFlow's intra-op and inter-op pools both, unless the two flags "
        "below are given; 0: TensorFlow's choice.",
    ),
    tensorflow_intra_op_parallelism: int = typer.Option(
        0,
        "--tensorflow_intra_op_parallelism",
        help="Threads one TensorFlow op may use; 0: TensorFlow's choice.",
    ),
    tensorflow_inter_op_parallelism: int = typer.Option(
        0,
        "--tensorflow_inter_op_parallelism",
        help="TensorFlow ops that may run at once; 0: TensorFlow's choice.",
    ),
    admin_token: str = typer.Option(
        None,
        "--admin_token",
        help="Bearer token of the admin API and repository load/unload; better set in "
        "the LIFECYCLE_ADMIN_TOKEN environment variable. Needed with a --host beyond loopback.",
    ),
    no_admin_api: bool = typer.Option(
        False, "--no_admin_api", help="Serve without the admin API and repository load/unload."
    ),
    sticky_key_header: str = typer.Option(
        "X-Lifecycle-Key",
        "--sticky_key_header",
        help="Request header holding the sticky routing key of weighted routes.",
    ),
    access_log: bool = typer.Option(
        False,
        "--access_log",
        help="Log a line per HTTP request (off by default, as in TensorFlow Serving).",
    ),
    loader_foreground_bytes: int = typer.Option(
        40 * 2**20,
        "--loader_foreground_bytes",
        help="Versions of at most this many bytes on disk (a SavedModel's variables, a "
        ".keras archive's weights) load in the foreground, unpaced and at normal priority; "
        "larger ones load in the background. 0: every load in the background.",
    ),
    allocator: str = allocator_option(),
) -> None:
    """Serve models over TensorFlow Serving's REST and gRPC APIs and KServe's v2 protocol.

    The ports open once the models are loaded and warmed up. SIGTERM or SIGINT
    stops accepting, drains requests in flight, unloads every version and exits 0.
    """
    flags: dict[str, Any] = {
        "rest_api_port": rest_api_port,
        "port": port,
        "grpc_max_threads": grpc_max_threads,
        "model_name": model_name,
        "model_base_path": model_base_path,
        "model_config_file": model_config_file,
        "model_repository": model_repository,
        "model_control_mode": model_control_mode,
        "load_model": load_model or (),
        "repository_poll_secs": repository_poll_secs,
        "host": host,
        "memory_budget": memory_budget,
        "max_loaded": max_loaded,
        "max_request_bytes": max_request_bytes,
        "drain_seconds": drain_seconds,
        "file_system_poll_wait_seconds": file_system_poll_wait_seconds,
        "admin_api": not no_admin_api,
        "admin_token": admin_token,
        "sticky_key_header": sticky_key_header,
        "model_factory": model_factory or (),
        "swap_policy": swap_policy,
        "route": route or (),
        "enable_batching": enable_batching,
        "batching_parameters_file": batching_parameters_file,
        "max_batch_size": max_batch_size,
        "batch_timeout_micros": batch_timeout_micros,
        "allowed_batch_sizes": allowed_batch_sizes,
        "num_batch_threads": num_batch_threads,
        "max_enqueued_batches": max_enqueued_batches,
        "batch_return_wait": batch_return_wait,
        "tensorflow_session_parallelism": tensorflow_session_parallelism,
        "tensorflow_intra_op_parallelism": tensorflow_intra_op_parallelism,
        "tensorflow_inter_op_parallelism": tensorflow_inter_op_parallelism,
        "access_log": access_log,
        "loader_foreground_bytes": loader_foreground_bytes,
    }
    try:  # before TensorFlow is imported, which takes seconds
        checks = flag_checks()
        checks.check_flags(**flags)
        if enable_batching and batching_parameters_file is None:
            batching = {name: flags[name] for name in checks.BATCHING_FLAGS}
            given = checks.batching_flags(True, None, batching)
            checks.batching_policy(batching_policy_class(), given, batch_return_wait)
    except (ValueError, FileNotFoundError) as error:
        raise refuse(error) from None
    # Read once, by `import lifecycle` before TensorFlow starts: a serving
    # process gives an unloaded version's memory back (docs/allocator.md).
    choose_allocator(allocator)
    import_library()
    if model_factory and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: factories of the project
    try:
        from lifecycle.server import ServerConfig
        from lifecycle.server import serve as run
    except ImportError as error:
        console().print(
            f"lifecycle serve needs the serve extra: {SERVE_INSTALL} ({error})", markup=False
        )
        raise typer.Exit(2) from None
    try:
        config = ServerConfig.from_flags(**flags)
    except (ValueError, FileNotFoundError) as error:
        raise refuse(error) from None
    run(config)
