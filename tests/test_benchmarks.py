"""The benchmark harness and scripts: rounds, ratios, options, JSON results, end to end.

The default run checks the harness (rounds, per-round ratios, the command line,
the result file's schema), every script's ``--help`` without TensorFlow, each
script's own report logic on stand-in results, and one cheap run through real
child processes. The end-to-end ``--quick`` run of every script carries the
``benchmark`` marker: ``make test-all`` runs them, ``make test`` leaves them out.
"""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))

sys.path.insert(0, str(BENCHMARKS))
import _harness  # noqa: E402

# The keys of a result file and of each of its cases, and their types.
DOCUMENT_KEYS = {"benchmark", "title", "date", "machine", "command", "source", "cases"}
MACHINE_KEYS = {"cpu": str, "cores": int, "python": str, "tensorflow": str, "keras": str}
CASE_KEYS = {
    "case": str,
    "variant": str,
    "metric": str,
    "unit": str,
    "median": float,
    "min": float,
    "max": float,
    "rounds": int,
}


def check_document(document: dict, benchmark: str) -> None:
    """Assert that ``document`` has the result file's schema."""
    assert set(document) >= DOCUMENT_KEYS, set(document)
    assert document["benchmark"] == benchmark and document["source"] == "run"
    assert document["command"].startswith(f"python benchmarks/{benchmark}.py")
    assert len(document["date"]) == 10 and document["date"][4] == "-"
    for key, kind in MACHINE_KEYS.items():
        assert isinstance(document["machine"][key], kind), (key, document["machine"])
    assert document["cases"], document
    for case in document["cases"]:
        for key, kind in CASE_KEYS.items():
            assert isinstance(case[key], kind), (key, case)
        assert case["min"] <= case["median"] <= case["max"], case
        assert case["baseline"] is None or isinstance(case["baseline"], str), case
        assert (case["ratio"] is None) == (case["baseline"] is None), case
        # Optional: one list per round of what the number was taken from.
        assert all(isinstance(one, list) for one in case.get("series", [])), case


# ------------------------------------------------------------------------ harness


def fake_spawn(results: dict[str, list[dict | None]], calls: list[str]):
    """A stand-in for ``spawn_child``: variant v's n-th child reports ``results[v][n]``."""

    def spawn(script, variant, options, timeout):
        number = calls.count(variant)
        calls.append(variant)
        result = results[variant][number]
        error = None if result is not None else "exit code 1\nboom"
        return _harness.ChildOutcome(variant, result, error, 0.0)

    return spawn


BENCH = _harness.Benchmark(
    name="toy",
    doc="A toy benchmark.\n\nMore.",
    variants={"a": "the first", "b": "the second", "c": "the third"},
    metrics=[
        _harness.Metric("ms", "ms", ".1f"),
        _harness.Metric("mib", "MiB", ".0f", ratio=False),
    ],
    measure=lambda variant, args: {},
)


def test_rounds_rotate_the_order_and_report_failed_children():
    calls: list[str] = []
    results = {
        "a": [{"ms": 10.0}, {"ms": 40.0}, {"ms": 20.0}],
        "b": [{"ms": 10.0}, {"ms": 10.0}, {"ms": 40.0}],
        "c": [{"ms": 1.0}, None, {"ms": 3.0}],
    }
    runs, failures = _harness.run_rounds(
        "x.py", ["a", "b", "c"], 3, ["--opt"], 5.0, spawn=fake_spawn(results, calls)
    )

    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [list(run) for run in runs] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert runs[1]["c"] is None and runs[2]["c"] == {"ms": 3.0}
    assert failures == ["round 2, variant c: exit code 1\nboom"]
    with pytest.raises(ValueError, match="at least 1 round"):
        _harness.run_rounds("x.py", ["a"], 0, [], 1.0)


