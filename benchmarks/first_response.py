"""First response: from a new version's rename to its first answer, under load.

Two ``lifecycle serve`` processes on 127.0.0.1 poll their base paths every
``--poll-wait`` s, serving the MLP of ``hot_swap.py`` (``--units`` wide):

    background  every load in the background (``--loader_foreground_bytes 0``,
                the setting before small versions loaded in the foreground)
    default     the default (small versions in the foreground, up to 40 MiB)

In rounds, the order rotating, each gets a phase: a child runs ``--clients``
threads sending KServe v2 infer back to back (its answer names the version),
``--warmup`` s, ``--seconds`` steady, then ``--swaps`` new versions, each copied
aside and renamed into place once the previous one answered and 1-2 s more
(drawn at random, so that the renames fall at every phase of the poll). Per
phase: the median time from a rename to the first answer by the new version
(every swap's in the JSON, the ``series`` of ``first_response_s``),
the swaps answered within 1 s, the p99 of the steady window and of the swapping
one, and the failed requests. The settings are compared with the default.

Needs ``pip install -e '.[serve,bench]'``. Run (from the repository root)::

    python benchmarks/first_response.py --units 1200 --seconds 10   # 6.8 MiB, ~7 min
    python benchmarks/first_response.py --quick
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import _harness
import serve
from _harness import Metric, Option, load, servers

SETTINGS = {"background": ["--loader_foreground_bytes", "0"], "default": []}
SETTLE_SECONDS = (1.0, 2.0)  # after a version's first answer, before the next rename
TARGET_SECONDS = 1.0
STEADY, SWAPPING = 0, 1  # the request threads' phases
HEADERS = {"Content-Type": "application/json"}


def run_swaps(args: argparse.Namespace) -> dict[str, Any]:
    """A child's phase: clients sending while new versions are renamed into place."""
    port = int(args.url.rsplit(":", 1)[1])
    path = f"/v2/models/{serve.MODEL_NAME}"
    with urllib.request.urlopen(f"{args.url}{path}", timeout=30) as response:
        name = json.loads(response.read())["inputs"][0]["name"]
    [row] = json.loads(serve.request_body())["instances"]
    tensor = {"name": name, "shape": [1, len(row)], "datatype": "FP32", "data": row}
    body = json.dumps({"inputs": [tensor]}).encode()
    local, first_answer = threading.local(), {}

    def infer(phase: int) -> None:
        """One request on this thread's connection; the first answer by each version."""
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            local.connection.request("POST", f"{path}/infer", body, HEADERS)
            response = local.connection.getresponse()
            data = response.read()
        except Exception:
            local.connection.close()
            del local.connection
            raise
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {data[:200]!r}")
        first_answer.setdefault(int(json.loads(data)["model_version"]), time.perf_counter())

    threads = load.RequestThreads(infer, args.clients)
    rng, base = random.Random(args.seed), Path(args.base)
    firsts: list[float] = []
    try:
        time.sleep(args.warmup)
        threads.recording = True
        time.sleep(args.seconds)
        threads.phase = SWAPPING
        for new in range(args.first_version, args.first_version + args.swaps):
            shutil.copytree(args.model, base / f".tmp-{new}")
            os.rename(base / f".tmp-{new}", base / str(new))
            renamed = time.perf_counter()
            while new not in first_answer:
                if time.perf_counter() - renamed > load.SWAP_TIMEOUT:
                    raise RuntimeError(f"version {new} did not answer in {load.SWAP_TIMEOUT:g} s")
                time.sleep(0.002)
            firsts.append(first_answer[new] - renamed)
            time.sleep(rng.uniform(*SETTLE_SECONDS))
            shutil.rmtree(base / str(new - 1), ignore_errors=True)
    finally:
        threads.recording = False
        threads.stop()
    steady, swapping = (
        _harness.percentiles([lat / 1e6 for _, lat, p in threads.recorded() if p == phase], 99)[0]
        for phase in (STEADY, SWAPPING)
    )
    return {
        "first_response_s": _harness.percentiles(firsts, 50)[0],
        "first_responses_s": firsts,
        "within_target": sum(s <= TARGET_SECONDS for s in firsts) / len(firsts),
        "steady_p99_ms": steady,
        "swapping_p99_ms": swapping,
        "swapping_over_steady": swapping / steady if swapping and steady else None,
        "failed": sum(map(len, threads.failed)),
        "errors": threads.errors,
    }


