"""Rollouts whose tools run real commands in sandboxes: ours vs the reference design.

Workload: N agent rollouts at once against the scripted model server (its own process), each
``--turns`` ``terminal`` calls (``sleep --tool-seconds; echo step >> log; wc -l < log``) and an
answer, then a reward that runs ``sleep --reward-seconds; wc -l < log`` in the rollout's sandbox
(a task's verification: 0 s by default, a real test suite runs for seconds), then the release.
Both sides use the same agent loop, so what differs is how tools, rewards and sandboxes run:

* **ours**: ``run_rollout`` with the built-in ``terminal`` tool on a ``SandboxManager`` of
  local sandboxes (``--isolation process`` or ``namespaces``; or ``docker``), the reward
  through ``ToolContext.terminal`` on the same sandbox, the release shielded and bounded.
* **reference** (its design, reproduced here only): every tool call is a blocking
  ``subprocess.run(shell=True, cwd=<the rollout's directory>)`` on one shared
  ``ThreadPoolExecutor(128)``; the reward's ``terminal`` blocks the event-loop thread for the
  whole command (the reference's ``ToolContext`` waited on a future from the loop's thread);
  the directory is created and removed synchronously (``mkdtemp`` / ``rmtree``).

Reported per N and side: completed rollouts, wall seconds, rollouts/s, tool-call latency
p50/p99 (the command as the tool saw it), event-loop lag p99 (a 5 ms ticker), and for ours the
sandbox create/close rates; CPU per rollout, split into this process's own and its commands'
(``getrusage``: the children it reaped, the shells and their commands), and the ceiling the
commands alone put on any design: the machine's cores over their CPU per rollout (rollouts/s no
client could beat here, since every design runs the same commands). A watchdog aborts a side
that completes nothing for ``--stall`` seconds while rollouts are pending and reports it as a
deadlock. Ratios are ours/reference
from the same run (machines are noisy).

    .venv/bin/python bench/sandboxes.py --sizes 64,256,1000 --isolation process
    .venv/bin/python bench/sandboxes.py --sizes 64,256 --isolation namespaces
    DOCKER_HOST=... .venv/bin/python bench/sandboxes.py --sizes 32,64 --isolation docker --sides ours
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import anyio
from _scripted import serve, server_process, tool_turns

from hermes_async import HermesAgentLoop, Limits, Tool, ToolRegistry, ToolRuntime, load_tokenizer
from hermes_async.agent import AgentOptions, AgentResult, RolloutSetup, ToolContext, run_rollout
from hermes_async.inference import SamplingParams
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import open_lag_monitor
from hermes_async.tools.registry import builtin_registry, get_tool_definitions
from hermes_async.tools.sandbox import host
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.sandbox.host import pidfd_child_watcher
from hermes_async.tools.sandbox.manager import SandboxManager

TERMINAL_SCHEMA: JSONObject = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}


def make_policy(turns: int, tool_seconds: float) -> Any:
    command = f"sleep {tool_seconds}; echo step >> log; wc -l < log"
    return tool_turns(turns, lambda _: {"name": "terminal", "arguments": {"command": command}})


def reward_command(args: argparse.Namespace) -> str:
    """The reward's check: the log has one line per tool turn (after the verification time)."""
    if args.reward_seconds > 0:
        return f"sleep {args.reward_seconds}; wc -l < log"
    return "wc -l < log"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Side:
    completed: int = 0
    rewarded: int = 0
    seconds: float = 0.0
    tool_seconds: list[float] = field(default_factory=list)
    lag_p99_ms: float = 0.0
    deadlock: bool = False
    created: int = 0
    released: int = 0
    cpu_self: float = 0.0
    cpu_children: float = 0.0

    def line(self, n: int, name: str) -> str:
        rate = self.completed / self.seconds if self.seconds else 0.0
        extra = (
            f", sandboxes {self.created / self.seconds:.1f} created/s "
            f"{self.released / self.seconds:.1f} closed/s"
            if self.created
            else ""
        )
        done = max(self.completed, 1)
        cpu = (
            f"; CPU per rollout {self.cpu_self / done * 1e3:.1f} ms own + "
            f"{self.commands_cpu() * 1e3:.1f} ms commands (ceiling "
            f"{self.ceiling():.0f} rollouts/s)"
        )
        return (
            f"  N={n:5d} {name:9s} {self.completed}/{n} done ({self.rewarded} rewarded) in "
            f"{self.seconds:7.1f} s = {rate:6.1f} rollouts/s; tool p50 "
            f"{percentile(self.tool_seconds, 0.5) * 1e3:7.0f} ms p99 "
            f"{percentile(self.tool_seconds, 0.99) * 1e3:7.0f} ms; loop lag p99 "
            f"{self.lag_p99_ms:6.1f} ms{extra}{cpu}"
            f"{'; DEADLOCK (watchdog)' if self.deadlock else ''}"
        )

    def commands_cpu(self) -> float:
        """CPU seconds per completed rollout in the commands (the reaped children)."""
        return self.cpu_children / max(self.completed, 1)

    def ceiling(self) -> float:
        """Rollouts/s the machine's cores could run if the commands' CPU were all there was."""
        per_rollout = self.commands_cpu()
        return (os.cpu_count() or 1) / per_rollout if per_rollout else float("inf")


