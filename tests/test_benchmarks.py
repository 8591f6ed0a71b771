"""The benchmark scripts work: options, tables and child processes, then end to end.

The default run checks every script's ``--help`` and parent role (tables built from
children's results, without TensorFlow), one script through real child processes,
and the checkpoint benchmark. The end-to-end runs of the other scripts, a child
process per variant on a tiny workload, carry the ``benchmark`` marker: ``make
test-all`` runs them, ``make test`` leaves them out.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))


def run_benchmark(script: str, *args: str, timeout: float = 240, wait: float = 600) -> list[str]:
    """Run ``benchmarks/<script>`` with ``args``; assert it succeeds; its stdout lines.

    ``timeout`` is the script's ``--timeout`` (each child's), ``wait`` how long the
    whole run may take.
    """
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--timeout", f"{timeout:g}"],
        capture_output=True,
        text=True,
        timeout=wait,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def split_cells(line: str) -> list[str]:
    """A table line's cells: separated by two spaces or more (``1.20x (1.01-1.40)`` is one)."""
    return re.split(r"\s{2,}", line.strip())


def table(lines: list[str], *header: str) -> dict[str, list[str]]:
    """The rows, by first cell and split into cells, of the table whose header starts so."""
    start = next(
        i for i, line in enumerate(lines) if split_cells(line)[: len(header)] == list(header)
    )
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        row = split_cells(line)
        rows[row[0]] = row
    return rows


def load_harness():
    """``benchmarks/_harness.py`` as a module (the scripts import it from their directory)."""
    name = "benchmarks_harness"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "_harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


harness = load_harness()


def fake_spawn(times: dict[str, list[float]], failing: set[tuple[str, int]], calls: list[str]):
    """A stand-in for ``spawn_child``: variant v's n-th child reports ``times[v][n]``."""

    def spawn(script, variant, options, timeout):
        number = sum(call == variant for call in calls)
        calls.append(variant)
        if (variant, number) in failing:
            return harness.ChildOutcome(variant, None, "exit code 1\nboom", 0.0)
        return harness.ChildOutcome(variant, {"ms": times[variant][number]}, None, 0.0)

    return spawn


def test_rounds_rotate_the_order_and_keep_failed_children(capsys):
    calls: list[str] = []
    times = {"a": [10.0, 40.0, 20.0], "b": [10.0, 10.0, 40.0], "c": [1.0, 2.0, 3.0]}
    spawn = fake_spawn(times, {("c", 1)}, calls)

    rounds = harness.run_rounds("x.py", ["a", "b", "c"], 3, ["--opt"], 5.0, spawn=spawn)

    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [list(run) for run in rounds.runs] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert rounds.values("a", "ms") == [10.0, 40.0, 20.0]
    # c's second child failed: its round is left out of c's values, and reported.
    assert rounds.results("c")[1] is None and rounds.values("c", "ms") == [1.0, 3.0]
    assert rounds.succeeded("c") == 2 and rounds.last_result("c") == {"ms": 3.0}
    assert [(n, o.variant) for n, o in rounds.failed()] == [(2, "c")]
    assert harness.report_round_failures(rounds) == 1
    out, err = capsys.readouterr()
    assert "FAILED children" in out and "c in round 2" in out
    assert "round 2, variant c failed: exit code 1" in err and "boom" in err


def test_ratios_are_taken_within_each_round_then_summarised():
    calls: list[str] = []
    times = {"a": [10.0, 40.0, 20.0], "b": [10.0, 10.0, 40.0]}
    rounds = harness.run_rounds(
        "x.py", ["a", "b"], 3, [], 5.0, spawn=fake_spawn(times, set(), calls)
    )

    ratios = rounds.ratios("ms", "a", "b")
    assert ratios == [1.0, 4.0, 0.5]
    # The median of per-round ratios (1.0), not the ratio of medians (20 / 10 = 2.0).
    assert harness.fmt_spread(ratios, ".2f", "x") == "1.00x (0.50-4.00)"
    assert harness.spread_of(ratios) == harness.Spread(1.0, 0.5, 4.0, 3)
    # A metric may be a function of the result.
    assert rounds.values("b", lambda r: r["ms"] / 10) == [1.0, 1.0, 4.0]
    assert harness.fmt_spread(rounds.values("a", "ms"), ".1f", " ms") == "20.0 ms (10.0-40.0)"


def test_summary_helpers_skip_what_was_not_measured():
    assert harness.per_round_ratios([2.0, None, 3.0, 4.0], [1.0, 5.0, 0.0, 8.0]) == [2.0, 0.5]
    with pytest.raises(ValueError, match="one value per round"):
        harness.per_round_ratios([1.0], [1.0, 2.0])
    assert harness.fmt_spread([], ".1f") == "-"
    assert harness.fmt_spread([None, float("nan")], ".1f") == "-"
    assert harness.fmt_spread([12.34], ".1f", " ms") == "12.3 ms"
    assert harness.fmt_spread([3.0, None, 1.0, 2.0], "+.0f") == "+2 (+1-+3)"
    assert harness.rotation(["a", "b"], 3) == ["b", "a"]
    with pytest.raises(ValueError, match="at least 1 round"):
        harness.run_rounds("x.py", ["a"], 0, [], 1.0)


