"""Worker-hop benchmark: what handing a blocking call to a thread costs the server.

``lifecycle serve`` answers every request on its event loop and runs the
blocking part (the registry's call into the model) on a worker thread, then
hands the result back to the loop: one hop there and back per request. The
server does it with a small pool of its own (``lifecycle.server._http``: a
queue, threads started on demand, the result set with
``loop.call_soon_threadsafe``). This benchmark compares that hop with the
ready-made ways of the standard library and of Starlette's own stack:

    lifecycle pool         ``lifecycle.server._http.blocking(fn)``
    ThreadPoolExecutor     ``loop.run_in_executor(pool, ...)``, a
                           ``concurrent.futures.ThreadPoolExecutor`` of as many
                           threads (40), the caller's context copied as the
                           server's hop does
    asyncio.to_thread      ``asyncio.to_thread(fn)`` (the loop's default
                           executor; copies the context)
    anyio to_thread        ``anyio.to_thread.run_sync(fn)``: what Starlette's
                           ``run_in_threadpool`` calls

``--clients`` tasks (1 and 16 by default) each await the hop of a call that
does almost nothing (``--work`` additions in Python, 0 by default) back to back,
on asyncio's event loop and on uvloop's (the server's, when installed;
``--loops``). Each way runs ``--seconds`` per round (after a warm-up round), the
order rotating between rounds, all in one process. The table gives, per loop
and client count, the process's CPU time per call (``time.process_time``, every
thread) and calls per second: medians over the rounds (min-max), and each way's
CPU per call over the lifecycle pool's in the same round (median of the
per-round ratios). What it shows is the hop alone; a server's request costs
several times more around it (HTTP, JSON, the model).

Run (from the repository root, with the package and its ``serve`` extra)::

    python benchmarks/worker_hop.py                        # about 1 minute
    python benchmarks/worker_hop.py --rounds 2 --seconds 0.2 --clients 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _harness

WAYS = ("lifecycle pool", "ThreadPoolExecutor", "asyncio.to_thread", "anyio to_thread")
REFERENCE = "lifecycle pool"
LOOPS = ("asyncio", "uvloop")
HEADER = ["loop", "clients", "way", "CPU µs per call", "vs lifecycle pool", "calls/s"]
# As many threads as the lifecycle pool and anyio's default limiter allow.
THREADS = 40

Hop = Callable[[Callable[[], Any]], Awaitable[Any]]
# By client count, then way: (CPU seconds per call, calls per second), one per round.
Results = dict[int, dict[str, list[tuple[float, float]]]]


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


def busy(additions: int) -> Callable[[], int]:
    """A call that adds ``additions`` numbers in Python (the GIL held throughout)."""

    def call() -> int:
        total = 0
        for number in range(additions):
            total += number
        return total

    return call


async def phase(
    hop: Hop, call: Callable[[], Any], clients: int, seconds: float
) -> tuple[float, float]:
    """``clients`` tasks awaiting ``hop(call)`` back to back for ``seconds``.

    Returns:
        CPU seconds per call (every thread of the process) and calls per second.
    """
    deadline = time.perf_counter() + seconds
    calls = 0

    async def client() -> None:
        nonlocal calls
        while time.perf_counter() < deadline:
            await hop(call)
            calls += 1

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return cpu / max(calls, 1), calls / elapsed


async def measure_loop(args: argparse.Namespace) -> Results:
    """Each way's hop measured in rounds, for every client count."""
    ways = hops()
    call = busy(args.work)
    results: Results = {}
    for clients in args.clients:
        results[clients] = {way: [] for way in WAYS}
        for round_ in range(args.rounds + 1):  # round 0 warms up (threads started)
            for way in _harness.rotation(list(WAYS), round_):
                outcome = await phase(ways[way], call, clients, args.seconds)
                if round_:
                    results[clients][way].append(outcome)
    return results


def run_loop(name: str, args: argparse.Namespace) -> Results:
    """``measure_loop`` on a fresh event loop of kind ``name``."""
    if name == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(measure_loop(args))
    return asyncio.run(measure_loop(args))


def rows(name: str, results: Results) -> list[list[str]]:
    table = []
    for clients, ways in results.items():
        reference = [cpu for cpu, _ in ways[REFERENCE]]
        for way in WAYS:
            cpu = [cpu for cpu, _ in ways[way]]
            table.append(
                [
                    name,
                    str(clients),
                    way,
                    _harness.fmt_spread([1e6 * c for c in cpu], ".1f"),
                    _harness.fmt_spread(_harness.per_round_ratios(cpu, reference), ".2f", "x"),
                    _harness.fmt_spread([rate for _, rate in ways[way]], ",.0f"),
                ]
            )
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument(
        "--clients",
        type=_harness.positive_ints,
        default=[1, 16],
        help="comma-separated counts of concurrent callers",
    )
    parser.add_argument(
        "--loops",
        default=",".join(LOOPS),
        help=f"comma-separated event loops, of {', '.join(LOOPS)}",
    )
    parser.add_argument("--work", type=int, default=0, help="Python additions per call (>= 0)")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per way per round")
    parser.add_argument(
        "--rounds", type=_harness.positive_int, default=7, help="measured rounds, after a warm-up"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    args = parser.parse_args(argv)
    if args.work < 0 or args.seconds <= 0 or args.timeout <= 0:
        parser.error("--work must be >= 0, --seconds and --timeout positive")
    args.loops = _harness.parse_variants(parser, args.loops, LOOPS, option="--loops")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.alarm(max(1, int(args.timeout)))  # SIGALRM ends a run that hangs
    table = []
    for name in args.loops:
        table.extend(rows(name, run_loop(name, args)))
    signal.alarm(0)
    description = [
        *_harness.machine_lines(),
        f"calls:    each client awaits the hop of a call of {args.work} Python additions, "
        "back to back",
        f"rounds:   {args.rounds} of {args.seconds} s per way after a warm-up round, in one "
        "process, the order of the ways rotating between rounds",
    ]
    legend = [
        "CPU µs per call:   the process's CPU time (every thread) over the calls; median",
        "                   over the rounds (min-max)",
        "vs lifecycle pool: CPU per call over the lifecycle pool's in the same round; median",
        "                   of the per-round ratios (min-max)",
        "calls/s:           calls completed per second; median over the rounds (min-max)",
    ]
    _harness.print_report(description, HEADER, table, legend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
