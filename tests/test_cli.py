"""The `lifecycle` command line, through typer's test runner."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lifecycle import cli

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def app():
    return cli.build_app()


def test_help_lists_the_commands(app):
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("soak", "inspect", "serve", "version"):
        assert command in result.output


def test_serve_refuses_a_bad_flag_naming_it(app):
    result = runner.invoke(app, ["serve", "--rest_api_port", "70000"])
    assert result.exit_code == 2
    assert "--rest_api_port must be a port number, 0-65535. Received: 70000" in result.output
    result = runner.invoke(app, ["serve", "--model_base_path", "/no/such/models"])
    assert result.exit_code == 2
    assert "'/no/such/models' is not a directory" in result.output


def test_help_names_the_inspect_target_in_capitals(app):
    result = runner.invoke(app, ["inspect", "--help"])
    assert result.exit_code == 0
    assert "inspect [OPTIONS] TARGET [ARGS]..." in result.output
    assert "{target}" not in result.output and "{TARGET}" not in result.output
    assert "│ *    TARGET " in result.output
    result = runner.invoke(app, ["inspect"])
    assert result.exit_code == 2
    assert "inspect [OPTIONS] TARGET [ARGS]..." in result.output
    assert "Missing argument 'TARGET'." in result.output


def test_version_prints_the_installed_versions(app):
    import keras
    import tensorflow as tf

    import lifecycle as lc

    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"keras-lifecycle {lc.__version__}, TensorFlow {tf.__version__}, Keras {keras.__version__}"
    ]


def test_version_runs_the_self_check(app):
    result = runner.invoke(app, ["version", "--check"])
    assert result.exit_code == 0, result.output
    assert "TensorFlow 2." in result.output and "Keras 3." in result.output
    assert "ok  AssignVariableOp releases a buffer" in result.output


@pytest.mark.subprocess
@pytest.mark.slow
def test_soak_prints_the_table_and_writes_a_png(app, tmp_path):
    chart = tmp_path / "soak.png"
    result = runner.invoke(
        app, ["soak", "--cycles", "4", "--units", "64", "--variants", "a,c", "--plot", str(chart)]
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("│ (")]
    assert [row.split("│")[1].strip() for row in rows] == [
        "(a) del model",
        "(c) ManagedModel.dispose()",
    ]
    assert all("FAILED" not in row for row in rows)
    data = chart.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(str(chart))
    assert image.shape[0] > 100 and image.shape[1] > 100


NOISY_WORKER = """
import json, sys
sys.stderr.write("warning line\\n" * 20_000)  # about 260 KiB: more than a pipe holds
print(json.dumps({"rss_mib": 1.0, "seconds": 0.1}), flush=True)
sys.stderr.write("the last words")
sys.exit(3)
"""


def test_a_soak_worker_that_writes_much_to_stderr_neither_hangs_nor_loses_its_error(
    tmp_path, monkeypatch
):
    from lifecycle.cli import _soak

    (tmp_path / "noisy_worker.py").write_text(NOISY_WORKER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(_soak, "WORKER", "noisy_worker")
    seen = []
    results = _soak.run_soak(["a"], 1, 8, 60, lambda variant, sample: seen.append(variant))
    assert seen == ["a"] and results["a"]["rss"] == [1.0]
    error = results["a"]["error"]
    assert error.startswith("exit code 3: ") and error.endswith("the last words"), error[:200]


def fake_soak(rss_per_variant):
    """A stand-in for run_soak that reports the given RSS samples (MiB) at once."""

    def run_soak(variants, cycles, units, timeout, on_cycle):
        return {
            v: {"rss": rss_per_variant[v], "seconds": [0.5] * cycles, "error": None}
            for v in variants
        }

    return run_soak


def test_soak_at_its_minimum_of_3_cycles_fits_all_three(app, monkeypatch):
    from lifecycle.cli import _soak

    monkeypatch.setattr(
        _soak, "run_soak", fake_soak({"a": [600.0, 630.0, 660.0], "c": [600.0, 600.0, 600.5]})
    )
    result = runner.invoke(app, ["soak", "--cycles", "3", "--variants", "a,c"])
    assert result.exit_code == 0, result.output
    assert "after 0 warm-up cycles" in result.output
    rows = {row.split("│")[1].strip(): row for row in result.output.splitlines() if "│ (" in row}
    assert "+30.00" in rows["(a) del model"] and "leaking" in rows["(a) del model"]
    assert "+0.25" in rows["(c) ManagedModel.dispose()"]


def test_soak_fails_a_variant_that_reported_too_few_cycles(app, monkeypatch):
    from lifecycle.cli import _soak

    monkeypatch.setattr(_soak, "run_soak", fake_soak({"c": [600.0, 600.0]}))
    result = runner.invoke(app, ["soak", "--cycles", "3", "--variants", "c"])
    assert result.exit_code == 1
    assert "FAILED" in result.output and "2 of 3 cycles reported" in result.output


@pytest.mark.subprocess
@pytest.mark.slow
def test_soak_runs_its_minimum_of_3_cycles(app):
    result = runner.invoke(app, ["soak", "--cycles", "3", "--units", "32", "--variants", "c"])
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if line.startswith("│ (")]
    assert row.split("│")[1].strip() == "(c) ManagedModel.dispose()"
    assert row.split("│")[4].strip() in ("flat", "leaking")


def refuse_to_soak(variants, cycles, units, timeout, on_cycle):
    raise AssertionError("the soak ran before its arguments were checked")


def test_soak_checks_the_plot_directory_before_it_starts(app, monkeypatch, tmp_path):
    from lifecycle.cli import _soak

    monkeypatch.setattr(_soak, "run_soak", refuse_to_soak)
    monkeypatch.chdir(tmp_path)  # short paths: the error box does not wrap them
    result = runner.invoke(app, ["soak", "--plot", "no/such/soak.png"])
    assert result.exit_code == 2
    assert "Invalid value for '--plot': no such directory: no/such" in result.output
    assert "Traceback" not in result.output and "Soak:" not in result.output
    (tmp_path / "charts").mkdir()
    result = runner.invoke(app, ["soak", "--plot", "charts"])
    assert result.exit_code == 2
    assert "Invalid value for '--plot': charts is a directory, not a file" in result.output


def test_soak_rejects_unknown_variants(app):
    result = runner.invoke(app, ["soak", "--variants", "a,z"])
    assert result.exit_code != 0 and "unknown variants" in result.output


CLEAN = """
import keras, lifecycle as lc
inputs = keras.Input((4,))
with lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name="inspected") as model:
    pass