def test_rounds_option_takes_positive_integers():
    parser = harness.argument_parser("A benchmark.")
    harness.add_child_arguments(parser, ["a"], timeout=10.0, rounds=4)
    assert parser.parse_args([]).rounds == 4
    assert parser.parse_args(["--rounds", "2"]).rounds == 2
    for bad in ("0", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--rounds", bad])


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
    # Every script runs its variants in rounds (the machine drifts between runs).
    assert "--rounds" in result.stdout and "usage:" in result.stdout, result.stdout
    # The parent role only starts children and prints tables: no TensorFlow import.
    assert result.stdout.splitlines()[-1] == "heavy modules: []", result.stdout


@pytest.fixture
def load_script(monkeypatch):
    """Imports ``benchmarks/<name>.py`` as a module, as its parent role sees its siblings."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    before = set(sys.modules)
    yield lambda name: importlib.import_module(name.removesuffix(".py"))
    for name in set(sys.modules) - before:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == BENCHMARKS:
            del sys.modules[name]


def fake_children(monkeypatch, module, results: dict[str, dict | list[dict]] | None) -> list[str]:
    """Make ``module``'s parent run its rounds with stand-in children.

    Variant v's child reports ``results[v]`` if that is a dict (every round alike),
    its n-th child ``results[v][n]`` if a list; with ``results`` None, every child
    fails. Returns the variants of the children started, in order.
    """
    started: list[str] = []

    def spawn(script, variant, options, timeout):
        number = started.count(variant)
        started.append(variant)
        if results is None:
            return module._harness.ChildOutcome(variant, None, "exit code 1\nboom", 0.0)
        result = results[variant]
        if isinstance(result, list):
            result = result[number]
        return module._harness.ChildOutcome(variant, result, None, 0.0)

    real = module._harness.run_rounds
    monkeypatch.setattr(module._harness, "run_rounds", functools.partial(real, spawn=spawn))
    return started


# The scripts whose parent runs its children through ``_harness.run_rounds``, with
# command lines naming two variants (run for two rounds).
ROUND_SCRIPTS = {
    "allocator.py": ["--variants", "pool,system"],
    "cleaner.py": ["--variants", "naive,bg"],
    "dispose.py": ["--variants", "mlp,plain-mlp"],
    "hot_swap.py": ["--variants", "direct,swaps"],
    "kfold.py": ["--variants", "plain,library"],
    "loop_training.py": ["--variants", "a,c"],
    "stalls.py": ["--variants", "plain,library"],
    "sweep.py": ["--variants", "plain,managed"],
    "sweeps.py": ["--variants", "plain,managed"],
}


@pytest.mark.parametrize("script", sorted(ROUND_SCRIPTS))
def test_a_benchmark_whose_children_all_fail_still_reports_and_exits_1(
    script, load_script, monkeypatch, capsys
):
    module = load_script(script)
    args = module.parse_args([*ROUND_SCRIPTS[script], "--rounds", "2"])
    started = fake_children(monkeypatch, module, None)

    assert module.run_parent(args) == 1
    assert len(started) == 4 and set(started) == set(args.variants)
    out, err = capsys.readouterr()
    assert out.startswith("machine: "), out
    assert "FAILED children (left out of the medians; errors on stderr): " in out, out
    assert f"{args.variants[1]} in round 2" in out and "boom" in err


def test_the_loop_benchmark_table_shows_each_variant_against_the_first(
    load_script, monkeypatch, capsys
):
    module = load_script("loop_training.py")
    args = module.parse_args(["--variants", "a,c,dispose", "--rounds", "2", "--dispose-mb", "8"])
    loop = {"growth_mib_per_cycle": 14.0, "seconds_per_cycle": 0.5, "drop_ms": 2.0}
    fake_children(
        monkeypatch,
        module,
        {
            "a": {**loop, "rss_mib": [300.0, 700.0], "warmup": 1},
            "c": {**loop, "seconds_per_cycle": 0.6, "release_ms": 30.0, "released_mib": 31.5},
            "dispose": {"release_ms": 12.0, "released_mib": 8.0},
        },
    )

    assert module.run_parent(args) == 0
    rows = table(capsys.readouterr().out.splitlines(), "variant")
    assert rows["(a) del model"] == [
        *("(a) del model", "+14.00 (+14.00-+14.00)", "0.500 (0.500-0.500)", "-"),
        *("1.00x (1.00-1.00)", "2.0 (2.0-2.0)", "-", "-", "700 (700-700)"),
        "+400.0 (+400.0-+400.0)",
    ]
    managed = rows["(c) ManagedModel + dispose()"]
    assert managed[4] == "1.20x (1.20-1.20)" and managed[-3] == "31.5 (31.5-31.5)", managed
    dispose = rows["(c) dispose() of a 8 MiB model"]
    assert dispose[1:5] == ["-"] * 4 and dispose[6:8] == ["12.0 (12.0-12.0)", "8.0 (8.0-8.0)"]


def test_the_dispose_benchmark_table_shows_each_model_against_the_mlp(
    load_script, monkeypatch, capsys
):
    module = load_script("dispose.py")
    args = module.parse_args(["--variants", "mlp,mobilenetv2,plain-mlp", "--rounds", "2"])
    times = {"release_ms": [10.0, 9.0], "gc_ms": [0.0, 0.0], "settled_ms": 8.0, "cleaner_ms": 5.0}
    fake_children(
        monkeypatch,
        module,
        {
            "mlp": {
                **times,
                **{"variables": 19, "released_mib": 100.0, "dispose_ms": [14.0, 10.0, 12.0]},
                "first_dispose_ms": 14.0,
            },
            "mobilenetv2": {
                **times,
                **{"variables": 591, "released_mib": 27.4, "dispose_ms": [40.0, 36.0, 30.0]},
                "first_dispose_ms": 40.0,
            },
            "plain-mlp": {"plain_ms": [80.0, 70.0, 90.0]},
        },
    )

    assert module.run_parent(args) == 0
    rows = table(capsys.readouterr().out.splitlines(), "model", "buffers")
    assert set(rows) == {"mlp", "mobilenetv2"}
    mlp, mobilenet = rows["mlp"], rows["mobilenetv2"]
    # A child's disposes count by their median, first and settled apart.
    assert mlp[1:4] == ["19", "100", "12.0 (12.0-12.0)"] and mlp[4] == "1.00x (1.00-1.00)"
    assert mlp[5] == "14.0 (14.0-14.0)" and mlp[6] == "9.5 (9.5-9.5)", mlp
    assert mlp[8:10] == ["8.0 (8.0-8.0)", "5.0 (5.0-5.0)"], mlp
    assert mlp[-1] == "80.0 (80.0-80.0)"
    assert mobilenet[1:3] == ["591", "27"] and mobilenet[4] == "3.00x (3.00-3.00)", mobilenet
    assert mobilenet[-1] == "-"


def test_the_allocator_benchmark_shows_each_setting_against_the_pool(
    load_script, monkeypatch, capsys
):
    module = load_script("allocator.py")
    args = module.parse_args(
        ["--models", "mlp", "--rounds", "2", "--variants", "pool,system,nodnn"]
    )
    times = {"mlp_train_ms": 40.0, "mlp_infer_ms": 2.0, "peak_rss_mib": 900}
    times |= {"mlp_infer32_ms": 5.0, "mlp_faults": 100.0, "mlp_returned": 0.2}
    times |= {"mlp_returned_mib": 20.0, "mlp_pooled_mib": 400.0}
    fake_children(
        monkeypatch,
        module,
        {
            "pool": {**times, "onednn": True, "released_mapped_mib": 64.0},
            "system": {**times, "onednn": True, "released_mapped_mib": 0.0, "mlp_train_ms": 44.0},
            "nodnn": {**times, "onednn": False, "released_mapped_mib": 0.0, "mlp_infer_ms": 3.0},
        },
    )

    assert module.run_parent(args) == 0
    out = capsys.readouterr().out
    rows = table(out.splitlines(), "measurement", "pool", "system", "nodnn")
    assert set(rows) == {
        "MLP train step ms",
        "MLP page faults/step",
        "MLP batch-1 call ms",
        "MLP batch-32 call ms",
        "MLP RSS returned",
        "MLP returned MiB",
        "MLP pooled MiB",
        "peak RSS MiB",
    }
    # Shares and counts get no ratio: a ratio of shares reads as nonsense.
    assert rows["MLP RSS returned"][1:] == ["0.20 (0.20-0.20)"] * 3, rows["MLP RSS returned"]
    train, infer = rows["MLP train step ms"], rows["MLP batch-1 call ms"]
    assert train[1:] == ["40.0 (40.0-40.0)", "44.0 (44.0-44.0)", "40.0 (40.0-40.0)",
                         "1.10x (1.10-1.10)", "1.00x (1.00-1.00)"]  # fmt: skip
    assert infer[-2:] == ["1.00x (1.00-1.00)", "1.50x (1.50-1.50)"], infer
    # What each setting did to a dropped tensor, as the child saw it.
    assert "defaults: oneDNN on; of a dropped 64 MiB tensor still mapped: 64 MiB" in out
    assert "=0: oneDNN off; of a dropped 64 MiB tensor still mapped: 0 MiB" in out


def test_the_sweep_benchmark_compares_each_setting_with_plain_under_it(load_script):
    module = load_script("sweep.py")
    assert set(module.VARIANTS) == set(module.LABELS)
    expected = {
        "plain": "plain",
        "managed": "plain",
        "tuned": "plain",
        "nodnn": "plain-nodnn",
        "notrim-nodnn": "plain-nodnn",
        "plain-sysalloc": "plain-sysalloc",
        "sysalloc": "plain-sysalloc",
    }
    assert {v: module.reference(v) for v in expected} == expected
    assert module.base_variant("sysalloc") == "managed"
    assert module.base_variant("plain-nodnn") == module.base_variant("plain") == "plain"


@pytest.mark.parametrize("managed_best", [0.75, 0.5])
def test_the_sweeps_benchmark_exits_1_when_the_searches_disagree(
    managed_best, load_script, monkeypatch, capsys
):
    module = load_script("sweeps.py")
    args = module.parse_args(["--rounds", "2"])
    plain = {"variant": "plain", "growth_mib_per_trial": 3.0, "search_growth_mib": 20.0}
    plain |= {"seconds_per_trial": 1.5, "best_score": 0.75}
    plain |= {"best_values": {"units": 64, "learning_rate": 0.001}}
    managed = plain | {"variant": "managed", "growth_mib_per_trial": 0.1, "released_mib": 9.0}
    managed["best_score"] = managed_best
    fake_children(monkeypatch, module, {"plain": plain, "managed": managed})

    agree = managed_best == plain["best_score"]
    assert module.run_parent(args) == (0 if agree else 1)
    out, err = capsys.readouterr()
    rows = table(out.splitlines(), "variant")
    assert rows[module.LABELS["plain"]][4:] == ["-", "0.7500", "units=64, learning_rate=0.001"]
    assert rows[module.LABELS["managed"]][1] == "+0.10 (+0.10-+0.10)"
    assert rows[module.LABELS["managed"]][4] == "9"
    assert ("best trials differ: managed" in err) is not agree


def test_the_serving_call_benchmark_compares_each_way_with_tf_function(load_script):
    module = load_script("serving_call.py")
    ways = {way: [100e-6, 200e-6] for way in module.WAYS}
    ways["lc.serving_function"] = [50e-6, 150e-6]
    rows = {row[1]: row for row in module.rows({64: ways})}
    assert rows["tf.function"][2:] == ["150 (100-200)", *["1.00x (1.00-1.00)"] * 2]
    assert rows["lc.serving_function"][2:] == ["100 (50-150)", *["0.62x (0.50-0.75)"] * 2]
    assert {row[0] for row in rows.values()} == {"MLP 256-64-64-16"}
    module._harness.render_table(module.HEADER, list(rows.values()))


def test_the_worker_hop_benchmark_compares_each_way_with_the_lifecycle_pool(load_script):
    module = load_script("worker_hop.py")
    ways = {way: [(20e-6, 40_000.0), (40e-6, 20_000.0)] for way in module.WAYS}
    ways["ThreadPoolExecutor"] = [(50e-6, 16_000.0), (60e-6, 14_000.0)]
    rows = {row[2]: row for row in module.rows("uvloop", {16: ways})}
    assert list(rows) == list(module.WAYS)
    assert rows["lifecycle pool"] == [
        "uvloop", "16", "lifecycle pool", "30.0 (20.0-40.0)", "1.00x (1.00-1.00)",
        "30,000 (20,000-40,000)",
    ]  # fmt: skip
    # Ratios are taken within each round: 50/20 and 60/40.
    assert rows["ThreadPoolExecutor"][3:5] == ["55.0 (50.0-60.0)", "2.00x (1.50-2.50)"]
    module._harness.render_table(module.HEADER, list(rows.values()))


def test_the_batching_benchmark_says_when_the_ceiling_puts_a_target_out_of_reach(load_script):
    module = load_script("batching.py")

    def phase(requests_per_second: float, p50_us: float) -> dict:
        return {"requests_per_second": requests_per_second, "p50_us": p50_us, "p99_us": 2 * p50_us}

    rounds = [
        {"16/off": phase(100, 900), "16/on": phase(150, 600), "16/ceiling": phase(180, 500)},
        {"16/off": phase(200, 900), "16/on": phase(280, 600), "16/ceiling": phase(400, 500)},
    ]
    [row] = module.ratio_rows(rounds, [16])
    assert row == ["16", "1.45x (1.40-1.50x)", "0.67x (0.67-0.67x)", "0.67x (0.67-0.67x)",
                   "1.90x (1.80-2.00x)"]  # fmt: skip
    lines = module.target_lines(
        [{k: {**v, "failed_requests": 0} for k, v in r.items()} for r in rounds], [16]
    )
    assert lines[:3] == [
        "  16 clients, throughput on/off >= 2.5x: MISSED (median 1.450x)",
        "    out of reach on this path: the ceiling served 1.90x off's requests/s",
        "  16 clients, p50 on/off <= 1.2x: met (median 0.667x)",
    ]
    # A ceiling above the target says nothing more.
    rounds[0]["16/ceiling"] = rounds[1]["16/ceiling"] = phase(1000, 100)
    lines = module.target_lines(
        [{k: {**v, "failed_requests": 0} for k, v in r.items()} for r in rounds], [16]
    )
    assert not any("out of reach" in line for line in lines)


def test_the_batching_benchmark_measures_the_modes_in_turns_each_by_its_own_calls(load_script):
    module = load_script("batching.py")

    class Registry:
        """Stand-in: "off" answers in 1 ms, "on" in 2 ms and counts batches, "bad" fails."""

        def __init__(self) -> None:
            self.calls: list[str] = []
            self.counters = {"on": [0, 0]}  # batches, requests

        def predict(self, name: str, request: object) -> object:
            self.calls.append(name)
            if name == "bad":
                raise ValueError("refused")
            time.sleep(0.001 if name == "off" else 0.002)
            if name == "on":
                batches, requests = self.counters["on"]
                self.counters["on"] = [batches + 1, requests + 2]  # 2 requests per batch
            return request

        def status(self, name: str) -> list:
            counters = self.counters.get(name)
            batching = None
            if counters is not None:
                batching = SimpleNamespace(
                    batches=counters[0], requests=counters[1], padded_rows=counters[0]
                )
            return [SimpleNamespace(batching=batching)]

    registry = Registry()
    args = SimpleNamespace(slices=4, seconds=0.4, warmup=0.08)
    results = module.measure_modes(registry, ("off", "on", "bad"), "x", 2, args)
    off, on, bad = results["off"], results["on"], results["bad"]
    # Each mode is timed by its own calls: "off" answers about twice as fast as "on".
    assert 1.3 < off["requests_per_second"] / on["requests_per_second"] < 3.0, results
    assert off["p50_us"] < on["p50_us"]
    assert on["requests_per_batch"] == 2.0 and on["padded_rows_per_batch"] == 1.0
    assert "requests_per_batch" not in off
    # Failures go to the mode that failed, with their errors.
    assert off["failed_requests"] == on["failed_requests"] == 0 and bad["failed_requests"] > 0
    assert off["errors"] == [] and bad["errors"][0] == "ValueError: refused"
    # The modes took turns, the order reversed every other turn: off on bad, bad on off, ...
    # So "on" comes in --slices runs of calls, the others in at least half as many.
    calls = registry.calls
    turns = [name for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]
    assert turns.count("on") >= args.slices, turns
    assert min(turns.count("off"), turns.count("bad")) >= args.slices // 2, turns


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
def test_the_batching_benchmark_serves_in_turns_each_server_by_its_own_requests(
    load_script, tmp_path
):
    module = load_script("batching.py")
    serve = module.serve
    servers = []
    stand_ins = zip(("off", "on", "bad"), serve.free_ports(3), (200, 200, 500), strict=True)
    for variant, port, status in stand_ins:
        log = tmp_path / f"{variant}.log"
        with log.open("wb") as errors:
            process = subprocess.Popen(
                [sys.executable, "-c", STAND_IN_SERVER, str(port), str(status)], stderr=errors
            )
        servers.append(serve.Server(variant, process, port, log))
    try:
        for server in servers:  # listening once the admin API answers
            deadline = time.monotonic() + 60
            while True:
                server.check_alive()
                try:
                    module.batching_counters(server.url)
                    break
                except RuntimeError:
                    assert time.monotonic() < deadline, f"{server.variant} did not start"
                    time.sleep(0.1)
        args = SimpleNamespace(seconds=0.8, warmup=0.2, slices=2, timeout=120.0)
        phases = module.serve_turns(servers, 2, args, tmp_path)
    finally:
        serve.stop_processes([server.process for server in servers])
    off, on, bad = phases["off"], phases["on"], phases["bad"]
    for phase in (off, on):
        assert phase["requests_per_second"] > 0 and phase["failed_requests"] == 0, phases
        assert phase["p50_us"] > 0 and phase["server_cpu_ms"] is not None, phases
    # The batching counters are read over "on"'s own slices; "off" reports none.
    assert off["requests_per_batch"] is None and 1.0 <= on["requests_per_batch"] <= 3.0, phases
    # Failures count for the server that failed them.
    assert bad["failed_requests"] > 0 and "status 500" in bad["errors"][0], bad
    assert bad["requests_per_second"] == 0


def test_the_checkpoint_benchmark_compares_each_operation_with_plain(load_script):
    module = load_script("checkpoints.py")
    times = {name: [0.010, 0.020] for name in module.OPERATIONS}
    times["keeper save"] = [0.012, 0.040]
    rows = {row[0]: row for row in module.rows(times)}
    assert rows["plain save"][1:] == ["15 (10-20)", "1.00x (1.00-1.00)", "-"]
    assert rows["keeper save"][1:] == ["26 (12-40)", "1.60x (1.20-2.00)", "missed"]
    assert rows["keeper restore"][2:] == ["1.00x (1.00-1.00)", "met"]
    module._harness.render_table(module.HEADER, list(rows.values()))  # as many cells as columns


def markdown_rows(lines: list[str], first_header: str) -> dict[str, list[str]]:
    """The rows, by first cell and split into cells, of the Markdown table headed so."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def test_the_peers_benchmark_skips_a_peer_it_cannot_run_naming_the_line_that_creates_it(
    load_script, tmp_path
):
    module = load_script("peers.py")
    kserve, mlserver = module.PEERS["kserve"], module.PEERS["mlserver"]
    create = (
        "python3 -m venv /tmp/peer-kserve && "
        "/tmp/peer-kserve/bin/pip install kserve 'tensorflow-cpu==2.21.*'"
    )
    check = module.find_peer(kserve, None)
    assert check.python is None
    assert check.skipped == (
        f"--kserve-venv not given; create it with `{create}` and pass --kserve-venv PATH"
    )
    missing = tmp_path / "venv"
    check = module.find_peer(mlserver, str(missing))
    assert check.python is None and check.skipped.startswith(f"no virtualenv at {missing}: ")
    line = f"python3 -m venv {missing} && {missing}/bin/pip install mlserver 'uvloop==0.21.0'"
    assert f"`{line} 'tensorflow-cpu==2.21.*'`" in check.skipped
    # A virtualenv whose Python runs this test's, without the peer's package.
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    (bare / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bare / "bin" / "python").chmod(0o755)
    check = module.find_peer(kserve, str(bare))
    assert check.python is None and check.versions["kserve"] is None, check
    assert check.skipped.startswith(f"{bare} lacks kserve"), check
    assert f"create it with `python3 -m venv {bare} && {bare}/bin/pip install" in check.skipped
    # The report says it, one line per peer, naming each option.
    lines = module.skip_lines(module.peer_checks(module.parse_args([])))
    assert [line.split(":")[0] for line in lines] == ["KServe skipped", "MLServer skipped"]
    assert "--kserve-venv not given" in lines[0] and "--mlserver-venv not given" in lines[1]


