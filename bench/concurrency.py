"""Concurrent rollouts: hermes_async's loop vs the reference design, side by side.

Workload: N rollouts at once, each ``turns`` tool-calling turns and a final answer, against the
scripted model server (served from a *separate process* over loopback, with a per-response
latency, so its own CPU work does not count against the loop) and a tool with a fixed latency.

* **ours**: ``HermesAgentLoop`` Phase 2 (vLLM token streaming, incremental parsing, early
  dispatch); the tool is a coroutine (``anyio.sleep``).
* **baseline** (the reference's design, reproduced here only): the same loop, but every tool
  call runs as a blocking function through one shared ``ThreadPoolExecutor(max_workers=128)``
  via ``run_in_executor``, the calls of a rollout one after another, as the reference's
  ``_tool_executor`` did.

Both sides use the library's default limits (``Limits()``: 64 concurrent model requests),
except ``tool_calls``, raised to N: here a tool slot is a coroutine, and the default 128 (which
mirrors the reference's 128 threads) would cap a tool-bound workload at the baseline's rate.

Reported per N: completed rollouts per second, event-loop lag p50/p99 (a 5 ms ticker in the
same loop), cyclic-GC collections and their total pause, and resident memory per *idle* rollout
(all N parked inside their first tool call, measured in a separate pass; sandboxes excluded: the
tool needs none). Ratios are ours/baseline from the same process run (machines are noisy;
absolute numbers mean little).

The process applies :func:`hermes_async.gc_tuning.tune_gc_for_rollouts` once at start-up, as
``hermes-async demo`` and ``HermesAgentBaseEnv`` do, so both sides run with the same collector
settings; ``--gc default`` keeps CPython's defaults instead, to see what the tuning buys. In the
idle pass, ``--gc tuned,50000/10/10`` alternates collector settings (the library's tuning and
explicit thresholds, tuned the same way otherwise) pass by pass, beside ``--first-prompts``.

    .venv/bin/python bench/concurrency.py                      # N = 100, 500, 2000
    .venv/bin/python bench/concurrency.py --sizes 100 --tool-latency 0.5
    .venv/bin/python bench/concurrency.py --sizes 2000 --tool-latency 5 --modes ours --gc default
    .venv/bin/python bench/concurrency.py --sizes 10000 --modes ours --no-rss
    .venv/bin/python bench/concurrency.py --sizes 2000,10000 --rss-only   # idle RSS only
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.lowlevel
from _scripted import serve, server_process, tool_turns

from hermes_async import (
    HermesAgentLoop,
    Limits,
    Tool,
    ToolRegistry,
    ToolRuntime,
    load_tokenizer,
    open_sandbox_manager,
)
from hermes_async.gc_tuning import GCState, restore_gc, tune_gc_for_rollouts
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import open_lag_monitor
from hermes_async.testing import PolicyRequest

WAIT_SCHEMA: JSONObject = {
    "type": "object",
    "properties": {"seconds": {"type": "number"}},
    "required": ["seconds"],
}


def make_policy(turns: int, tool_latency: float) -> Callable[[PolicyRequest], str]:
    return tool_turns(turns, lambda _: {"name": "wait", "arguments": {"seconds": tool_latency}})


# ------------------------------------------------------------------------------ client side


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class GCWatch:
    """Counts cyclic-GC collections and their pauses (``gc.callbacks``).

    Each pause is timed twice: wall clock, and the collecting thread's CPU time. A pause whose
    CPU time is far below its wall time was the process waiting for a core (the scheduler ran
    something else), not the collector working.
    """

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.cpu: list[float] = []
        self.generations: list[int] = []
        self.collected: list[int] = []
        self._start = 0.0
        self._start_cpu = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            self._start_cpu = time.thread_time()
        else:
            self.pauses.append(time.perf_counter() - self._start)
            self.cpu.append(time.thread_time() - self._start_cpu)
            self.generations.append(info["generation"])
            self.collected.append(info["collected"])

    def clear(self) -> None:
        self.pauses.clear()
        self.cpu.clear()
        self.generations.clear()
        self.collected.clear()

    def by_generation(self) -> str:
        """Per generation: ``genG <runs>x <total>/<max> ms (CPU <total>/<max> ms, <n> freed)``."""
        parts = []
        rows = list(zip(self.pauses, self.cpu, self.generations, self.collected, strict=True))
        for generation in (0, 1, 2):
            mine = [(p, c, n) for p, c, g, n in rows if g == generation]
            if mine:
                wall = [p for p, _, _ in mine]
                cpu = [c for _, c, _ in mine]
                freed = sum(n for _, _, n in mine)
                parts.append(
                    f"gen{generation} {len(mine)}x {sum(wall) * 1e3:.0f}/{max(wall) * 1e3:.0f} ms"
                    f" (CPU {sum(cpu) * 1e3:.0f}/{max(cpu) * 1e3:.0f} ms, {freed} freed)"
                )
        return ", ".join(parts) or "none"


GC_WATCH = GCWatch()


@dataclass(frozen=True)
class Stall:
    """The start-up stall: the longest loop lag, and the most loop-thread CPU between two
    ticks, until every rollout made its first tool call (seconds)."""

    wall: float
    cpu: float


@dataclass
class Row:
    n: int
    mode: str
    seconds: float
    completed: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    lag_samples: int
    lag_over_20ms: int
    gc_collections: int
    gc_pause_ms: float
    gc_max_pause_ms: float
    cpu_seconds: float
    gc_generations: str
    startup_stall_ms: float

    @property
    def rate(self) -> float:
        return self.completed / self.seconds


Handler = Callable[[JSONObject, ToolRuntime], Awaitable[str]]


async def run_rollouts(
    base_url: str,
    n: int,
    handler: Handler,
    *,
    label: str,
    ramp: float = 0.0,
    model_requests: int | None = None,
    first_prompts: float | None = None,
    one_loop: bool = False,
    spawn_per_pass: int | Literal["paced"] | None = None,
    starts_per_pass: float | None = None,
) -> tuple[float, int, Any, list[float], Stall]:
    """Run ``n`` rollouts at once; ``(seconds, completed, lag statistics, lag samples, start-up
    stall)``: the start-up stall is the longest lag until every rollout reached its first tool
    call (the loop was started on ``n`` rollouts at once, or ramped over ``ramp`` seconds), and
    the most CPU the loop's thread spent between two 5 ms ticks until then (a starved process
    does not inflate it). ``first_prompts``: the loop's first-prompt gate
    (``hermes_async.agent._start_ramp``; ``inf``: no gate), else the library's.
    ``spawn_per_pass``: the caller yields to the loop after every this many ``start_soon``
    calls (``None``: all in one pass; ``"paced"``: the library's own batch starter,
    ``start_paced``). ``starts_per_pass``: the loop's start ramp
    (``hermes_async.agent._start_ramp``; ``inf``: no ramp), else the library's."""
    if first_prompts is not None or starts_per_pass is not None:
        # Imported here: bench/rollout_cpu.py runs this module on older trees without the gates.
        from hermes_async.agent._start_ramp import first_prompt_gate, start_gate

        if first_prompts is not None:
            first_prompt_gate().total_tokens = first_prompts
        if starts_per_pass is not None:
            start_gate().total_tokens = starts_per_pass
    tokenizer = load_tokenizer()
    first_calls: set[str] = set()
    started_at: list[int] = []  # lag samples taken when the last rollout made its first call

    cpu_stall = 0.0
    last_tick = time.thread_time()

    async def first_call(args: JSONObject, runtime: ToolRuntime) -> str:
        nonlocal cpu_stall
        if runtime.task_id not in first_calls:
            first_calls.add(runtime.task_id)
            if len(first_calls) == n:
                started_at.append(len(monitor.samples()))
                # The window closes here: what runs next (the idle pass's gc.collect) is not
                # part of the start-up.
                cpu_stall = max(cpu_stall, time.thread_time() - last_tick)
        return await handler(args, runtime)

    registry = ToolRegistry([Tool("wait", "Wait.", WAIT_SCHEMA, first_call, "terminal")])
    defs = registry.definitions(["terminal"])
    limits = (
        Limits(tool_calls=n)
        if model_requests is None
        else Limits(tool_calls=n, model_requests=model_requests)
    )
    completed = 0
    # --sandboxes shared: every run finds this manager, as in an environment or run_group.
    manager = open_sandbox_manager(limits=limits) if SHARED_SANDBOXES else nullcontext()
    async with manager, VLLMGenerateClient(base_url, limiter=limits.model_requests) as client:

        def make_loop(task_id: str) -> HermesAgentLoop:
            return HermesAgentLoop(
                client,
                defs.schemas,
                defs.valid_names,
                task_id=task_id,
                tokenizer=tokenizer,
                registry=registry,
                limits=limits,
                max_tokens=128,
            )

        # One loop for the batch, as run_group builds it; else one per rollout (the reference's
        # use): each construction (~0.1 ms) runs in the pass that starts the rollouts.
        shared = make_loop(label) if one_loop else None

        async def one(i: int) -> None:
            nonlocal completed
            await anyio.sleep(ramp * i / n)
            task_id = f"{label}-{i}"
            messages: list[JSONObject] = [{"role": "user", "content": f"Do task {i}."}]
            # A loop of its own already has the task id (and round 1's run() takes no task_id,
            # bench/rollout_cpu.py's default baseline); the shared loop is told per run.
            if shared is None:
                result = await make_loop(task_id).run(messages)
            else:
                result = await shared.run(messages, task_id=task_id)
            if result.finished_naturally and not result.tool_errors:
                completed += 1
            else:
                print(
                    f"  rollout {i} failed: {result.error or result.tool_errors}", file=sys.stderr
                )

        async def cpu_ticker() -> None:
            nonlocal cpu_stall, last_tick
            last_tick = time.thread_time()
            while True:
                await anyio.sleep(0.005)
                if started_at:
                    return
                now = time.thread_time()
                cpu_stall, last_tick = max(cpu_stall, now - last_tick), now

        async with open_lag_monitor() as monitor, anyio.create_task_group() as outer:
            outer.start_soon(cpu_ticker)
            start = anyio.current_time()
            async with anyio.create_task_group() as tg:
                if spawn_per_pass == "paced":
                    from hermes_async._paced import start_paced  # not in older trees

                    await start_paced(tg, one, range(n))
                else:
                    for i in range(n):
                        tg.start_soon(one, i)
                        if spawn_per_pass and (i + 1) % spawn_per_pass == 0:
                            await anyio.lowlevel.checkpoint()
            elapsed = anyio.current_time() - start
            stats = monitor.statistics()
            samples = monitor.samples()
            outer.cancel_scope.cancel()
    wall = max(samples[: started_at[0] if started_at else len(samples)], default=0.0)
    return elapsed, completed, stats, samples, Stall(wall, cpu_stall)


