"""Every example runs to completion and prints what it promises."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

import lifecycle as lc

ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "training_loop.py": "fold 2: val loss",
    "serving.py": "clients were refused after dispose",
    "manage_existing.py": "calling it now raises DisposedError",
    "sessions.py": "session closed, heap trims 1",
    "hot_swap_serving.py": "failed: 0",
    "ab_loading.py": "each request read by its own version's input name: True",
    "parameter_server_lifecycle.py": "PS growth per generation",
    "daily_incremental_training.py": "RSS growth per generation",
    "monitoring.py": "module app.debug → .LAST_MODELS → list[0]",
    "serve_checkpointed_versions.py": "still serving v2: 2.0",
    "serving_http.py": "after loading version 3: [[3.0, 3.0]]",
    "serving_triton_client.py": "echo unloaded and loaded again: ready True",
    "sweep_keras_tuner.py": "left live",
    "sweep_sklearn.py": "after the search:",
    "memory_back_to_the_system.py": "LIFECYCLE_ALLOCATOR=system: CPU allocator",
    "sweep_architectures.py": "MobileNetV2: 26 MiB released; RSS ",
    "request_batching.py": "requests per batch",
    "ray_serve_multiplexed.py": "failed requests: 0",
    "ray_tune_sweep.py": "models live between trials: 0;",
    "custom_training_loop.py": "tf.Module and its optimizer disposed: 408 bytes; calling it raises",
    "sweep_optuna.py": "in a session: TensorFlow holds",
}
# Arguments that keep an example short; the defaults show the full effect.
ARGS = {
    "monitoring.py": ["--cycles", "5"],
    "sweep_keras_tuner.py": ["--trials", "3"],
    "custom_training_loop.py": ["--days", "3"],
    # One architecture: the line checked is MobileNetV2's.
    "sweep_architectures.py": ["--archs", "MobileNetV2", "--side", "32"],
}
# Examples that a test of their own runs and whose numbers it checks (the line
# in EXPECTED included): test_example_runs leaves them to it rather than
# starting the same child process again for a weaker check.
RUN_BY = {
    "daily_incremental_training.py": (
        "tests/test_examples.py::test_daily_training_memory_is_flat_over_twenty_generations"
    ),
    "parameter_server_lifecycle.py": (
        "tests/distributed/test_parameter_server.py"
        "::test_example_ps_memory_is_flat_with_dispose_and_grows_without"
    ),
    # Each starts a Ray of its own; run by the Ray module, whose other tests need Ray anyway.
    "ray_serve_multiplexed.py": (
        "tests/test_integrations_ray_serve.py"
        "::test_the_example_serves_and_disposes_every_evicted_model"
    ),
    "ray_tune_sweep.py": (
        "tests/test_integrations_ray_tune.py::test_example_disposes_every_trial_before_the_next"
    ),
    "sweep_optuna.py": (
        "tests/test_integrations_optuna.py"
        "::test_a_study_inside_a_session_is_flat_where_the_plain_study_grows"
    ),
}


def line_matching(pattern: str, out: str) -> re.Match[str]:
    """The match of ``pattern`` on one line of ``out``; fails the test if no line matches."""
    found = re.search(pattern, out, re.MULTILINE)
    assert found, f"no line matches {pattern!r} in:\n{out}"
    return found


def every_answer_was_right_and_requests_were_merged(out: str) -> None:
    for version in (1, 2):
        line = line_matching(rf"^v{version} \(.*\): (\d+) requests/s, (\d+) wrong$", out)
        assert int(line[1]) > 0 and line[2] == "0", line[0]
    merged = line_matching(r"^batches: (\d+), ([\d.]+) requests per batch", out)
    assert float(merged[2]) > 1.0, merged[0]
    # 16 threads at once against one running batch and one waiting: some are refused,
    # every call is either served or refused, and the statistics count the refusals.
    bounded = line_matching(
        r"^bounded queue: (\d+) served, (\d+) refused at once \((\d+) counted\)$", out
    )
    served, refused, counted = map(int, bounded.groups())
    assert served > 0 and refused > 0 and served + refused == 16 * 20, bounded[0]
    assert counted == refused, bounded[0]


def user_7_sticks_and_the_split_is_90_10(out: str) -> None:
    # The example's claim: a keyed user sees the same version on every request.
    sticky = line_matching(r"^user-7 sticks to v(\d): (True|False)$", out)
    assert sticky[1] in {"1", "2"} and sticky[2] == "True", sticky[0]
    share = line_matching(r"^canary share: ([\d.]+)% of 1000 users$", out)
    assert 5.0 <= float(share[1]) <= 15.0, share[0]


def every_client_was_refused_after_dispose(out: str) -> None:
    # serving.py runs 8 clients that call until they are refused: each must
    # have been refused (a DisposedError), none may have crashed or hung.
    found = line_matching(
        r"^served (\d+) calls; (\d+) clients were refused after dispose; "
        r"drained in [\d.]+ ms, released (\d+) bytes$",
        out,
    )
    served, refused, released = (int(found[i]) for i in (1, 2, 3))
    assert served >= 200 and refused == 8, found[0]
    assert released == (16 * 4 + 4) * 4, found[0]  # Dense(4) on 16 inputs, float32


def no_request_failed(out: str) -> None:
    line_matching(r"; failed: 0$", out)


def both_protocols_answered_and_bad_input_was_refused(out: str) -> None:
    line_matching(r"^TF Serving predict from version 2: \[\[2\.0, 2\.0\]\]$", out)
    line_matching(r"^KServe v2 infer from version 2: \[2\.0, 2\.0\]$", out)
    line_matching(r"^a wrong shape is refused with 400: Input 'features' has shape", out)
    # The TF Serving batching file was read as is, and both requests went through batching.
    line_matching(
        r"^batching: max_batch_size 8, allowed sizes \[2, 4, 8\], max_enqueued_batches 100$", out
    )
    line_matching(r"^requests through version 2's batcher: 2$", out)
    line_matching(r"^versions: \{'3': 'AVAILABLE'(, '2': '(UNLOADING|END)')?\}$", out)


def tritonclient_defaults_were_served_over_http_and_grpc(out: str) -> None:
    line_matching(r"^HTTP, binary both ways: \[\[2\.0, 2\.0\]\] \(8 bytes\) from version 2$", out)
    line_matching(r"^HTTP, BYTES: \['chat', '\u732b'\]$", out)
    line_matching(r"^gRPC live and ready: True$", out)
    line_matching(r"^gRPC, raw contents: \[\[1\.0, 1\.0\]\] from version 1$", out)
    line_matching(r"^gRPC repository: \[\('echo', '1', 'READY'\), \('risk', '1', 'READY'\), ", out)


def every_trial_model_was_disposed(out: str) -> None:
    # The constructor's model and one per trial, all disposed; nothing left live.
    found = line_matching(
        r"^(\d+) trials: (\d+) models built, (\d+) disposed \([\d.]+ MiB released\), "
        r"(\d+) left live$",
        out,
    )
    trials, built, disposed, live = (int(found[i]) for i in (1, 2, 3, 4))
    assert built == disposed == trials + 1 and live == 0, found[0]
    line_matching(r"^best model: accuracy [\d.]+, then disposed", out)


def every_fold_model_was_disposed(out: str) -> None:
    # 5 folds; then 2 candidates x 3 folds and the refit, which alone stays live.
    line_matching(r"^5-fold accuracy: [\d.]+ ± [\d.]+; 5 of 5 fitted models disposed$", out)
    line_matching(r"; 11 of 12 fitted models disposed$", out)
    line_matching(r"^refit best model: live$", out)
    line_matching(r"^after the search: 12 of 12 fitted models disposed$", out)


def the_system_choice_gave_memory_back(out: str) -> None:
    # Measured here: 170-200 MiB came back of a 72 MiB model (its buffers, gradients and
    # activations) with the system allocator; under 30 with oneDNN's pool.
    number = r"(-?\d+)"
    system = line_matching(
        rf"^LIFECYCLE_ALLOCATOR=system: CPU allocator (\S+); dispose released {number} MiB, "
        rf"{number} MiB of RSS came back; pooled: False, the pool holds 0 MiB$",
        out,
    )
    assert int(system[3]) >= 0.7 * int(system[2]), system[0]
    defaults = line_matching(r"^defaults: CPU allocator (\S+); .*pooled: (True|False)", out)
    if defaults[1] == "onednn-pool":  # where the pool is TensorFlow's default, it says so
        line_matching(r"^defaults: .*pooled: True, the pool holds [1-9]\d* MiB$", out)


def no_fold_cost_a_collection(out: str) -> None:
    # Every fold's model was disposed: the cleaner had nothing to collect.
    for fold in range(3):
        line_matching(rf"^fold {fold}: val loss [\d.]+, released [\d.]+ MiB in \d+ buffers", out)
    line_matching(r"^cleaner: 0 collections \(longest 0 ms\); other threads blocked \d+ ms", out)


# What an example's output must show beyond its fragment in EXPECTED.
CLAIMS: dict[str, Callable[[str], None]] = {
    "ab_loading.py": user_7_sticks_and_the_split_is_90_10,
    "serving.py": every_client_was_refused_after_dispose,
    "hot_swap_serving.py": no_request_failed,
    "request_batching.py": every_answer_was_right_and_requests_were_merged,
    "serving_http.py": both_protocols_answered_and_bad_input_was_refused,
    "serving_triton_client.py": tritonclient_defaults_were_served_over_http_and_grpc,
    "sweep_keras_tuner.py": every_trial_model_was_disposed,
    "sweep_sklearn.py": every_fold_model_was_disposed,
    "training_loop.py": no_fold_cost_a_collection,
    "memory_back_to_the_system.py": the_system_choice_gave_memory_back,
}


def readme_snippet() -> str:
    """The README's first fenced Python block."""
    found = re.search(r"^```python\n(.*?)^```$", (ROOT / "README.md").read_text(), re.M | re.S)
    assert found, "README.md has no ```python block"
    return found[1]