def peers_phase(requests_per_second: float, p99_ms: float, cpu_ms: float, **more) -> dict:
    return {
        "requests_per_second": requests_per_second,
        "p50_ms": p99_ms / 2,
        "p99_ms": p99_ms,
        "server_cpu_ms_per_request": cpu_ms,
        "requests": 100,
        "failed": 0,
        "errors": [],
        "load_cpu_share": 0.2,
        "load_cpu_warning": False,
        **more,
    }


def test_the_peers_benchmark_reports_medians_and_ratios_per_round(load_script, capsys):
    module = load_script("peers.py")
    args = module.parse_args(["--rounds", "2", "--clients", "16,1", "--cycles", "2"])
    checks = {
        "kserve": module.PeerCheck("kserve", None, skipped="--kserve-venv not given; ..."),
        "mlserver": module.PeerCheck(
            "mlserver",
            module.Path("/venv/bin/python"),
            {"mlserver": "1.7.1", "tensorflow-cpu": "2.21.0", "keras": "3.15.1"},
        ),
    }
    run = module.Run(["lifecycle", "mlserver"], args.clients)
    for rps, rss, failed, swap_p99 in ((1000.0, 1200.0, 0, 30.0), (800.0, 1300.0, 3, 31.0)):
        steady = {
            "lifecycle": peers_phase(rps, 10.0, 1.0),
            "mlserver": peers_phase(rps / 2, 20.0, 4.0, failed=failed),
        }
        swaps = {
            "lifecycle": peers_phase(rps, swap_p99, 1.0, swap_seconds=[1.0, 2.0]),
            "mlserver": peers_phase(rps, 40.0, 1.0, swap_seconds=[0.1]),
        }
        run.rounds.append(
            {
                "v2/1": steady,
                "v2/16": steady,
                "v1/1": {"lifecycle": steady["lifecycle"]},
                "v1/16": {"lifecycle": steady["lifecycle"]},
                "swaps": swaps,
                "memory": {
                    "lifecycle": {
                        "rss_mib": [700.0] * 3,
                        "cycle_seconds": [0.5, 0.7],
                        "error": None,
                    },
                    "mlserver": {
                        "rss_mib": [rss, rss + 30, rss + 60],
                        "cycle_seconds": [0.2],
                        "error": "POST .../load: status 500",
                    },
                },
            }
        )
    module.print_report(args, 1000, "0.10, 0.20, 0.30", checks, run)
    lines = capsys.readouterr().out.splitlines()

    assert lines[0].startswith("- machine: ") and "MLServer 1.7.1 (TensorFlow 2.21.0" in lines[1]
    rows = markdown_rows(lines, "protocol, clients, server")
    assert list(rows) == [
        "KServe v2 REST, 1, lifecycle serve",
        "KServe v2 REST, 1, MLServer",
        "KServe v2 REST, 16, lifecycle serve",
        "KServe v2 REST, 16, MLServer",
        "TF Serving REST, 1, lifecycle serve",
        "TF Serving REST, 16, lifecycle serve",
    ]
    assert rows["KServe v2 REST, 1, lifecycle serve"][1:] == [
        "900 (800-1,000)", "5.00 (5.00-5.00)", "10.00 (10.00-10.00)", "1.00 (1.00-1.00)", "0",
        "-", "-",
    ]  # fmt: skip
    # Failures summed over the rounds; lifecycle's over the peer's, within each round.
    assert rows["KServe v2 REST, 16, MLServer"][5:] == [
        "3", "2.00x (2.00-2.00)", "0.25x (0.25-0.25)"
    ]  # fmt: skip
    swaps = markdown_rows(lines, "server")
    # Every swap under load; p99 over the steady p99 of the same round at 16 clients.
    assert swaps["lifecycle serve"][2:6] == ["4", "1.50 (1.00-2.00)", "30.50 (30.00-31.00)",
                                             "3.05x (3.00-3.10)"]  # fmt: skip
    assert swaps["MLServer"][2:6] == ["2", "0.10 (0.10-0.10)", "40.00 (40.00-40.00)",
                                      "2.00x (2.00-2.00)"]  # fmt: skip
    memory = markdown_rows(lines[lines.index("### Unload + load cycles") :], "server")
    assert memory["lifecycle serve"][1:] == [
        "4", "700", "700", "+0.00 (+0.00-+0.00)", "+0.00", "0.60 (0.50-0.70)", "0"
    ]  # fmt: skip
    # Two rounds of 30 MiB a cycle, 40 MiB more between them: 30 MiB a cycle over all.
    assert memory["MLServer"][1:] == [
        "2", "1,200", "1,360", "+30.00 (+30.00-+30.00)", "+30.00", "0.20 (0.20-0.20)", "2"
    ]  # fmt: skip
    assert "- errors of MLServer: ['POST .../load: status 500'" in "\n".join(lines)
    assert (
        "- RSS of MLServer, MiB, before and after each cycle, rounds joined: 1200 1230 1260 1290 "
        "1320 (each round's start as measured: 1,200, 1,300)"
    ) in lines
    assert lines[-1] == "- KServe skipped: --kserve-venv not given; ..."