async def run_all(side: Side, n: int, stall: float, one: Any) -> None:
    """Run ``one(i)`` for i < n at once, timed and under a loop-lag monitor; abort if nothing
    completes (``side.completed``) for ``stall`` seconds while rollouts are pending."""
    async with open_lag_monitor() as monitor, anyio.create_task_group() as tg:

        async def watchdog() -> None:
            last, seen = anyio.current_time(), -1
            while True:
                await anyio.sleep(1)
                if side.completed != seen:
                    last, seen = anyio.current_time(), side.completed
                elif anyio.current_time() - last > stall and side.completed < n:
                    side.deadlock = True
                    tg.cancel_scope.cancel("no rollout finished for the stall bound")
                    return

        tg.start_soon(watchdog)
        start = anyio.current_time()
        try:
            async with anyio.create_task_group() as rollouts:
                for i in range(n):
                    rollouts.start_soon(one, i)
        finally:  # also when the watchdog cut the run
            side.seconds = anyio.current_time() - start
            side.lag_p99_ms = monitor.statistics().p99 * 1e3
        tg.cancel_scope.cancel("done")


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far: this process's, and its reaped children's (the commands)."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def factory_for(isolation: str) -> Any:
    if isolation == "docker":
        image = os.environ.get("HERMES_ASYNC_DOCKER_TEST_IMAGE", "hermes-async-busybox:local")
        return make_backend_factory("docker", image=image)
    return make_backend_factory("local", isolation=isolation)


async def ours(base_url: str, n: int, args: argparse.Namespace) -> Side:
    side = Side()
    tokenizer = load_tokenizer()
    base = builtin_registry()
    terminal = base.get("terminal")
    assert terminal is not None

    async def timed(arguments: JSONObject, runtime: ToolRuntime) -> Any:
        start = time.perf_counter()
        try:
            return await terminal.handler(arguments, runtime)
        finally:
            side.tool_seconds.append(time.perf_counter() - start)

    registry = ToolRegistry(
        [Tool("terminal", terminal.description, terminal.parameters, timed, "terminal")]
    )
    tools = get_tool_definitions(["terminal"])
    limits = Limits(tool_calls=n, sandbox_create=64, sandbox_exec=4 * n)
    options = AgentOptions(
        max_turns=args.turns + 1, sampling=SamplingParams(max_tokens=128), tool_timeout=600
    )

    async def reward(result: AgentResult, ctx: ToolContext) -> float:
        out = await ctx.terminal(reward_command(args))
        return 1.0 if str(out.get("output", "")).strip() == str(args.turns) else 0.0

    async with (
        VLLMGenerateClient(base_url, limiter=limits.model_requests) as client,
        SandboxManager(factory_for(args.isolation), limits=limits) as manager,
    ):

        async def one(i: int) -> None:
            scored = await run_rollout(
                client,
                [{"role": "user", "content": f"Do task {i}."}],
                tools,
                task_id=f"ours-{n}-{i}",
                options=options,
                setup=RolloutSetup(
                    reward=reward,
                    tokenizer=tokenizer,
                    sandboxes=manager,
                    limits=limits,
                    registry=registry,
                ),
            )
            if scored.failure is None:
                side.completed += 1
                side.rewarded += scored.reward == 1.0

        await run_all(side, n, args.stall, one)
        stats = manager.statistics()
        side.created, side.released = stats.created, stats.released
    return side


REFERENCE_POOL = ThreadPoolExecutor(max_workers=128)