print("script ran")
"""

LEAKY = """
import keras, lifecycle as lc
inputs = keras.Input((4,))
KEPT = [lc.ManagedModel(inputs, keras.layers.Dense(2)(inputs), name="kept_forever")]
KEPT[0].dispose()
"""


def test_inspect_runs_a_script_and_reports(app, tmp_path):
    script = tmp_path / "clean.py"
    script.write_text(CLEAN)
    result = runner.invoke(app, ["inspect", str(script)])
    assert "script ran" in result.output
    assert "models managed / disposed / cleaned up" in result.output
    assert "process RSS" in result.output


def test_inspect_names_the_holder_of_a_leak(app, tmp_path):
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    result = runner.invoke(app, ["inspect", str(script)])
    assert result.exit_code == 1
    assert "module leaky → .KEPT → list[0] → ManagedModel 'kept_forever' (disposed)" in (
        result.output
    )


def test_inspect_prints_each_reference_chain_on_one_line(app, tmp_path):
    holder = "MODELS_KEPT_BY_A_LONG_LIVED_REGISTRY_OF_EVERY_EXPERIMENT_RUN_SO_FAR"
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY.replace("KEPT", holder))
    result = runner.invoke(app, ["inspect", str(script)])
    line = f"  [model] module leaky → .{holder} → list[0] → ManagedModel 'kept_forever' (disposed)"
    assert len(line) > 120  # wider than the console when output is not a terminal
    assert line in result.output.splitlines()


def test_inspect_a_missing_file(app):
    result = runner.invoke(app, ["inspect", "no/such/file.py"])
    assert result.exit_code != 0 and "no such file" in result.output


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_here", "no such module: no_such_module_here"),
        ("no_such_package.sub", "no such module: no_such_package.sub"),
        ("json", "json is a package with no __main__; name one of its modules"),
    ],
)
def test_inspect_a_module_that_cannot_run(app, target, message):
    result = runner.invoke(app, ["inspect", "-m", target])
    assert result.exit_code == 2
    assert f"Invalid value: {message}" in result.output
    assert "Traceback" not in result.output and "statistics" not in result.output


def test_inspect_runs_a_module(app, tmp_path, monkeypatch):
    (tmp_path / "inspected_module.py").write_text(CLEAN)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = runner.invoke(app, ["inspect", "-m", "inspected_module"])
    assert "script ran" in result.output
    # The script's global `model` still holds the (disposed) model.
    assert "module inspected_module → .model → ManagedModel 'inspected'" in result.output


def test_missing_extras_print_the_pip_install(monkeypatch, capsys, app):
    monkeypatch.setitem(sys.modules, "typer", None)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    assert 'pip install "keras-lifecycle[cli]"' in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = runner.invoke(app, ["soak", "--plot", "x.png"])
    assert result.exit_code != 0
    assert 'pip install "keras-lifecycle[plot]"' in result.output


def test_a_failed_self_check_prints_the_error_and_exits_1(app, monkeypatch):
    import lifecycle as lc

    def moved():
        raise lc.CompatibilityError("the internal check 'X' failed")

    monkeypatch.setattr(lc.introspection, "check_compatibility", moved)
    result = runner.invoke(app, ["version", "--check"])
    assert result.exit_code == 1
    assert "self-check failed: the internal check 'X' failed" in result.output
    assert "Traceback" not in result.output


# Runs the command the way its console script does (`lifecycle = "lifecycle.cli:main"`),
# then names the heavy packages it imported.
AS_INSTALLED = """
import sys
from lifecycle.cli import main
sys.argv[0] = "lifecycle"
try:
    main()