def stalls_child_result(max_gap: float, p99: float, **more) -> dict:
    """A stall benchmark child's result with the keys the report reads."""
    return {
        "calls": 1000,
        "workload_s": 10.0,
        "max_gap_ms": max_gap,
        "p99_gap_ms": p99,
        "p999_gap_ms": 2 * p99,
        "median_gap_ms": 2.05,
        "median_latency_ms": 0.4,
        "p99_latency_ms": 3.0,
        "max_latency_ms": max_gap - 1,
        "max_gap_at_s": 4.0,
        "gc_in_max_gap_ms": 0.0,
        "gc_in_max_gap_thread": None,
        "gc_collections": 100,
        "gc_total_ms": 300.0,
        "gc_max_ms": 50.0,
        "serving_gc_collections": 10,
        "serving_gc_max_ms": 5.0,
        "lib_gc_collections": 0,
        "lib_gc_total_ms": 0.0,
        "lib_gc_max_ms": 0.0,
        **more,
    }


# What the stall benchmark's library child adds to its result: the cleaner's statistics.
STALLS_LIBRARY_STATISTICS = {
    "collections": 2,
    "max_collection_seconds": 0.25,
    "blocking_seconds": 0.5,
    "models_cleaned": 2,
    "models_disposed": 3,
    "cleaner_queue": 0,
}