async def reference(base_url: str, n: int, args: argparse.Namespace) -> Side:
    side = Side()
    tokenizer = load_tokenizer()
    directories: dict[str, str] = {}
    loop = asyncio.get_running_loop()

    def run_blocking(task_id: str, command: str) -> dict[str, Any]:
        directory = directories.get(task_id)
        if directory is None:
            directory = directories[task_id] = tempfile.mkdtemp(prefix="hermes-ref-")
        done = subprocess.run(
            command, shell=True, cwd=directory, capture_output=True, text=True, timeout=180
        )
        return {"output": done.stdout + done.stderr, "exit_code": done.returncode}

    async def terminal(arguments: JSONObject, runtime: ToolRuntime) -> Any:
        start = time.perf_counter()
        try:
            return await loop.run_in_executor(
                REFERENCE_POOL, run_blocking, runtime.task_id, str(arguments["command"])
            )
        finally:
            side.tool_seconds.append(time.perf_counter() - start)

    registry = ToolRegistry(
        [Tool("terminal", "Run a command.", TERMINAL_SCHEMA, terminal, "terminal")]
    )
    tools = registry.definitions(["terminal"])
    limits = Limits(tool_calls=n)

    async with VLLMGenerateClient(base_url, limiter=limits.model_requests) as client:

        async def one(i: int) -> None:
            task_id = f"ref-{n}-{i}"
            agent = HermesAgentLoop(
                client,
                tools.schemas,
                tools.valid_names,
                task_id=task_id,
                tokenizer=tokenizer,
                registry=registry,
                limits=limits,
                max_tokens=128,
                max_turns=args.turns + 1,
            )
            try:
                result = await agent.run([{"role": "user", "content": f"Do task {i}."}])
                if result.finished_naturally and not result.tool_errors:
                    side.completed += 1
                    # The reward's terminal call blocks the loop's thread (the reference's
                    # ToolContext), then the synchronous cleanup.
                    out = run_blocking(task_id, reward_command(args))
                    side.rewarded += out["output"].strip() == str(args.turns)
            finally:
                directory = directories.pop(task_id, None)
                if directory is not None:
                    shutil.rmtree(directory, ignore_errors=True)

        await run_all(side, n, args.stall, one)
    return side


async def main(args: argparse.Namespace) -> None:
    load_tokenizer()
    host._use_pidfd = host._use_pidfd and args.spawn == "pidfd"  # an A/B switch, not an API
    with pidfd_child_watcher() if args.pidfd else nullcontext():
        await compare(args)


async def compare(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    sides = args.sides.split(",")
    arguments = ["--model-latency", str(args.model_latency), "--turns", str(args.turns)]
    arguments += ["--tool-seconds", str(args.tool_seconds)]
    async with server_process(__file__, arguments) as base_url:
        print(
            f"scripted server (own process) at {base_url}; {args.turns} terminal calls "
            f"(sleep {args.tool_seconds}s + 2 commands) + answer + reward command "
            f"(sleep {args.reward_seconds}s + 1 command) per rollout; "
            f"ours on {args.isolation} sandboxes"
        )
        for n in sizes:
            results: dict[str, Side] = {}
            for name in sides:
                run = ours if name == "ours" else reference
                own, children = cpu_seconds()
                results[name] = await run(base_url, n, args)
                own_after, children_after = cpu_seconds()
                results[name].cpu_self = own_after - own
                results[name].cpu_children = children_after - children
                print(results[name].line(n, name), flush=True)
            if len(results) == 2:
                a, b = results["ours"], results["reference"]
                rate_a = a.completed / a.seconds
                rate_b = b.completed / b.seconds if b.completed else float("nan")
                p99_a = percentile(a.tool_seconds, 0.99)
                p99_b = percentile(b.tool_seconds, 0.99)
                ceiling = min(a.ceiling(), b.ceiling())
                print(
                    f"  N={n:5d} ours/reference: throughput x{rate_a / rate_b:.1f}, "
                    f"tool p99 x{p99_b / p99_a:.1f} lower; the commands' ceiling is "
                    f"x{ceiling / rate_b:.1f} the reference's throughput",
                    flush=True,
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="64,256,1000")
    parser.add_argument("--isolation", default="process", help="process, namespaces or docker")
    parser.add_argument("--sides", default="ours,reference")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--tool-seconds", type=float, default=0.5)
    parser.add_argument(
        "--reward-seconds",
        type=float,
        default=0.0,
        help="how long the reward's verification command runs before its check",
    )
    parser.add_argument("--model-latency", type=float, default=0.2)
    parser.add_argument("--stall", type=float, default=120.0)
    parser.add_argument(
        "--spawn",
        default="pidfd",
        choices=("pidfd", "anyio"),
        help="how ours drives a command's process: Popen + pidfd (the default), or "
        "anyio.open_process (the path before; on asyncio, its subprocess transports)",
    )
    parser.add_argument(
        "--no-pidfd",
        dest="pidfd",
        action="store_false",
        help="keep Python 3.11's thread-per-child watcher (the entry points swap it)",
    )
    parsed = parser.parse_args()
    if parsed.serve:
        anyio.run(serve, make_policy(parsed.turns, parsed.tool_seconds), parsed.model_latency)
    else:
        anyio.run(main, parsed)