def test_ratios_are_taken_within_each_round_then_summarised():
    runs = [
        {"a": {"ms": 10.0, "mib": 5}, "b": {"ms": 10.0}},
        {"a": {"ms": 40.0, "mib": 7}, "b": {"ms": 10.0}},
        {"a": {"ms": 20.0}, "b": {"ms": 40.0}},
    ]
    cases = {(c["variant"], c["metric"]): c for c in _harness.summarise(BENCH, runs)}

    b = cases["b", "ms"]
    # The median of per-round ratios b/a (1.0, 0.25, 2.0), not the ratio of medians.
    assert (b["median"], b["min"], b["max"], b["rounds"]) == (10.0, 10.0, 40.0, 3)
    assert (b["baseline"], b["ratio"], b["ratio_min"], b["ratio_max"]) == ("a", 1.0, 0.25, 2.0)
    assert cases["a", "ms"]["ratio"] == 1.0
    # A metric without a ratio, measured in two rounds of three.
    mib = cases["a", "mib"]
    assert (mib["median"], mib["rounds"], mib["baseline"], mib["ratio"]) == (6.0, 2, None, None)
    assert (mib["variant_label"], mib["metric_label"]) == ("the first", "mib")
    assert ("b", "mib") not in cases


def test_a_child_may_report_several_cases_and_a_baseline_per_variant():
    bench = _harness.Benchmark(
        name="toy",
        doc=None,
        variants={"x": "", "plain-x": ""},
        metrics=[_harness.Metric("s", "s")],
        measure=lambda variant, args: {},
        baseline=lambda variant: variant.removeprefix("plain-"),
    )
    runs = [{"x": {"cases": {"one": {"s": 2.0}, "two": {"s": 4.0}}}, "plain-x": {"s": 3.0}}]
    cases = {(c["case"], c["variant"]): c for c in _harness.summarise(bench, runs)}
    assert set(cases) == {("one", "x"), ("two", "x"), ("toy", "plain-x")}
    # plain-x's case is the benchmark's own; x measured no such case: no ratio.
    assert cases["toy", "plain-x"]["ratio"] is None and cases["one", "x"]["ratio"] == 1.0


def test_a_metric_keeps_its_per_round_series_in_the_json_and_ratios_judge_targets():
    bench = _harness.Benchmark(
        name="toy",
        doc="A toy.",
        variants={"a": "", "b": ""},
        metrics=[_harness.Metric("mib", "MiB", series="rss")],
        measure=lambda variant, args: {},
    )
    runs = [
        {"a": {"mib": 1.0, "rss": [1, 2]}, "b": {"mib": 2.0}},
        {"a": {"mib": 3.0, "rss": [3]}, "b": None},
    ]
    a, b = _harness.summarise(bench, runs)
    assert a["series"] == [[1, 2], [3]] and "series" not in b
    found = _harness.ratio_over_rounds(runs, "mib", "b", "a")
    assert (found.median, found.count) == (2.0, 1)
    assert _harness.judge("b/a <= 1.5x", found, 1.5) == "target: b/a <= 1.5x: MISSED (2.00x)"
    assert _harness.judge("b/a >= 1.5x", found, 1.5, at_least=True).endswith(": met (2.00x)")
    assert _harness.judge("b/a", None, 1.0) == "target: b/a: not measured"
    assert _harness.spread_text(_harness.spread_of([1.0, 0.5, 2.0])) == "1.00x (0.50-2.00)"


def test_number_helpers_skip_what_was_not_measured():
    assert _harness.spread_of([]) is None and _harness.spread_of([None, float("nan")]) is None
    assert _harness.spread_of([3.0, None, 1.0, 2.0]) == _harness.Spread(2.0, 1.0, 3.0, 3)
    assert _harness.fmt(None, ".1f") == "-" and _harness.fmt(12.34, ".1f", " ms") == "12.3 ms"
    assert _harness.percentiles([4.0, 1.0, 3.0, 2.0], 0, 50, 100) == [1.0, 2.5, 4.0]
    assert _harness.percentiles([], 50) == [None]
    assert _harness.slope([1.0, 3.0, 5.0]) == 2.0 and _harness.slope([1.0]) is None
    assert _harness.rotation(["a", "b"], 3) == ["b", "a"]


def test_the_command_line_checks_values_and_quick_shrinks_the_workload():
    bench = _harness.Benchmark(
        name="toy",
        doc="A toy benchmark.",
        variants={"a": "", "b": ""},
        metrics=[],
        measure=lambda variant, args: {},
        options=[_harness.Option("--steps", 10, "steps", _harness.positive_int)],
        quick={"steps": 2, "variants": "b"},
        rounds=5,
    )
    args = _harness.parse_args(bench, [])
    assert (args.steps, args.rounds, args.variants, args.out) == (10, 5, ["a", "b"], None)
    quick = _harness.parse_args(bench, ["--quick"])
    assert (quick.steps, quick.rounds, quick.variants) == (2, 1, ["b"])
    # What is given wins over --quick.
    given = _harness.parse_args(bench, ["--quick", "--steps", "3", "--variants", "b,a"])
    assert (given.steps, given.variants) == (3, ["b", "a"])
    for bad in (["--rounds", "0"], ["--steps", "x"], ["--variants", "a,z"], ["--timeout", "-1"]):
        with pytest.raises(SystemExit):
            _harness.parse_args(bench, bad)