def test_the_stalls_table_compares_the_library_with_plain_keras_within_each_round(
    load_script, monkeypatch, capsys
):
    module = load_script("stalls.py")
    args = module.parse_args(["--rounds", "2"])
    library = STALLS_LIBRARY_STATISTICS
    # Plain's max gap drifts between rounds; the library's difference to it does not.
    fake_children(
        monkeypatch,
        module,
        {
            "plain": [stalls_child_result(100.0, 8.0), stalls_child_result(300.0, 10.0)],
            "library": [
                stalls_child_result(110.0, 8.4, **library),
                stalls_child_result(350.0, 13.0, **library),
            ],
        },
    )

    assert module.run_parent(args) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = table(lines, "variant", "max gap ms")
    plain, library = rows["plain Keras"], rows["lc.manage + dispose()/cleaner"]
    assert plain[1] == "200.0 (100.0-300.0)"
    assert plain[6:8] == ["-", "-"]  # no library statistics from plain Keras
    assert plain[-2:] == ["+0.0 (+0.0-+0.0)", "1.00x (1.00-1.00)"]
    assert library[6:8] == ["250.0 (250.0-250.0)", "0.50 (0.50-0.50)"]
    # Per round: +10 and +50 ms; 1.05x and 1.3x.
    assert library[-2:] == ["+30.0 (+10.0-+50.0)", "1.18x (1.05-1.30)"]
    assert "  max gap library - plain <= +20 ms: MISSED (median +30.0 ms, 2 rounds)" in lines
    assert "  p99 gap library / plain <= 1.2x: met (median 1.18x, 2 rounds)" in lines
    assert any(line.startswith("  library, last round: ") for line in lines)


def test_the_stalls_targets_are_not_measured_when_every_child_fails(
    load_script, monkeypatch, capsys
):
    # The rest of this report is checked for every script, stalls.py among them, by
    # test_a_benchmark_whose_children_all_fail_still_reports_and_exits_1.
    module = load_script("stalls.py")
    args = module.parse_args(["--rounds", "2"])
    started = fake_children(monkeypatch, module, None)

    assert module.run_parent(args) == 1
    assert started == ["plain", "library", "library", "plain"]
    assert "max gap library - plain <= +20 ms: not measured" in capsys.readouterr().out


def test_the_stalls_options_check_their_values(load_script):
    module = load_script("stalls.py")
    args = module.parse_args(["--variants", "library", "--interval-ms", "5"])
    assert args.variants == ["library"] and args.interval_ms == 5.0
    assert (args.models, args.steps, args.input_size, args.rounds) == (6, 2, 64, 3)
    assert module.child_options(args) == [
        *("--models", "6", "--steps", "2", "--input-size", "64", "--interval-ms", "5.0")
    ]
    for bad in (["--input-size", "31"], ["--interval-ms", "0"], ["--models", "0"]):
        with pytest.raises(SystemExit):
            module.parse_args(bad)


def test_the_stalls_benchmark_measures_gaps_between_call_starts(load_script):
    module = load_script("stalls.py")
    starts = [0.0, 0.002, 0.004, 0.104, 0.106]
    summary = module.gap_summary(starts, [0.001, 0.001, 0.099, 0.001, 0.001])
    assert summary["calls"] == 5
    assert summary["max_gap_ms"] == pytest.approx(100.0)
    assert summary["max_gap_index"] == 3  # the call that ended the longest gap
    assert summary["median_gap_ms"] == pytest.approx(2.0)
    assert summary["max_latency_ms"] == pytest.approx(99.0)
    with pytest.raises(ValueError, match="at least 2 calls"):
        module.gap_summary([0.0], [0.001])


def test_the_stalls_benchmark_counts_collections_apart_by_thread(load_script):
    module = load_script("stalls.py")
    watch = module.GcWatch()
    watch.events = [
        (0.0, 0.010, "MainThread"),
        (0.020, 0.050, "lifecycle-cleaner-default"),
        (0.060, 0.065, "serving"),
    ]
    summary = watch.summary()
    assert summary["gc_collections"] == 2 and summary["gc_max_ms"] == pytest.approx(10.0)
    assert summary["lib_gc_collections"] == 1
    assert summary["lib_gc_total_ms"] == pytest.approx(30.0)
    assert summary["serving_gc_collections"] == 1
    assert summary["serving_gc_max_ms"] == pytest.approx(5.0)
    inside, thread = watch.inside(0.005, 0.040)
    assert inside == pytest.approx(25.0) and thread == "lifecycle-cleaner-default"
    assert watch.inside(0.1, 0.2) == (0.0, None)
    assert module.per_round_differences([3.0, None, 5.0], [1.0, 2.0, 5.0]) == [2.0, 0.0]
    with pytest.raises(ValueError, match="one value per round"):
        module.per_round_differences([1.0], [])