async def measure(base_url: str, n: int, mode: str, args: argparse.Namespace) -> Row:
    # Tool latencies vary +-50% around the nominal value (same seeded distribution for both).
    rng = random.Random(7)
    if mode == "ours":

        async def handler(args: JSONObject, runtime: ToolRuntime) -> str:
            await anyio.sleep(float(args["seconds"]) * (0.5 + rng.random()))
            return '{"ok": true}'

    else:
        pool = BASELINE_POOL

        async def handler(args: JSONObject, runtime: ToolRuntime) -> str:
            seconds = float(args["seconds"]) * (0.5 + rng.random())
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(pool, time.sleep, seconds)
            return '{"ok": true}'

    GC_WATCH.clear()
    cpu_start = time.process_time()
    elapsed, completed, lag, samples, stall = await run_rollouts(
        base_url,
        n,
        handler,
        label=mode,
        ramp=args.ramp,
        model_requests=args.model_requests,
        one_loop=args.one_loop,
    )
    pauses = GC_WATCH.pauses
    return Row(
        n,
        mode,
        elapsed,
        completed,
        lag.p50 * 1e3,
        lag.p99 * 1e3,
        lag.max * 1e3,
        len(samples),
        sum(1 for x in samples if x > 0.020),
        len(pauses),
        sum(pauses) * 1e3,
        max(pauses, default=0.0) * 1e3,
        time.process_time() - cpu_start,
        GC_WATCH.by_generation(),
        stall.wall * 1e3,
    )