def test_the_report_prints_a_table_and_the_result_file_has_the_schema(tmp_path, capsys):
    out = tmp_path / "toy.json"
    args = _harness.parse_args(BENCH, ["--rounds", "2", "--out", str(out)])
    runs = [{"a": {"ms": 10.0, "mib": 1}, "b": {"ms": 12.0}}, {"b": {"ms": 9.0}, "a": None}]

    assert _harness.report(BENCH, args, runs, ["round 2, variant a: boom"]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("A toy benchmark\nmachine: ")
    table = printed.split("\n\n")[1].splitlines()
    assert table[0].split() == ["variant", "ms", "ms", "vs", "a", "mib", "MiB"]
    assert table[2].split() == ["a", "10.0", "1.00x", "1"]
    assert table[3].split() == ["b", "10.5", "(9.0-12.0)", "1.20x", "-"]
    assert "FAILED: round 2, variant a: boom" in printed
    document = json.loads(out.read_text())
    check_document(document, "toy")
    assert document["command"] == f"python benchmarks/toy.py --rounds 2 --out {out}"


def test_a_quick_run_writes_no_result_file_unless_told(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    args = _harness.parse_args(BENCH, ["--quick"])
    assert _harness.report(BENCH, args, [{"a": {"ms": 1.0}}], []) == 0
    assert list(tmp_path.iterdir()) == []
    args = _harness.parse_args(BENCH, [])
    assert _harness.report(BENCH, args, [{"a": {"ms": 1.0}}], []) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["toy.json"]


# A benchmark whose children cost nothing: the harness end to end, TensorFlow left out.
TOY_SCRIPT = '''
"""Toy: children that sleep.

Run: python toy.py
"""
import os, sys, time
sys.path.insert(0, {benchmarks!r})
import _harness

def measure(variant, args):
    started = time.perf_counter()
    time.sleep(args.sleep * (2 if variant == "slow" else 1))
    if variant == "broken":
        raise RuntimeError("broken on purpose")
    return {{"ms": 1000 * (time.perf_counter() - started), "pid": os.getpid()}}

BENCHMARK = _harness.Benchmark(
    name="toy", doc=__doc__,
    variants={{"fast": "sleeps", "slow": "sleeps twice as long", "broken": "fails"}},
    metrics=[_harness.Metric("ms", "ms", ".1f"), _harness.Metric("pid", "", ".0f", ratio=False)],
    measure=measure, options=[_harness.Option("--sleep", 0.05, "seconds")],
)
if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
'''


@pytest.mark.subprocess
def test_the_harness_runs_each_variant_in_a_child_and_writes_its_result(tmp_path):
    script = tmp_path / "toy.py"
    script.write_text(textwrap.dedent(TOY_SCRIPT.format(benchmarks=str(BENCHMARKS))))
    out = tmp_path / "results" / "toy.json"
    command = [sys.executable, str(script), "--rounds", "2", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)

    # The broken variant fails in both rounds: reported, left out, exit code 1.
    assert done.returncode == 1, done.stderr
    assert "FAILED: round 1, variant broken: exit code 1" in done.stdout
    assert "RuntimeError: broken on purpose" in done.stderr
    document = json.loads(out.read_text())
    check_document(document, "toy")
    cases = {(c["variant"], c["metric"]): c for c in document["cases"]}
    assert set(cases) == {("fast", "ms"), ("fast", "pid"), ("slow", "ms"), ("slow", "pid")}
    slow = cases["slow", "ms"]
    assert slow["rounds"] == 2 and slow["baseline"] == "fast" and 1.3 < slow["ratio"] < 3.0
    # Four children, four processes, none of them the parent.
    pids = {cases[v, "pid"]["min"] for v in ("fast", "slow")} | {
        cases[v, "pid"]["max"] for v in ("fast", "slow")
    }
    assert len(pids) == 4


# ------------------------------------------------------------------------ scripts


# Run in a child: the script's --help, then which heavy modules its parent role loaded.
HELP_CHILD = """
import runpy, sys
sys.path.insert(0, {directory!r})
sys.argv = [{script!r}, "--help"]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as exit:
    code = exit.code
else:
    code = "no exit"
print("heavy modules:", sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
sys.exit(code)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_script_shows_its_options_without_loading_tensorflow(script):
    code = HELP_CHILD.format(directory=str(BENCHMARKS), script=str(BENCHMARKS / script))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for option in ("--rounds", "--quick", "--out", "--variants"):
        assert option in result.stdout, result.stdout
    assert result.stdout.splitlines()[-1] == "heavy modules: []", result.stdout


@pytest.fixture
def load_script(monkeypatch):
    """Imports ``benchmarks/<name>.py`` as a module, as its parent role sees its siblings."""
    before = set(sys.modules)
    yield lambda name: importlib.import_module(name.removesuffix(".py"))
    for name in set(sys.modules) - before:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == BENCHMARKS:
            del sys.modules[name]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_declares_a_benchmark_the_harness_can_report(script, load_script):
    bench = load_script(script).BENCHMARK
    assert bench.name == script.removesuffix(".py")
    assert bench.measure is not None or bench.collect is not None
    assert bench.title and "Run" in (bench.doc or "")
    keys = [metric.key for metric in bench.metrics]
    assert keys and len(keys) == len(set(keys))
    # --quick parses, and every variant has a baseline the benchmark knows (or none).
    args = _harness.parse_args(bench, ["--quick"])
    assert args.rounds >= 1 and set(args.variants) <= set(bench.variants)
    for variant in bench.variants:
        assert bench.baseline_of(variant) in (None, *bench.variants)


def test_the_sweeps_benchmark_fails_when_the_searches_disagree(load_script):
    module = load_script("sweeps")
    plain = {"best_trial": {"units": 64}, "best_score": 0.75}
    args = _harness.parse_args(module.BENCHMARK, [])
    runs = [{"plain": plain, "managed": {**plain, "best_score": 0.75}}]
    assert module.BENCHMARK.check(runs, args) == []
    runs = [{"plain": plain, "managed": {**plain, "best_score": 0.5}}]
    [problem] = module.BENCHMARK.check(runs, args)
    assert problem.startswith("best trials differ: managed: {'units': 64} 0.5")


def test_the_stalls_targets_are_judged_within_each_round(load_script):
    module = load_script("stalls")
    args = _harness.parse_args(module.BENCHMARK, [])
    runs = [
        {"plain": {"max_gap_ms": 30.0, "p99_gap_ms": 4.0}, "library": {"max_gap_ms": 45.0,
                                                                       "p99_gap_ms": 4.4}},
        {"plain": {"max_gap_ms": 90.0, "p99_gap_ms": 8.0}, "library": {"max_gap_ms": 95.0,
                                                                       "p99_gap_ms": 12.0}},
        {"plain": None, "library": {"max_gap_ms": 500.0, "p99_gap_ms": 50.0}},
    ]  # fmt: skip
    assert module.targets(runs, args) == [
        "target: max gap library - plain <= +20 ms: met (median +10.0)",
        "target: p99 gap library / plain <= 1.1x: MISSED (median 1.30)",
        "target: max gap library - plain <= +100 ms in every round: met (largest +15.0)",
        "max gap library - plain by round (ms): +15.0, +5.0",
    ]
    runs[0]["session"] = {"max_gap_ms": 140.0, "p99_gap_ms": 4.0}
    assert module.targets(runs, args)[4:] == [
        "target: max gap session - plain <= +20 ms: MISSED (median +110.0)",
        "target: p99 gap session / plain <= 1.1x: met (median 1.00)",
        "target: max gap session - plain <= +100 ms in every round: MISSED (largest +110.0)",
        "max gap session - plain by round (ms): +110.0",
    ]
    assert module.targets([], args)[0].endswith(": not measured")


def test_request_threads_tag_calls_by_phase_and_the_swapper_raises_a_failed_swap_once():
    load = importlib.import_module("_harness.load")

    def call(phase):
        time.sleep(0.001)
        if phase == 1:
            raise ValueError("boom")

    threads = load.RequestThreads(call, 2)
    threads.recording = True
    wait_until(lambda: threads.recorded(), "a call recorded in phase 0")
    threads.phase = 1
    wait_until(lambda: all(threads.failed), "a failed call on each thread in phase 1")
    threads.stop()
    phases = {phase for _, _, phase in threads.recorded()}
    assert phases == {0, 1} and set(threads.failed[0]) == {1}
    assert threads.errors[0] == "ValueError: boom"

    swapper = load.Swapper(lambda: time.sleep(0.01), every=0.02)
    swapper.start()
    wait_until(lambda: swapper.under_load() >= 2, "two swaps under load")
    swapper.stop()
    assert swapper.under_load() >= 2 and all(rss is None for *_, rss in swapper.swaps)
    failing = load.Swapper(lambda: 1 / 0, every=0.01)
    failing.start()
    wait_until(lambda: failing.error is not None, "the failed swap")
    with pytest.raises(RuntimeError, match="a swap failed: ZeroDivisionError"):
        failing.stop()
    failing.stop()  # raised once


def test_collections_are_timed_by_thread_and_generation():
    watch = _harness.Collections()
    gc.collect()
    other_thread = threading.Thread(target=gc.collect, name="other")
    other_thread.start()
    other_thread.join(60)
    watch.active = False
    gc.collect()
    watch.close()
    assert {(generation, name) for *_, generation, name in watch.events} == {
        (2, "MainThread"),
        (2, "other"),
    }
    other = watch.summary("other", lambda generation, name: name == "other")
    assert other["other_collections"] == 1 and other["other_max_ms"] == other["other_total_ms"]
    start, end, *_ = watch.events[0]
    assert watch.inside(start, end) >= 1000 * (end - start) > 0


def test_the_kfold_steady_step_leaves_out_each_folds_first_batch(load_script):
    module = load_script("kfold")
    assert module.steady_step_ms([[1.0, 0.01, 0.03], [2.0, 0.02]]) == 20.0
    assert module.steady_step_ms([[1.0], [2.0]]) is None
    with pytest.raises(SystemExit):
        _harness.parse_args(module.BENCHMARK, ["--folds", "4", "--samples", "3"])


def test_the_sweep_variants_compare_with_plain_under_the_same_settings(load_script):
    module = load_script("sweep")
    expected = {"plain": "plain", "managed": "plain", "nodnn": "plain-nodnn"}
    expected |= {"notrim-nodnn": "plain-nodnn", "sysalloc": "plain-sysalloc"}
    assert {v: module.BENCHMARK.baseline_of(v) for v in expected} == expected
    assert module.base_variant("sysalloc") == "managed" and module.base_variant("tuned") == "tuned"


def test_the_checkpoint_targets_compare_saves_and_restores_with_their_plain_kind(load_script):
    module = load_script("checkpoints")
    run = {name: {"ms": 10.0} for name in module.BENCHMARK.variants}
    run["keeper restore"] = {"ms": 20.0}
    lines = module.target([run], _harness.parse_args(module.BENCHMARK, []))
    assert "target: keeper save <= 1.5x plain save: met (1.00x)" in lines
    assert "target: keeper restore <= 1.5x plain restore: MISSED (2.00x)" in lines


# A stand-in for a `lifecycle serve` process: answers the benchmark's predict call (with
# status sys.argv[2]) and the admin API's batching counters, one batch per two requests.
STAND_IN_SERVER = """
import http.server, json, sys
served = 0
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_POST(self):
        global served
        self.rfile.read(int(self.headers["Content-Length"]))
        served += 1
        self.reply(int(sys.argv[2]), {"predictions": [[0.0]]})
    def do_GET(self):
        batching = {"batches": served // 2, "requests": served // 2 * 2}
        self.reply(200, {"versions": [{"batching": batching}]})
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.mark.subprocess
@pytest.mark.slow  # a script through real child processes stays in the fast lane
def test_the_served_batching_part_takes_turns_each_server_by_its_own_requests(load_script):
    module = load_script("batching")
    servers = importlib.import_module("_harness.servers")
    ports = _harness.free_ports(3)
    args = _harness.parse_args(module.BENCHMARK, ["--seconds", "0.8", "--warmup", "0.2"])
    args.slices = 2
    with servers.workspace("stand-ins-") as (work, running):
        for mode, port, status in zip(
            ("off", "on", "ceiling"), ports, (200, 200, 500), strict=True
        ):
            command = [sys.executable, "-c", STAND_IN_SERVER, str(port), str(status)]
            running[mode] = servers.start_server(mode, port, command, work / "logs")
        for server in running.values():
            servers.wait_ready(server, 60, lambda url, s=server: module.counters(s))
        found = module.serve_round(running, 0, 2, args, work / "logs")
        processes = [server.process for server in running.values()]
    # The workspace stopped every server it started and removed its directory.
    assert all(process.poll() is not None for process in processes)
    assert not work.exists()
    off, on, ceiling = found["off"], found["on"], found["ceiling"]
    for phase in (off, on):
        assert phase["requests_per_second"] > 0 and phase["failed_requests"] == 0, found
        assert phase["p50_us"] > 0 and phase["server_cpu_ms"] is not None, found
    # Each server's counters are read over its own slices.
    assert 1.0 <= off["requests_per_batch"] <= 3.0 and 1.0 <= on["requests_per_batch"] <= 3.0
    # Failures count for the server that failed them.
    assert ceiling["failed_requests"] > 0 and "status 500" in ceiling["errors"][0], ceiling
    assert ceiling["requests_per_second"] == 0


def test_the_peers_benchmark_skips_a_peer_it_cannot_run_naming_the_line_that_creates_it(
    load_script, tmp_path
):
    module = load_script("peers")
    missing = tmp_path / "venv"
    python, why = module.peer_python("mlserver", str(missing))
    assert python is None and why.startswith(f"no virtualenv at {missing} (--mlserver-venv)")
    line = f"python3 -m venv {missing} && {missing}/bin/pip install mlserver 'uvloop==0.21.0'"
    assert why.endswith(f"{line} 'tensorflow-cpu==2.21.*'"), why
    # A virtualenv whose Python runs this test's, without the peer's package.
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    (bare / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bare / "bin" / "python").chmod(0o755)
    python, why = module.peer_python("kserve", str(bare))
    assert python is None and why.startswith(f"{bare} cannot import kserve and tensorflow")


# ------------------------------------------------------------------ end to end


# Per script: extra options for a quick run, and (variant, metric) pairs its result has.
END_TO_END = {
    "allocator.py": ([], {("pool", "train_ms"), ("lc-system", "pooled_mib")}),
    "checkpoints.py": ([], {("keeper save", "ms"), ("plain restore", "ms")}),
    "cleaner.py": ([], {("naive", "p99_us"), ("bg", "cleaner_gcs")}),
    "dispose.py": ([], {("mlp", "drop_ms"), ("mlp", "settled_ms"), ("plain-mlp", "drop_ms")}),
    "hot_swap.py": ([], {("direct", "requests_per_second"), ("swaps", "swaps")}),
    "kfold.py": ([], {("plain", "step_ms"), ("library", "models_disposed")}),
    "loop_training.py": (
        ["--variants", "a,c,dispose"],
        {("a", "growth_mib_per_cycle"), ("c", "release_ms"), ("dispose", "release_ms")},
    ),
    "serving_call.py": ([], {("tf.function", "us"), ("registry.batched", "us")}),
    "stalls.py": ([], {("plain", "max_gap_ms"), ("library", "blocking_ms")}),
    "sweep.py": (["--variants", "plain,managed"], {("plain", "growth_mib")}),
    "sweeps.py": ([], {("plain", "seconds_per_trial"), ("managed", "released_mib")}),
    "serve.py": ([], {("b", "requests_per_second"), ("c", "swaps_under_load")}),
    "batching.py": ([], {("off", "p50_us"), ("on", "requests_per_batch")}),
    "first_response.py": ([], {("default", "first_response_s")}),
    # Each peer runs from its virtualenv (/tmp/peer-<peer>), and is skipped without one.
    "peers.py": ([], {("lifecycle", "requests_per_second"), ("lifecycle", "mib_per_cycle")}),
    "worker_hop.py": ([], {("lifecycle pool", "cpu_us"), ("anyio to_thread", "calls_per_s")}),
    "ray_serve.py": ([], {("plain", "growth_mib"), ("managed", "models_disposed")}),
    "ray_tune.py": ([], {("plain", "growth_mib"), ("managed", "wall_s")}),
}


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.parametrize("script", sorted(END_TO_END))
def test_a_quick_run_of_each_script_measures_its_variants(script, tmp_path):
    options, expected = END_TO_END[script]
    out = tmp_path / "result.json"
    command = [sys.executable, str(BENCHMARKS / script), "--quick", *options, "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    check_document(document, script.removesuffix(".py"))
    found = {(case["variant"], case["metric"]) for case in document["cases"]}
    assert expected <= found, found