def test_the_kfold_folds_are_kfolds_with_or_without_scikit_learn(load_script, monkeypatch):
    from sklearn.model_selection import KFold

    module = load_script("kfold.py")
    indices = list(range(23))
    expected = [(list(train), list(test)) for train, test in KFold(n_splits=5).split(indices)]
    splits, splitter = module.fold_splits(23, 5)
    assert splitter == "sklearn KFold"
    assert [(list(train), list(test)) for train, test in splits] == expected
    assert module.fold_sizes(23, 5) == [(len(train), len(test)) for train, test in expected]

    monkeypatch.setitem(sys.modules, "sklearn.model_selection", None)  # import fails
    splits, splitter = module.fold_splits(23, 5)
    assert splitter == "numpy array_split"
    assert [(list(train), list(test)) for train, test in splits] == expected


def test_the_kfold_steps_and_steady_step_time_leave_out_each_folds_first_batch(load_script):
    module = load_script("kfold.py")
    assert module.steps_per_fold(512, 16, 1) == 32
    assert module.steps_per_fold(513, 16, 2) == 66
    # The first batch of each fold traces: 9.0 and 7.0 are left out.
    assert module.steady_step_ms([[9.0, 0.1, 0.3], [7.0, 0.2]]) == pytest.approx(200.0)
    assert module.steady_step_ms([[9.0], [7.0]]) is None
    assert module.spans([32]) == "32" and module.spans([25, 26]) == "25-26"


@pytest.mark.parametrize(
    "argv",
    [
        ["--folds", "1"],
        ["--input-size", "31"],
        ["--samples", "3", "--folds", "4"],
        ["--batch", "0"],
    ],
)
def test_the_kfold_options_refuse_what_cannot_run(load_script, argv):
    module = load_script("kfold.py")
    with pytest.raises(SystemExit):
        module.parse_args(argv)


def kfold_child_result(step_ms: float, steady: float, **extra: float) -> dict:
    """A k-fold benchmark child's result with the keys the report reads."""
    return {
        **{"splitter": "sklearn KFold", "step_ms": step_ms, "steady_step_ms": steady},
        **{"fold_s": 10.0, "total_s": 40.0, **extra},
    }


@pytest.mark.parametrize(
    ("second_step_ms", "ratio", "verdict"),
    [(202.0, "1.010x (1.010-1.010)", "met"), (210.0, "1.030x (1.010-1.050)", "missed")],
)
def test_the_kfold_table_compares_the_library_with_plain_round_by_round(
    load_script, monkeypatch, capsys, second_step_ms, ratio, verdict
):
    module = load_script("kfold.py")
    args = module.parse_args(["--rounds", "2", "--folds", "4", "--samples", "100"])
    result = kfold_child_result
    cleaner = {"collections": 2, "max_collection_seconds": 0.05, "blocking_seconds": 0.2}
    cleaner["models_disposed"] = 4
    started = fake_children(
        monkeypatch,
        module,
        {
            # The machine slows down in round 2; the ratios are taken within each round.
            "plain": [result(100.0, 80.0), result(200.0, 160.0)],
            "library": [result(101.0, 80.0, **cleaner), result(second_step_ms, 160.0, **cleaner)],
        },
    )

    assert module.run_parent(args) == 0
    assert started == ["plain", "library", "library", "plain"]
    lines = capsys.readouterr().out.splitlines()
    rows = table(lines, "variant", "step ms")
    assert rows["plain"][1:] == [
        *("150.0 (100.0-200.0)", "120.0 (80.0-160.0)", "10.0 (10.0-10.0)", "40.0 (40.0-40.0)"),
        *("1.000x (1.000-1.000)", "1.000x (1.000-1.000)"),
    ]
    assert rows["library"][5:] == [ratio, "1.000x (1.000-1.000)"]
    assert any(
        "100 random images" in line and "4 folds (sklearn KFold)" in line and "75 training" in line
        for line in lines
    ), lines
    target = next(line for line in lines if line.startswith("target:"))
    assert "<= 1.02x" in target and f"step {ratio.split()[0]}, {verdict};" in target
    assert target.endswith("steady step 1.000x, met"), target
    note = next(line for line in lines if line.startswith("  library:"))
    assert "models disposed 4 (4-4)" in note and "longest 50.0 ms (50.0-50.0)" in note


def test_the_kfold_report_marks_failed_children_and_compares_nothing(
    load_script, monkeypatch, capsys
):
    # The rest of this report is checked for every script, kfold.py among them, by
    # test_a_benchmark_whose_children_all_fail_still_reports_and_exits_1.
    module = load_script("kfold.py")
    args = module.parse_args(["--rounds", "2"])
    fake_children(monkeypatch, module, None)

    assert module.run_parent(args) == 1
    out = capsys.readouterr().out
    assert table(out.splitlines(), "variant", "step ms")["library"][1] == "FAILED"
    assert "step not compared" in out
    assert "plain in round 1" in out


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_dispose_benchmark_runs_each_variant_in_a_child_process():
    # The harness end to end, with real children, on the cheapest workload: a 1 MiB
    # MLP disposed by one child and dropped the plain way by the other.
    lines = run_benchmark(
        "dispose.py",
        *("--rounds", "1", "--variants", "mlp,plain-mlp", "--mlp-mb", "1", "--models", "2"),
    )
    rows = table(lines, "model", "buffers")
    assert set(rows) == {"mlp"}
    mlp = rows["mlp"]
    # Its own ratio, the buffers and MiB its dispose() released, the user's
    # path and the settled figure, and the plain drop's time from the other child.
    assert mlp[4] == "1.00x", mlp
    assert int(mlp[1]) > 0 and float(mlp[2]) > 0, mlp
    assert float(mlp[3]) > 0 and float(mlp[5]) > 0 and float(mlp[8]) > 0, mlp
    assert float(mlp[-1]) > 0, mlp


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_loop_benchmark_prints_one_row_per_variant():
    lines = run_benchmark(
        "loop_training.py",
        *("--rounds", "1", "--cycles", "3", "--units", "32", "--variants", "a,c,dispose"),
        *("--dispose-mb", "1"),
    )
    rows = table(lines, "variant")
    assert "(a) del model" in rows and "(c) ManagedModel + dispose()" in rows
    assert "(c) dispose() of a 1 MiB model" in rows
    # The managed row shows the megabytes it released, not a dash, and its
    # time per cycle against (a)'s in the same round.
    managed = rows["(c) ManagedModel + dispose()"]
    assert managed[-3] != "-" and float(managed[-3]) > 0
    assert managed[-1] != "-" and managed[-1][0] in "+-"  # the RSS growth after warm-up
    assert managed[4].endswith("x") and float(managed[4][:-1]) > 0
    assert rows["(a) del model"][4] == "1.00x"


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_cleaner_benchmark_prints_latency_rows():
    lines = run_benchmark(
        "cleaner.py", *("--rounds", "1", "--seconds", "3", "--variants", "naive,bg")
    )
    rows = table(lines, "variant", "requests")
    assert [label.split(":")[0] for label in rows] == ["naive", "bg"]
    assert all("FAILED" not in row for row in rows.values())
    assert rows["naive: gc.collect() on request thread"][-1] == "1.00x"
    assert rows["bg: IN_BACKGROUND"][-1].endswith("x")
    assert any(line.startswith("  bg, last round: ") for line in lines)


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_hot_swap_benchmark_swaps_without_failed_requests():
    lines = run_benchmark(
        "hot_swap.py",
        *("--rounds", "1", "--seconds", "3", "--units", "256", "--min-swaps", "3"),
        *("--variants", "direct,registry,swaps,background"),
    )
    rows = {
        label.split(":")[0]: cells for label, cells in table(lines, "variant", "requests/s").items()
    }
    assert {
        "direct",
        "registry",
        "registry-swaps",
        "swaps + tuned + frozen + background loads",
    } <= set(rows)
    for row in rows.values():
        assert row[-1] == "0", row  # failed requests
    for label in ("registry-swaps", "swaps + tuned + frozen + background loads"):
        assert int(rows[label][-2]) >= 3, rows[label]  # swaps
    ratios = {
        label.split(":")[0]: cells for label, cells in table(lines, "variant", "vs direct").items()
    }
    assert ratios["direct"][1] == "1.00x" and ratios["registry"][2] == "1.00x"
    assert float(ratios["registry-swaps"][1][:-1]) > 0
    # Peak RSS over (old + new) and RSS after the drain, for the swapping variants.
    assert float(ratios["registry-swaps"][3]) > 0 and ratios["direct"][3] == "-"