def collect(args: argparse.Namespace) -> _harness.Runs:
    with servers.workspace("lifecycle-first-response-") as (work, running):
        serve.export_model(args.units, work / "model", args.timeout)
        for name, port in zip(args.variants, _harness.free_ports(2), strict=False):
            shutil.copytree(work / "model", work / f"base-{name}" / "1")
            flags = ["--file_system_poll_wait_seconds", str(args.poll_wait), *SETTINGS[name]]
            command = serve.lifecycle_serve(port, work / f"base-{name}", *flags)
            running[name] = servers.start_server(name, port, command, work / "logs")
        for server in running.values():
            servers.wait_ready(server, args.timeout, serve.post_predict)
        next_version = dict.fromkeys(running, 2)
        runs: _harness.Runs = []
        for index in range(args.rounds):
            runs.append({})
            for name in _harness.rotation(list(running), index):
                print(f"round {index + 1}: {name} ...", file=sys.stderr, flush=True)
                options = [*args.argv, "--url", running[name].url, "--seed", str(index)]
                options += ["--base", str(work / f"base-{name}"), "--model", str(work / "model")]
                options += ["--first-version", str(next_version[name])]
                done = _harness.spawn_child(Path(__file__), "swaps", options, args.timeout)
                running[name].check_alive()
                if done.result is None:
                    raise RuntimeError(f"the phase of {name} failed: {done.error}")
                next_version[name] += args.swaps
                runs[-1][name] = done.result
    return runs


BENCHMARK = _harness.Benchmark(
    name="first_response",
    doc=__doc__,
    variants={
        "background": "every load in the background (--loader_foreground_bytes 0)",
        "default": "small versions in the foreground (the default)",
    },
    metrics=[
        Metric(
            "first_response_s", "s", ".2f", "rename -> first response s", True, "first_responses_s"
        ),
        Metric("within_target", "share", ".2f", f"<= {TARGET_SECONDS:g} s", ratio=False),
        Metric("steady_p99_ms", "ms", ".1f", "p99 steady ms", ratio=False),
        Metric("swapping_p99_ms", "ms", ".1f", "p99 swapping ms"),
        Metric("swapping_over_steady", "x", ".2f", "p99 swapping / steady", ratio=False),
        Metric("failed", "", ".0f", "failed", ratio=False),
    ],
    measure=lambda role, args: run_swaps(args),
    collect=collect,
    options=[
        Option("--seconds", 20.0, "steady seconds per phase", _harness.positive_float),
        Option("--warmup", 2.0, "unmeasured seconds per phase"),
        Option("--clients", 4, "client threads", _harness.positive_int),
        Option("--units", 2048, "hidden width (2048: 4.76M params)", _harness.positive_int),
        Option("--poll-wait", 1.0, "--file_system_poll_wait_seconds", _harness.positive_float),
        Option("--swaps", 8, "new versions per phase", _harness.positive_int),
        *(Option(flag, None, argparse.SUPPRESS, str) for flag in ("--url", "--base", "--model")),
        Option("--first-version", 2, argparse.SUPPRESS),
        Option("--seed", 0, argparse.SUPPRESS),
    ],
    quick={"seconds": 2.0, "warmup": 1.0, "units": 32, "swaps": 2, "clients": 2},
    baseline="default",
    rounds=5,
    timeout=600.0,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