finally:
    heavy = ("tensorflow", "keras", "grpc", "uvicorn", "lifecycle.server._app")
    print("imported:", [m for m in heavy if m in sys.modules])
"""


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "args", [["--help"], ["version"], ["inspect", "--help"], ["serve", "--help"]]
)
def test_help_and_version_do_not_import_tensorflow(args):
    result = subprocess.run(
        [sys.executable, "-c", AS_INSTALLED, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: lifecycle" in result.stdout or "keras-lifecycle " in result.stdout
    assert result.stdout.splitlines()[-1] == "imported: []"
    assert result.stderr == ""


# TensorFlow as a script would meet it: imported, then its devices listed.
RAW_TENSORFLOW = """
import tensorflow as tf
print(tf.test.is_built_with_cuda())
tf.config.list_physical_devices()
"""


@pytest.mark.subprocess
@pytest.mark.slow  # other command children stay in the fast lane
def test_the_command_hides_tensorflows_startup_notices_and_keeps_its_errors():
    from lifecycle.cli._quiet import gpu_present

    # Fresh interpreters: TensorFlow prints its notices only when first imported.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    raw = subprocess.run(
        [sys.executable, "-c", RAW_TENSORFLOW],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert raw.returncode == 0, raw.stderr
    # The noise is there without the filter...
    assert "oneDNN custom operations" in raw.stderr
    assert "absl::InitializeLog" in raw.stderr
    no_gpu_noise = raw.stdout.strip() == "True" and not gpu_present()
    if no_gpu_noise:  # a CUDA build on a host without a GPU, as on CPU-only CI
        assert "failed call to cuInit" in raw.stderr
    result = subprocess.run(
        [sys.executable, "-m", "lifecycle.cli", "version", "--check"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env=env,
    )
    # ...and gone with it.
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("keras-lifecycle ")
    assert "ok  AssignVariableOp releases a buffer" in result.stdout
    assert "oneDNN custom operations" not in result.stderr
    assert "absl::InitializeLog" not in result.stderr
    assert not re.search(r"^I\d{4} ", result.stderr, re.MULTILINE), result.stderr
    if no_gpu_noise:
        assert "cuInit" not in result.stderr, result.stderr


def test_the_notice_filter_keeps_warnings_errors_and_other_output():
    from lifecycle.cli._quiet import _NOTICE

    dropped = [
        "I0000 00:00:1796287763.806807   22228 port.cc:153] oneDNN custom operations are on.",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild "
        "TensorFlow with the appropriate compiler flags.",
    ]
    kept = [
        "W0000 00:00:1796287763.806807   22228 some.cc:1] a warning",
        "E0000 00:00:1796287765.1   22228 cuda_platform.cc:52] failed call to cuInit",
        "Traceback (most recent call last):",
        "I like this line",
    ]
    assert all(_NOTICE.match(line) for line in dropped)
    assert not any(_NOTICE.match(line) for line in kept)


CUINIT = (
    "E0000 00:00:1796308099.331893    6726 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"
)


def test_the_noise_filter_drops_cuda_registration_and_cuinit_without_a_gpu():
    from lifecycle.cli._quiet import is_noise

    always = [
        "E0000 00:00:1751448150.986970   10148 cuda_dnn.cc:8579] Unable to register cuDNN "
        "factory: Attempting to register factory for plugin cuDNN when one has already been "
        "registered",
        "E0000 00:00:1751448150.991431   10148 cuda_blas.cc:1407] Unable to register cuBLAS "
        "factory: Attempting to register factory for plugin cuBLAS when one has already been "
        "registered",
        "2025-07-02 09:22:30.972636: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:"
        "467] Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT "
        "when one has already been registered",
        "W0000 00:00:1751448151.003754   10148 computation_placer.cc:177] computation placer "
        "already registered. Please check linkage and avoid linking the same target more than "
        "once.",
        "2025-02-09 09:37:32.343117: I tensorflow/core/platform/cpu_feature_guard.cc:182] This "
        "TensorFlow binary is optimized to use available CPU instructions.",
    ]
    real = [
        "E0000 00:00:1796308099.3 6726 cuda_dnn.cc:1] Could not create cudnn handle: "
        "CUDNN_STATUS_INTERNAL_ERROR",
        "W0000 00:00:1796308099.3 6726 bfc_allocator.cc:1] Allocator ran out of memory",
        "2025-07-02 09:22:30.972636: E tensorflow/core/a.cc:1] Could not load dynamic library "
        "'libcudnn.so.9'",
        "Unable to register cuDNN factory: not a TensorFlow log line",
    ]
    for gpu in (False, True):
        assert all(is_noise(line, gpu=gpu) for line in always), gpu
        assert not any(is_noise(line, gpu=gpu) for line in real), gpu
    assert is_noise(CUINIT, gpu=False)
    assert not is_noise(CUINIT, gpu=True)  # with a GPU, a failed cuInit is a broken driver


@pytest.mark.parametrize("gpu", [False, True])
def test_filtered_stderr_writes_back_all_but_the_noise(monkeypatch, capfd, gpu):
    from lifecycle.cli import _quiet

    monkeypatch.setattr(_quiet, "gpu_present", lambda: gpu)
    noise = "I0000 00:00:1796287763.806807   22228 port.cc:153] oneDNN custom operations are on."
    real = "W0000 00:00:1796287763.806807   22228 some.cc:1] a real warning"
    with _quiet.filtered_stderr():
        os.write(2, f"{noise}\n{CUINIT}\n{real}\n".encode())
    err = capfd.readouterr().err
    assert err.splitlines() == [*([CUINIT] if gpu else []), real]


# Flags `lifecycle serve` refuses before it imports TensorFlow; {tmp} is a
# directory of the test's (see test_serve_refuses_bad_flags_at_once_without_tensorflow).
BAD_SERVE_FLAGS = [
    (["--rest_api_port", "70000"], "--rest_api_port must be a port number, 0-65535"),
    (["--port", "-1"], "--port must be a port number"),
    (["--grpc_max_threads", "0"], "--grpc_max_threads must be an integer >= 1"),
    (["--drain_seconds", "0"], "--drain_seconds must be a number > 0"),
    (["--host", "0.0.0.0"], "--host '0.0.0.0' accepts other hosts, so the admin API needs a token"),
    (["--admin_token", "two words"], "--admin_token (or LIFECYCLE_ADMIN_TOKEN) must be"),
    (["--sticky_key_header", "a key"], "--sticky_key_header must be an HTTP header name"),
    (["--swap_policy", "fast"], "--swap_policy must be one of"),
    (["--route", "risk"], "--route takes name=target:weight"),
    (["--model_name", "risk"], "--model_name needs --model_base_path"),
    (
        ["--model_base_path", "{tmp}/base", "--model_config_file", "{tmp}/models.config"],
        "--model_config_file cannot be combined with --model_name/--model_base_path",
    ),
    (["--model_base_path", "{tmp}/missing"], "base path '{tmp}/missing' is not a directory"),
    (["--model_base_path", "{tmp}/models.config"], "is not a directory"),
    (
        ["--model_base_path", "{tmp}/saved"],
        "<base_path>/<version>/saved_model.pb, e.g. {tmp}/saved/1/saved_model.pb",
    ),
    (["--model_base_path", "{tmp}/keras"], "<base_path>/<version>/model.keras"),
    (["--model_config_file", "{tmp}/missing.config"], "--model_config_file '{tmp}/missing."),
    (["--model_config_file", "{tmp}/saved.config"], "e.g. {tmp}/saved/1/saved_model.pb"),
    (["--model_base_path", "{tmp}/base", "--route", "other=1:1"], "--route names models that"),
    (["--model_control_mode", "poll"], "--model_control_mode and --load_model need --model_"),
    (["--model_repository", "{tmp}/missing"], "repository '{tmp}/missing' is not a directory"),
    (["--model_repository", "{tmp}/base"], "<repository>/<model>/<version>/saved_model.pb"),
    (
        ["--model_repository", "{tmp}/repo", "--model_control_mode", "lazy"],
        "--model_control_mode must",
    ),
    (
        [
            *("--model_repository", "{tmp}/repo"),
            *("--model_control_mode", "explicit", "--load_model", "nope"),
        ],
        "--load_model ['nope']: no such model directory",
    ),
    (["--enable_batching", "--batching_parameters_file", "{tmp}/no"], "does not exist"),
    # The batching policy's own ranges, checked by the policy of lifecycle._core.
    (["--enable_batching", "--max_batch_size", "0"], "--max_batch_size must be an integer >= 1"),
    (["--enable_batching", "--batch_return_wait", "-1"], "--batch_return_wait must be a finite"),
    (
        ["--enable_batching", "--max_batch_size", "8", "--allowed_batch_sizes", "8,4"],
        "--allowed_batch_sizes must be strictly ascending",
    ),
    (["--loader_foreground_bytes", "-1"], "--loader_foreground_bytes must be an integer >= 0"),
]


@pytest.fixture(scope="module")
def bad_serve_dirs(tmp_path_factory):
    """Directories for BAD_SERVE_FLAGS: made by hand, as TensorFlow is not needed to tell."""
    tmp = tmp_path_factory.mktemp("serve-flags")
    (tmp / "base" / "1").mkdir(parents=True)  # a version directory: a base path
    (tmp / "base" / "1" / "saved_model.pb").write_bytes(b"")
    (tmp / "saved" / "variables").mkdir(parents=True)  # a SavedModel, not a base path
    (tmp / "saved" / "saved_model.pb").write_bytes(b"")
    (tmp / "keras").mkdir()
    (tmp / "keras" / "model.keras").write_bytes(b"")
    (tmp / "repo" / "risk" / "1").mkdir(parents=True)
    (tmp / "models.config").write_text(
        f'model_config_list {{ config {{ name: "m" base_path: "{tmp}/base" }} }}'
    )
    (tmp / "saved.config").write_text(
        f'model_config_list {{ config {{ name: "m" base_path: "{tmp}/saved" }} }}'
    )
    return tmp


@pytest.mark.subprocess
@pytest.mark.parametrize(("flags", "fragment"), BAD_SERVE_FLAGS)
def test_serve_refuses_bad_flags_at_once_without_tensorflow(flags, fragment, bad_serve_dirs):
    """Exit 2 and one line naming the flag, before TensorFlow is imported (seconds)."""
    tmp = str(bad_serve_dirs)
    args = [flag.replace("{tmp}", tmp) for flag in flags]
    env = {k: v for k, v in os.environ.items() if k != "LIFECYCLE_ADMIN_TOKEN"}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", AS_INSTALLED, "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    took = time.perf_counter() - started
    print(f"lifecycle serve {' '.join(flags)}: exit {result.returncode} after {took:.2f} s")
    assert result.returncode == 2, result.stderr
    assert result.stdout.splitlines()[-1] == "imported: []"
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("lifecycle serve: ")
    assert fragment.replace("{tmp}", tmp) in lines[0]
    # Well under a second on an idle machine; the bound leaves room for a loaded CI.
    assert took < 3, f"{took:.2f} s"


# -- --allocator ---------------------------------------------------------------------------


def test_allocator_flag_wins_then_the_users_variable_then_system():
    import typer

    from lifecycle.cli._allocator import choose_allocator

    environ = {"LIFECYCLE_ALLOCATOR": "no-onednn"}
    assert choose_allocator("tensorflow", environ) == "tensorflow" == environ["LIFECYCLE_ALLOCATOR"]
    environ = {"LIFECYCLE_ALLOCATOR": "no-onednn"}
    assert choose_allocator(None, environ) == "no-onednn"
    environ = {}
    assert choose_allocator(None, environ) == "system" == environ["LIFECYCLE_ALLOCATOR"]
    with pytest.raises(typer.BadParameter, match="one of tensorflow, system, no-onednn"):
        choose_allocator("pool", {})
    with pytest.raises(typer.BadParameter, match="got 'jemalloc'"):
        choose_allocator(None, {"LIFECYCLE_ALLOCATOR": "jemalloc"})


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("variable", "flag", "applied"),
    [(None, None, "system"), ("no-onednn", "system", "system"), ("tensorflow", None, "tensorflow")],
)
def test_the_commands_choice_takes_effect_after_import_lifecycle_ran(variable, flag, applied):
    """The command runs inside the package, so ``import lifecycle`` read the variable first."""
    code = f"""