@pytest.mark.subprocess
def test_checkpoint_benchmark_compares_every_operation_with_plain():
    lines = run_benchmark("checkpoints.py", *("--units", "128", "--rounds", "2"))
    rows = table(lines, "operation")
    assert {"plain save", "keeper save", "plain restore", "keeper restore"} <= set(rows)
    # Two rounds: each cell is the median with its range; plain against itself is 1.
    assert rows["plain save"][2] == "1.00x (1.00-1.00)"
    for row in rows.values():
        ratio = re.fullmatch(r"(\d+\.\d\d)x \((\d+\.\d\d)-(\d+\.\d\d)\)", row[2])
        assert ratio, row
        median, low, high = map(float, ratio.groups())
        assert 0 < low <= median <= high, row


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_serve_benchmark_compares_the_servers_and_swaps_without_failed_requests():
    lines = run_benchmark(
        "serve.py",
        *("--rounds", "1", "--seconds", "3", "--warmup", "1", "--clients", "2"),
        *("--units", "32", "--swap-every", "1", "--poll-wait", "0.5", "--min-swaps", "0"),
    )
    rows = {line.split("  ")[0]: line.split() for line in lines if line.startswith("(")}
    for label in (
        "(a) hand-written",
        "(b) lifecycle serve, steady",
        "(c) lifecycle serve +",
        "(d) lifecycle serve on h11",
    ):
        row = next((r for name, r in rows.items() if name.startswith(label)), None)
        assert row is not None, lines
        assert row[-1] == "0" and int(row[-2].replace(",", "")) > 0, row  # 0 failed of > 0
    assert rows["(b)/(a) requests/s"][2].endswith("x")
    assert rows["(b)/(d) requests/s"][2].endswith("x")
    # (d) runs without the serve extra's C HTTP stack, the others with it.
    stack = "httptools, uvloop"
    assert f"C HTTP modules loaded: (a) {stack}; (b) {stack}; (c) {stack}; (d) none" in lines
    swaps = next(line for line in lines if line.startswith("swaps: "))
    assert int(swaps.split()[1]) > 0, swaps


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_sweeps_benchmark_compares_plain_and_managed_on_the_same_search():
    lines = run_benchmark("sweeps.py", *("--trials", "2", "--rounds", "1", "--units", "16,32"))
    rows = {
        line.split("  ")[0]: line.split() for line in lines if line.startswith(("plain", "man"))
    }
    plain, managed = rows["plain kt.RandomSearch"], rows["managed_tuner(kt.RandomSearch)"]
    # The same seeded search finds the same best trial; only the managed one releases.
    assert plain[-3:] == managed[-3:]
    assert plain[-4] == "-" and float(managed[-4]) >= 0


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_sweep_benchmark_compares_managed_with_plain():
    lines = run_benchmark(
        "sweep.py",
        *("--rounds", "1", "--archs", "MobileNetV3Small", "--size", "32", "--eager"),
        *("--settle", "0", "--variants", "plain,managed"),
    )
    # Cells are separated by two spaces or more; a growth cell holds single spaces.
    rows = {
        cells[0].split(":")[0]: cells
        for cells in (re.split(r"\s{2,}", line) for line in lines)
        if cells[0].startswith(("plain:", "managed:"))
    }
    assert rows["plain"][3] == "1.000", rows
    assert float(rows["managed"][3]) > 0, rows
    assert any("cleaner trims" in line for line in lines)


def check_batching_part(lines: list[str], served: bool) -> None:
    """One part of the batching benchmark's report: its table, ratios and targets."""
    rows = {line.split("  ")[0].strip(): line.split() for line in lines if " / o" in line}
    assert set(rows) == {"1 / off", "1 / on", "4 / off", "4 / on"}, lines
    # Failed requests, then (served only) the server's and the load generator's CPU.
    failed = -5 if served else -1
    for label, cells in rows.items():
        assert cells[failed] == "0", (label, cells)
        assert float(cells[3].replace(",", "")) > 0, (label, cells)  # requests/s
        if served:
            assert float(cells[-4]) > 0 and float(cells[-2]) > 0, (label, cells)
    # Batching on reports its requests per batch (median, then spread), off a dash.
    on, off = rows["4 / on"], rows["4 / off"]
    assert float(on[failed - 2]) >= 1.0 and on[failed - 1].startswith("("), on
    assert off[failed - 1] == "-", off
    # The ratio table: clients, then on/off ratios such as "1.23x (1.01-1.40x)".
    ratio_rows = [cells for cells in map(str.split, lines) if cells[1:2] and cells[1][-1] == "x"]
    assert [row[0] for row in ratio_rows] == ["1", "4"], lines
    assert all(row[1].endswith("x") and float(row[1][:-1]) > 0 for row in ratio_rows)
    assert any(line.startswith("  1 clients, throughput on/off >= 0.95x: ") for line in lines)
    assert "  no failed request: met (0 failed)" in lines


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_batching_benchmark_measures_off_and_on_in_process_and_served():
    lines = run_benchmark(
        "batching.py",
        *("--rounds", "1", "--seconds", "1", "--warmup", "0.5"),
        *("--units", "256", "--clients", "1,4", "--return-wait", "0.5"),
    )
    assert any(line.startswith("batching: ") and "return_wait 0.5;" in line for line in lines)
    served = lines.index("through lifecycle serve (TF Serving REST :predict):")
    in_process = lines.index("in-process (registry.predict):")
    assert in_process < served, lines
    check_batching_part(lines[in_process:served], served=False)
    check_batching_part(lines[served:], served=True)


@pytest.mark.subprocess
@pytest.mark.benchmark
def test_serving_call_benchmark_times_every_way_against_tf_function():
    lines = run_benchmark("serving_call.py", *("--units", "8", "--rounds", "2", "--calls", "20"))
    rows = {
        split_cells(line)[1]: split_cells(line)
        for line in lines
        if line.startswith("MLP 256-8-8-16")
    }
    assert set(rows) == {
        "eager model(x)",
        "tf.function",
        "concrete function",
        "lc.serving_function",
        "registry.predict",
        "registry.predict, batched",
    }
    assert rows["tf.function"][3] == rows["concrete function"][4] == "1.00x (1.00-1.00)"
    for row in rows.values():
        assert re.fullmatch(r"\d+ \(\d+-\d+\)", row[2]), row
        for ratio in row[3:]:
            assert re.fullmatch(r"\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)", ratio), row


