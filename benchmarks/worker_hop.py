"""Worker hop: what handing a blocking call to a thread costs the server.

``lifecycle serve`` answers requests on its event loop and runs the model call
on a worker thread of its own small pool (``lifecycle.server._http.blocking``),
one hop there and back per request. This compares that hop with the ready-made
ways:

    lifecycle pool        ``lifecycle.server._http.blocking(fn)``
    ThreadPoolExecutor    ``loop.run_in_executor(pool, ...)``, 40 threads, the
                          caller's context copied as the server's hop does
    asyncio.to_thread     ``asyncio.to_thread(fn)``
    anyio to_thread       ``anyio.to_thread.run_sync(fn)`` (Starlette's
                          ``run_in_threadpool``)

``--clients`` tasks each await the hop of a call of ``--work`` Python additions,
back to back, on asyncio's loop and on uvloop's (``--loops``). Each way runs
``--seconds`` per round after a warm-up round, the order rotating, all in one
process: the process's CPU time per call (every thread) and calls per second,
compared with the lifecycle pool. It shows the hop alone; a request costs
several times more around it.

Run (from the repository root, with the package and its ``serve`` extra)::

    python benchmarks/worker_hop.py           # about 1 minute
    python benchmarks/worker_hop.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _harness
from _harness import Metric, Option

LOOPS = ("asyncio", "uvloop")
THREADS = 40  # as many as the lifecycle pool and anyio's default limiter allow
Hop = Callable[[Callable[[], Any]], Awaitable[Any]]


def hops() -> dict[str, Hop]:
    """Each way of running a blocking call on a thread and awaiting its result."""
    import anyio.to_thread

    from lifecycle.server._http import blocking

    executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="bench-executor")

    async def run_in_executor(function: Callable[[], Any]) -> Any:
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, functools.partial(context.run, function))

    return {
        "lifecycle pool": blocking,
        "ThreadPoolExecutor": run_in_executor,
        "asyncio.to_thread": asyncio.to_thread,
        "anyio to_thread": anyio.to_thread.run_sync,
    }


async def phase(hop: Hop, additions: int, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` tasks awaiting ``hop(call)`` back to back for ``seconds``."""
    deadline = time.perf_counter() + seconds
    calls = 0

    def call() -> int:
        total = 0
        for number in range(additions):  # in Python, the GIL held throughout
            total += number
        return total

    async def client() -> None:
        nonlocal calls
        while time.perf_counter() < deadline:
            await hop(call)
            calls += 1

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"cpu_us": 1e6 * cpu / max(calls, 1), "calls_per_s": calls / elapsed}


async def measure_loop(name: str, args: argparse.Namespace) -> _harness.Runs:
    ways = hops()
    runs: _harness.Runs = [{} for _ in range(args.rounds)]
    for clients in args.clients:
        for index in range(args.rounds + 1):  # round 0 warms up (threads started)
            for way in _harness.rotation(args.variants, index):
                found = await phase(ways[way], args.work, clients, args.seconds)
                if index:
                    cases = runs[index - 1].setdefault(way, {"cases": {}})["cases"]
                    cases[f"{name}, {clients} clients"] = found
    return runs


def collect(args: argparse.Namespace) -> _harness.Runs:
    runs: _harness.Runs = [{} for _ in range(args.rounds)]
    for name in args.loops:
        if name == "uvloop":
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                found = runner.run(measure_loop(name, args))
        else:
            found = asyncio.run(measure_loop(name, args))
        for run, more in zip(runs, found, strict=True):
            for way, result in more.items():
                run.setdefault(way, {"cases": {}})["cases"].update(result["cases"])
    return runs


BENCHMARK = _harness.Benchmark(
    name="worker_hop",
    doc=__doc__,
    variants={
        "lifecycle pool": "lifecycle.server._http.blocking(fn)",
        "ThreadPoolExecutor": "loop.run_in_executor, 40 threads, context copied",
        "asyncio.to_thread": "asyncio.to_thread(fn)",
        "anyio to_thread": "anyio.to_thread.run_sync(fn)",
    },
    metrics=[
        Metric("cpu_us", "µs", ".1f", "CPU µs per call"),
        Metric("calls_per_s", "calls/s", ",.0f", "calls/s", ratio=False),
    ],
    collect=collect,
    options=[
        Option("--clients", "1,16", "comma-separated concurrent callers", _harness.positive_ints),
        Option("--loops", ",".join(LOOPS), "comma-separated event loops", _harness.names(LOOPS)),
        Option("--work", 0, "Python additions per call"),
        Option("--seconds", 0.5, "seconds per way per round", _harness.positive_float),
    ],
    quick={"clients": "1,4", "seconds": 0.1, "rounds": 2},
    rounds=7,
)

if __name__ == "__main__":
    sys.exit(_harness.main(BENCHMARK))