async def idle_rss_per_rollout(
    base_url: str,
    n: int,
    model_requests: int | None,
    first_prompts: float | None = None,
    one_loop: bool = False,
    spawn_per_pass: int | Literal["paced"] | None = None,
    starts_per_pass: float | None = None,
) -> tuple[float, Stall]:
    """Park all N rollouts inside their first tool call: ``(RSS growth / N in bytes, the
    start-up stall)``."""
    arrived = 0
    everyone_in = anyio.Event()
    release = anyio.Event()

    async def handler(args: JSONObject, runtime: ToolRuntime) -> str:
        nonlocal arrived
        arrived += 1
        if arrived == n:
            everyone_in.set()
        await release.wait()
        return '{"ok": true}'

    gc.collect()
    before = rss_bytes()
    result: list[float] = []

    async def sampler() -> None:
        await everyone_in.wait()
        gc.collect()
        result.append((rss_bytes() - before) / n)
        release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler)
        *_, stall = await run_rollouts(
            base_url,
            n,
            handler,
            label="idle",
            model_requests=model_requests,
            first_prompts=first_prompts,
            one_loop=one_loop,
            spawn_per_pass=spawn_per_pass,
            starts_per_pass=starts_per_pass,
        )
    return result[0], stall


async def spawn_floor(n: int) -> tuple[float, float]:
    """What any library's start-up stall includes when a caller starts ``n`` tasks in one pass:
    ``(the caller's pass, the next pass)`` in seconds of loop-thread CPU, for ``n`` tasks that
    only wait (``start_soon`` each, then each task's first step)."""
    release = anyio.Event()

    async def parked() -> None:
        await release.wait()

    async with anyio.create_task_group() as tg:
        start = time.thread_time()
        for _ in range(n):
            tg.start_soon(parked)
        spawned = time.thread_time()
        await anyio.lowlevel.checkpoint()  # every task's first step runs in this pass
        stepped = time.thread_time()
        release.set()
    return spawned - start, stepped - spawned