@pytest.mark.subprocess
@pytest.mark.benchmark
def test_worker_hop_benchmark_measures_every_way_on_both_loops():
    lines = run_benchmark(
        "worker_hop.py", *("--rounds", "2", "--seconds", "0.1", "--clients", "1,4")
    )
    rows = [split_cells(line) for line in lines if line.startswith(("asyncio ", "uvloop "))]
    assert [row[:3] for row in rows] == [
        [loop, clients, way]
        for loop in ("asyncio", "uvloop")
        for clients in ("1", "4")
        for way in ("lifecycle pool", "ThreadPoolExecutor", "asyncio.to_thread", "anyio to_thread")
    ]
    for row in rows:
        assert re.fullmatch(r"\d+\.\d \(\d+\.\d-\d+\.\d\)", row[3]), row
        assert re.fullmatch(r"\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)", row[4]), row
        assert float(row[5].split()[0].replace(",", "")) > 0, row
    assert {row[4] for row in rows if row[2] == "lifecycle pool"} == {"1.00x (1.00-1.00)"}


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_dispose_benchmark_compares_an_application_with_the_mlp():
    # MobileNetV2 rather than ResNet50: as many buffers to release, built in less time.
    lines = run_benchmark(
        "dispose.py",
        *("--rounds", "1", "--variants", "mlp,mobilenetv2,plain-mlp", "--models", "2"),
        *("--input-size", "32", "--mlp-mb", "4"),
    )
    rows = table(lines, "model", "buffers")
    assert set(rows) == {"mlp", "mobilenetv2"}
    # The MLP's own ratios, MobileNetV2's (one round: no range), and its buffers
    # (weights, Adam slots, BN statistics).
    assert rows["mlp"][4] == "1.00x"
    assert float(rows["mobilenetv2"][4][:-1]) > 0 and float(rows["mobilenetv2"][3]) > 0
    assert int(rows["mobilenetv2"][1]) > 500
    # The plain drop was measured next to the managed MLP.
    assert float(rows["mlp"][-1]) > 0 and rows["mobilenetv2"][-1] == "-"


@pytest.mark.subprocess
@pytest.mark.benchmark
def test_allocator_benchmark_times_each_setting_and_sees_what_it_does():
    lines = run_benchmark(
        "allocator.py",
        *("--rounds", "1", "--models", "mlp", "--steps", "2", "--calls", "3"),
        *("--variants", "pool,lc-system,nodnn"),
    )
    rows = table(lines, "measurement", "pool", "lc-system", "nodnn")
    timed = {"MLP train step ms", "MLP batch-1 call ms", "MLP batch-32 call ms", "peak RSS MiB"}
    assert timed < set(rows), set(rows)
    for name in timed:
        row = rows[name]
        assert all(float(cell.replace(",", "")) > 0 for cell in row[1:4]), row
        assert all(re.fullmatch(r"\d+\.\d\dx", cell) for cell in row[4:]), row
    # The pool reports what it holds; the settings that avoid it hold nothing.
    pooled = [float(cell.split()[0].replace(",", "")) for cell in rows["MLP pooled MiB"][1:4]]
    assert pooled[0] > 0 and pooled[1:] == [0.0, 0.0], pooled
    # Each child's own check of its setting: only the pool keeps a dropped block mapped.
    kept = {
        line.split(":")[0].strip(): float(line.rsplit(": ", 1)[1].split()[0])
        for line in lines
        if "of a dropped 64 MiB tensor still mapped" in line
    }
    assert kept["pool"] >= 60 and kept["lc-system"] < 4 and kept["nodnn"] < 4, kept


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_peers_benchmark_serves_one_model_from_each_server_it_finds():
    # Each peer runs from its virtualenv (LIFECYCLE_<PEER>_VENV, /tmp/peer-<peer> by
    # default), and is skipped when there is none.
    venvs = {
        name: os.environ.get(f"LIFECYCLE_{name.upper()}_VENV", f"/tmp/peer-{name}")
        for name in ("kserve", "mlserver")
    }
    found = {name: venv for name, venv in venvs.items() if Path(venv, "bin", "python").is_file()}
    lines = run_benchmark(
        "peers.py",
        *(option for name, venv in found.items() for option in (f"--{name}-venv", venv)),
        *("--rounds", "1", "--seconds", "1", "--warmup", "0.5", "--clients", "1,2"),
        *("--units", "32", "--cycles", "2", "--settle", "0.2", "--swap-every", "0.5"),
    )
    labels = {"lifecycle": "lifecycle serve", "kserve": "KServe", "mlserver": "MLServer"}
    served = ["lifecycle", *found]
    throughput = markdown_rows(lines, "protocol, clients, server")
    for name in served:
        for clients in (1, 2):
            row = throughput[f"KServe v2 REST, {clients}, {labels[name]}"]
            assert float(row[1].replace(",", "")) > 0 and row[5] == "0", row
    assert {row.split(", ")[-1] for row in throughput if row.startswith("TF Serving")} == {
        labels[name] for name in served if name != "mlserver"
    }
    swaps = markdown_rows(lines, "server")
    memory = markdown_rows(lines[lines.index("### Unload + load cycles") :], "server")
    assert set(swaps) == set(memory) == {labels[name] for name in served}
    for name in served:
        assert swaps[labels[name]][-1] == "0", swaps  # no failed request during swaps
        assert memory[labels[name]][1] == "2" and memory[labels[name]][-1] == "0", memory
    for name in set(venvs) - set(found):
        skipped = next(line for line in lines if line.startswith(f"- {labels[name]} skipped: "))
        assert "python3 -m venv" in skipped, skipped


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_stalls_benchmark_measures_the_serving_thread_in_both_variants():
    lines = run_benchmark(
        "stalls.py",
        *("--rounds", "1", "--models", "2", "--steps", "1", "--input-size", "32"),
        timeout=400,
        wait=900,
    )
    rows = table(lines, "variant", "max gap ms")
    plain, library = rows["plain Keras"], rows["lc.manage + dispose()/cleaner"]
    # One round: no range; the serving thread ran, a gap is at least the interval.
    assert float(plain[1]) >= 2.0 and float(library[1]) >= 2.0
    assert 1.5 < float(plain[4]) < 10 and 1.5 < float(library[4]) < 10
    assert plain[-2:] == ["+0.0", "1.00x"] and plain[7] == "-"
    assert library[-1].endswith("x") and float(library[7]) >= 0
    assert any(line.startswith("  max gap library - plain <= +20 ms: ") for line in lines)
    assert "models disposed 1" in next(ln for ln in lines if ln.startswith("  library, last"))


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.benchmark
def test_kfold_benchmark_times_plain_and_library_training():
    lines = run_benchmark(
        "kfold.py",
        *("--rounds", "1", "--folds", "2", "--samples", "64", "--input-size", "32"),
        timeout=600,
        wait=1300,
    )
    rows = table(lines, "variant", "step ms")
    assert set(rows) == {"plain", "library"}
    for row in rows.values():
        assert all(float(cell) > 0 for cell in row[1:5]), row
    # One round: each ratio is that round's, plain's against itself.
    assert rows["plain"][5:] == ["1.000x", "1.000x"]
    assert all(re.fullmatch(r"\d+\.\d{3}x", cell) for cell in rows["library"][5:])
    # The library's child disposed the model of each of its two folds.
    assert any(line.startswith("  library: models disposed 2;") for line in lines), lines