import os, sys
import lifecycle as lc
from lifecycle.cli._allocator import choose_allocator
choose_allocator({flag!r})
assert "tensorflow" not in sys.modules
choice = lc.tuning.allocator_choice()
print(choice.name, choice.applied, os.environ.get("TF_ONEDNN_USE_SYSTEM_ALLOCATOR"),
      os.environ.get("TF_ENABLE_ONEDNN_OPTS"))
"""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TF_", "MALLOC_", "GLIBC_", "LIFECYCLE_"))
    }
    if variable is not None:
        environ["LIFECYCLE_ALLOCATOR"] = variable
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=60
    )
    assert result.returncode == 0, result.stderr
    name, done, system, onednn = result.stdout.split()
    assert (name, done) == (applied, "True")
    assert system == ("1" if applied == "system" else "None")
    assert onednn == "None"  # a variable the first choice set is not kept as the user's


def test_serve_and_soak_offer_the_allocator_and_refuse_an_unknown_one(app):
    for command in ("serve", "soak"):
        result = runner.invoke(app, [command, "--help"], terminal_width=200)
        assert "--allocator" in result.output, command
    result = runner.invoke(app, ["soak", "--allocator", "pool"])
    assert result.exit_code == 2
    words = " ".join(result.output.replace("│", " ").split())  # rich's box, wrapped
    assert "allocator must be one of tensorflow, system, no-onednn; got 'pool'" in words


# -- the package's own entry point ----------------------------------------------------------


def test_the_console_script_runs_the_packages_main():
    from importlib import metadata

    (script,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "lifecycle"]
    assert script.value == "lifecycle.cli:main"
    assert not (ROOT / "lifecycle_cli.py").exists()


def test_the_commands_do_not_import_the_application():
    """One way: `_app` registers the commands; no command module imports `_app`."""
    import ast

    importers = {}
    for path in sorted((ROOT / "lifecycle" / "cli").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        }
        importers[path.stem] = imported
    assert {name for name, imported in importers.items() if "_app" in imported} == {
        "__init__",
        "__main__",
    }
    assert {"_serve", "_soak", "_inspect", "_version"} <= importers["_app"]


@pytest.mark.subprocess
def test_the_installed_command_answers_help_without_importing_tensorflow():
    """What a user types; the import log shows what ``--help`` loads (no timing)."""
    from support.servers import LIFECYCLE

    result = subprocess.run(
        [LIFECYCLE, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout and "soak" in result.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}
    assert "lifecycle.cli" in imported  # the log is there
    heavy = {"tensorflow", "keras", "numpy", "grpc", "uvicorn"} & imported
    assert not heavy, heavy


@pytest.mark.subprocess
def test_python_m_lifecycle_cli_is_the_command():
    result = subprocess.run(
        [sys.executable, "-m", "lifecycle.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout and "soak" in result.stdout


WITHOUT_SERVE_EXTRA = """
import sys
sys.modules["uvicorn"] = None  # as if the serve extra were not installed
from lifecycle.cli import main
sys.argv[0] = "lifecycle"
main()
"""


@pytest.mark.subprocess
def test_without_the_serve_extra_help_works_and_serve_names_the_install():
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", WITHOUT_SERVE_EXTRA, *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )

    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout
    result = run("serve", "--port", "0")
    assert result.returncode == 2, result.stderr
    assert 'needs the serve extra: pip install "keras-lifecycle[serve]"' in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