BASELINE_POOL = ThreadPoolExecutor(max_workers=128)
#: ``--sandboxes shared``: the rollouts share one ``SandboxManager``; else each reference-style
#: ``run`` opens its own private one.
SHARED_SANDBOXES = False


def apply_gc(setting: str, previous: GCState | None) -> GCState | None:
    """Undo ``previous``; apply ``tuned`` (the library's), ``default``, ``off`` (no collections:
    what the start-up costs besides the collector) or ``young/middle/old``."""
    gc.enable()
    if previous is not None:
        restore_gc(previous)
    if setting == "default":
        return None
    if setting == "off":
        gc.disable()
        return None
    if setting == "tuned":
        return tune_gc_for_rollouts()
    young, middle, old = (int(x) for x in setting.split("/"))
    state = tune_gc_for_rollouts(young_threshold=young)
    gc.set_threshold(young, middle, old)
    return state


async def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    load_tokenizer()  # load outside the measurements
    gc_settings = args.gc.split(",")
    gc_state = apply_gc(gc_settings[0], None)
    arguments = ["--model-latency", str(args.model_latency), "--turns", str(args.turns)]
    arguments += ["--tool-latency", str(args.tool_latency)]
    async with server_process(__file__, arguments) as base_url:
        print(
            f"scripted server (separate process) at {base_url}; model latency "
            f"{args.model_latency}s, tool latency {args.tool_latency}s +-50%, {args.turns} tool "
            f"turns + answer per rollout, starts ramped over {args.ramp}s; GC {args.gc} "
            f"(thresholds {gc.get_threshold()}); model_requests "
            f"{args.model_requests or 'library default'}; event loop {args.loop}"
        )
        rows: list[Row] = []
        rss: dict[int, float] = {}
        try:
            for n in sizes:
                # The settings side by side, order alternating per round.
                gates = [None] if args.first_prompts is None else args.first_prompts
                sides = [
                    (gate, setting, spawn, ramp)
                    for setting in gc_settings
                    for gate in gates
                    for spawn in args.spawn_per_pass
                    for ramp in args.starts_per_pass
                ]
                for r in range(0 if args.no_rss else args.rss_rounds):
                    for gate, setting, spawn, ramp in (
                        sides[r % len(sides) :] + sides[: r % len(sides)]
                    ):
                        if len(gc_settings) > 1:
                            gc_state = apply_gc(setting, gc_state)
                        GC_WATCH.clear()
                        rss[n], stall = await idle_rss_per_rollout(
                            base_url, n, args.model_requests, gate, args.one_loop, spawn, ramp
                        )
                        gc_max = max(GC_WATCH.pauses, default=0.0) * 1e3
                        print(
                            f"  N={n:5d} GC {setting} {gc.get_threshold()} first-prompt gate "
                            f"{gate or 'library'}: RSS per idle "
                            f"rollout {rss[n] / 1024:.1f} KB, start-up stall {stall.wall * 1e3:.0f} "
                            f"ms lag, {stall.cpu * 1e3:.0f} ms loop CPU between ticks (all {n} "
                            f"started, {spawn or 'all'} per caller pass, start ramp "
                            f"{ramp or 'library'}, parked in a tool call); "
                            f"GC max pause {gc_max:.0f} "
                            f"ms ({GC_WATCH.by_generation()})",
                            flush=True,
                        )
                        if args.spawn_floor:
                            # After the idle pass: run first, its freed memory would make the
                            # pass's RSS growth read low.
                            caller, steps = await spawn_floor(n)
                            print(
                                f"  N={n:5d} spawn floor: {n} tasks that only wait, started in "
                                f"one pass: the caller's pass {caller * 1e3:.0f} ms of loop CPU, "
                                f"their first steps {steps * 1e3:.0f} ms; the stall above is "
                                f"{stall.cpu / caller:.2f}x the caller's pass",
                                flush=True,
                            )
                if args.rss_only:
                    continue
                for mode in modes:
                    row = await measure(base_url, n, mode, args)
                    rows.append(row)
                    print(
                        f"  N={n:5d} {mode:8s} {row.seconds:7.2f}s  {row.rate:8.1f} rollouts/s  "
                        f"lag p50 {row.lag_p50_ms:6.2f} ms p99 {row.lag_p99_ms:7.2f} ms "
                        f"max {row.lag_max_ms:7.1f} ms ({row.lag_over_20ms}/{row.lag_samples} "
                        f"ticks > 20 ms, start-up stall {row.startup_stall_ms:.0f} ms)  "
                        f"GC {row.gc_collections} runs, {row.gc_pause_ms:.0f} ms, "
                        f"max {row.gc_max_pause_ms:.0f} ms ({row.gc_generations})  client CPU "
                        f"{row.cpu_seconds / n * 1e3:.1f} ms/rollout  completed {row.completed}/{n}",
                        flush=True,
                    )
        finally:
            BASELINE_POOL.shutdown(wait=False, cancel_futures=True)
    if modes != ["ours", "baseline"] or args.no_rss or args.rss_only:
        return  # the table needs both sides and the RSS pass
    print()
    print(
        "|     N | ours rollouts/s | baseline rollouts/s | ratio | ours lag p50 / p99 (ms) "
        "| baseline lag p99 (ms) | RSS per idle rollout |"
    )
    print(
        "|------:|----------------:|--------------------:|------:|------------------------:"
        "|----------------------:|---------------------:|"
    )
    for n in sizes:
        ours = next(r for r in rows if r.n == n and r.mode == "ours")
        base = next(r for r in rows if r.n == n and r.mode == "baseline")
        print(
            f"| {n:5d} | {ours.rate:15.1f} | {base.rate:19.1f} | {ours.rate / base.rate:5.1f}x "
            f"| {ours.lag_p50_ms:10.2f} / {ours.lag_p99_ms:10.2f} | {base.lag_p99_ms:21.2f} "
            f"| {rss[n] / 1024:17.1f} KB |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,500,2000")
    parser.add_argument("--model-latency", type=float, default=0.2)
    parser.add_argument("--tool-latency", type=float, default=1.0)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        help="spread rollout starts evenly over this many seconds (0: all at once)",
    )
    parser.add_argument(
        "--gc",
        default="tuned",
        help="tuned: tune_gc_for_rollouts() at start-up (default); default: CPython's settings; "
        "off: no collections; "
        "young/middle/old: tuned with these thresholds; comma-separated: alternated in the idle pass",
    )
    parser.add_argument(
        "--model-requests",
        type=int,
        default=None,
        help="model_requests limiter total (default: the library's default)",
    )
    parser.add_argument("--modes", default="ours,baseline", help="comma-separated subset")
    parser.add_argument("--no-rss", action="store_true", help="skip the idle-RSS pass")
    parser.add_argument("--rss-only", action="store_true", help="run only the idle-RSS pass")
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default="asyncio", help="the client's event loop"
    )
    parser.add_argument(
        "--first-prompts",
        type=lambda s: [math.inf if x == "inf" else int(x) for x in s.split(",")],
        default=None,
        help="idle pass: first-prompt gate totals side by side (inf: no gate), e.g. 32,inf",
    )
    parser.add_argument("--rss-rounds", type=int, default=1, help="idle passes per gate")
    parser.add_argument(
        "--spawn-per-pass",
        type=lambda s: [
            None if x == "all" else x if x == "paced" else int(x) for x in s.split(",")
        ],
        default=[None],
        help="idle pass: the caller yields after this many start_soon calls, side by side "
        "(all: every rollout started in one pass, the default; paced: the library's batch starter, "
        "start_paced), e.g. all,500,paced",
    )
    parser.add_argument(
        "--starts-per-pass",
        type=lambda s: [math.inf if x == "inf" else int(x) for x in s.split(",")],
        default=[None],
        help="idle pass: start-ramp totals side by side (inf: no ramp), e.g. 32,inf",
    )
    parser.add_argument(
        "--one-loop",
        action="store_true",
        help="one HermesAgentLoop for all rollouts (as run_group), not one per rollout",
    )
    parser.add_argument(
        "--spawn-floor",
        action="store_true",
        help="after each idle pass, time N tasks that only wait, started in one pass (what "
        "any library's start-up stall includes when the caller starts everything at once)",
    )
    parser.add_argument(
        "--sandboxes",
        choices=("private", "shared"),
        default="private",
        help="private: each run opens its own SandboxManager (reference-style use, the default); "
        "shared: all runs share one, as in an environment or run_group",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.rss_only and ns.no_rss:
        parser.error("--rss-only and --no-rss exclude each other")
    SHARED_SANDBOXES = ns.sandboxes == "shared"
    if ns.serve:
        anyio.run(serve, make_policy(ns.turns, ns.tool_latency), ns.model_latency)
    else:
        # asyncio (the baseline needs run_in_executor), on uvloop's loop with --loop uvloop
        anyio.run(main, ns, backend_options={"use_uvloop": ns.loop == "uvloop"})