def test_the_readmes_first_snippet_runs_as_printed(capsys):
    code = readme_snippet()
    last = code.rstrip().splitlines()[-1]
    assert last.startswith("model.predict(x)") and "raises lc.DisposedError" in last
    namespace: dict[str, object] = {"__name__": "readme"}
    # Everything runs; the last line raises the error it promises, as the comment says.
    with pytest.raises(lc.DisposedError, match="has been disposed"):
        exec(compile(code, "README.md", "exec"), namespace)
    report = namespace["report"]
    assert isinstance(report, lc.DisposeReport)
    # Two Dense layers' weights, and Adam's two slots for each.
    weights = 784 * 1024 + 1024 + 1024 * 10 + 10
    assert report.bytes_released >= 3 * weights * 4
    assert f"{report.bytes_released} " in capsys.readouterr().out


def test_the_readme_lists_every_example():
    readme = (ROOT / "README.md").read_text()
    assert [name for name in sorted(EXPECTED) if f"`{name}`" not in readme] == []


def test_every_example_is_covered():
    assert {path.name for path in (ROOT / "examples").glob("*.py")} == set(EXPECTED)


# The fast lane (-m "not slow") runs this one; the others take up to 70 s each.
FAST_EXAMPLE = "manage_existing.py"


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "example",
    [
        name if name == FAST_EXAMPLE else pytest.param(name, marks=pytest.mark.slow)
        for name in sorted(set(EXPECTED) - set(RUN_BY))
    ],
)
def test_example_runs(example, run_child):
    code = (
        f"import runpy, sys; sys.argv = [{example!r}, *{ARGS.get(example, [])!r}]; "
        f"runpy.run_path({str(ROOT / 'examples' / example)!r}, run_name='__main__')"
    )
    out = run_child(code, timeout=180)
    assert EXPECTED[example] in out
    CLAIMS.get(example, lambda _: None)(out)


@pytest.mark.parametrize("example", sorted(RUN_BY))
def test_the_examples_left_to_their_own_tests_are_run_and_read_there(example):
    path, name = RUN_BY[example].split("::")
    source = (ROOT / path).read_text()
    assert f"\ndef {name}(" in source, RUN_BY[example]
    body = source.split(f"\ndef {name}(", 1)[1].split("\ndef ", 1)[0]
    # It runs the example and reads the line test_example_runs would look for.
    assert f"examples/{example}" in body or f"'{example}'" in body, body
    assert EXPECTED[example] in body, body


def test_the_claims_fail_on_the_outputs_they_reject():
    with pytest.raises(AssertionError, match="user-7 sticks to v1: False"):
        user_7_sticks_and_the_split_is_90_10(
            "canary share: 9.0% of 1000 users\nuser-7 sticks to v1: False\n"
        )
    with pytest.raises(AssertionError, match="0 clients were refused"):
        every_client_was_refused_after_dispose(
            "served 250 calls; 0 clients were refused after dispose; "
            "drained in 1.6 ms, released 272 bytes\n"
        )
    with pytest.raises(AssertionError, match="no line matches"):
        no_request_failed("requests per version: {1: 10}; failed: 3\n")
    with pytest.raises(AssertionError, match="1 left live"):
        every_trial_model_was_disposed(
            "3 trials: 4 models built, 3 disposed (0.50 MiB released), 1 left live\n"
        )
    with pytest.raises(AssertionError, match="no line matches"):
        no_fold_cost_a_collection(
            "fold 0: val loss 1.0, released 0.03 MiB in 6 buffers\n"
            "fold 1: val loss 1.0, released 0.03 MiB in 6 buffers\n"
            "fold 2: val loss 1.0, released 0.03 MiB in 6 buffers\n"
            "cleaner: 1 collections (longest 480 ms); other threads blocked 500 ms in all\n"
        )
    with pytest.raises(AssertionError, match="no line matches"):
        every_fold_model_was_disposed("5-fold accuracy: 0.9 ± 0.1; 0 of 5 fitted models disposed\n")
    with pytest.raises(AssertionError, match="refused with 400"):
        both_protocols_answered_and_bad_input_was_refused(
            "TF Serving predict from version 2: [[2.0, 2.0]]\n"
            "KServe v2 infer from version 2: [2.0, 2.0]\n"
            "a wrong shape is refused with 500: Internal Server Error\n"
        )


@pytest.mark.subprocess
@pytest.mark.slow
def test_daily_training_memory_is_flat_over_twenty_generations(run_child):
    # The target: RSS growth <= 2 MiB per generation across 20 daily generations.
    code = (
        "import runpy, sys; sys.argv = ['daily', '--days', '20']; "
        f"runpy.run_path({str(ROOT / 'examples' / 'daily_incremental_training.py')!r}, "
        "run_name='__main__')"
    )
    out = run_child(code, timeout=400)
    line = next(ln for ln in out.splitlines() if ln.startswith("RSS growth per generation"))
    growth = float(line.split(":")[1].split()[0])
    assert growth <= 2.0, out
