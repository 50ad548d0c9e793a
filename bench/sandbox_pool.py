"""Warm pool vs cold creation: how long a rollout waits for its sandbox, side by side.

Two parts, each running both sides in this one process, alternating, on the same backend:

* **wait**: ``--rollouts`` rollouts, ``--concurrency`` at once. Each measures the time from
  "the rollout wants a sandbox" (``manager.get``) to its first command having run
  (``exec("true")``), then works for ``--work`` seconds (two commands and a sleep) and releases
  it. **cold**: a manager without a pool; **pool**: ``WarmPoolOptions(size=concurrency)``, started
  at steady state (the pool full before the first rollout). p50 / p99 of the wait per side and
  cold/pool ratios.
* **agent** (``--agent``): the concurrency benchmark's workload with a sandbox: ``--groups``
  groups of ``--size`` agent rollouts (``run_group``, the scripted model server in its own
  process), each turn a tool call that runs a command in the rollout's sandbox. Reported: the
  share of rollout wall time spent waiting for sandboxes (the manager's
  ``create_wait_seconds`` over the summed rollout wall time), cold vs pool.

Backends: ``local`` (process isolation), ``local-ns`` (namespaced, needs root + bubblewrap),
``docker`` (needs ``DOCKER_HOST`` reachable and ``HERMES_ASYNC_DOCKER_TEST_IMAGE``, e.g. the
engine from ``scripts/docker/engine.sh``).

    .venv/bin/python bench/sandbox_pool.py --backends local,local-ns
    .venv/bin/python bench/sandbox_pool.py --backends docker --rollouts 100 --agent
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

import anyio
from _scripted import scripted_group, serve, server_process, tool_turns

from hermes_async import Limits, Tool, ToolRegistry, ToolRuntime, load_tokenizer
from hermes_async.agent import AgentOptions
from hermes_async.inference import SamplingParams
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.jsontypes import JSONObject
from hermes_async.testing import PolicyRequest
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.sandbox.manager import SandboxFactory, SandboxManager
from hermes_async.tools.sandbox.warm_pool import WarmPoolOptions

RUN_SCHEMA: JSONObject = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}


def factory_for(backend: str) -> SandboxFactory:
    if backend == "local":
        return make_backend_factory("local", isolation="process")
    if backend == "local-ns":
        return make_backend_factory("local", isolation="namespaces")
    if backend == "docker":
        image = os.environ.get("HERMES_ASYNC_DOCKER_TEST_IMAGE", "hermes-async-busybox:local")
        return make_backend_factory("docker", image=image)
    raise SystemExit(f"unknown backend {backend!r}: local, local-ns or docker")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def until_full(manager: SandboxManager, size: int, timeout: float = 300) -> None:
    with anyio.fail_after(timeout):
        while (stats := manager.statistics().warm_pool) is None or stats.ready < size:
            await anyio.sleep(0.02)


async def wait_round(
    backend: str, pooled: bool, args: argparse.Namespace
) -> tuple[list[float], str]:
    """Seconds from ``get`` to the first command's end, per rollout; the pool's hit count."""
    waits: list[float] = []
    limits = Limits(sandbox_create=args.concurrency, sandbox_exec=4 * args.concurrency)
    pool = (
        WarmPoolOptions(size=args.concurrency, fill_concurrency=args.concurrency)
        if pooled
        else None
    )
    slots = anyio.CapacityLimiter(args.concurrency)
    async with SandboxManager(factory_for(backend), limits=limits, warm_pool=pool) as manager:
        if pooled:
            await until_full(manager, args.concurrency)

        async def rollout(n: int) -> None:
            async with slots:
                task_id = f"{'pool' if pooled else 'cold'}-{n}"
                start = anyio.current_time()
                sandbox = await manager.get(task_id)
                await sandbox.exec("true")
                waits.append(anyio.current_time() - start)
                await sandbox.exec("echo work > f && cat f")
                await anyio.sleep(args.work)
                await sandbox.exec("ls")
                await manager.release(task_id)

        async with anyio.create_task_group() as tg:
            for n in range(args.rollouts):
                tg.start_soon(rollout, n)
        stats = manager.statistics().warm_pool
        hits = f", {stats.hits}/{stats.hits + stats.misses} from the pool" if stats else ""
    return waits, hits


def make_policy(turns: int, tool_seconds: float) -> Callable[[PolicyRequest], str]:
    def call(turn: int) -> dict[str, Any]:
        command = f"sleep {tool_seconds}; echo step {turn} >> log && wc -l log"
        return {"name": "run", "arguments": {"command": command}}

    return tool_turns(turns, call)


async def agent_round(
    base_url: str, backend: str, pooled: bool, args: argparse.Namespace
) -> tuple[float, float, int]:
    """``(seconds waiting for sandboxes, summed rollout wall seconds, clean rollouts)``."""
    tokenizer = load_tokenizer()

    async def run(arguments: JSONObject, runtime: ToolRuntime) -> str:
        assert runtime.sandboxes is not None
        sandbox = await runtime.sandboxes.get(runtime.task_id)
        result = await sandbox.exec(str(arguments["command"]))
        return json.dumps({"exit_code": result.exit_code, "output": result.stdout[-200:]})

    registry = ToolRegistry([Tool("run", "Run a command.", RUN_SCHEMA, run, "terminal")])
    tools = registry.definitions(["terminal"])
    at_once = args.groups * args.size
    limits = Limits(tool_calls=at_once, sandbox_create=at_once, sandbox_exec=4 * at_once)
    options = AgentOptions(max_turns=args.turns + 1, sampling=SamplingParams(max_tokens=128))
    pool = WarmPoolOptions(size=at_once, fill_concurrency=at_once) if pooled else None
    wall = 0.0
    clean = 0

    async with (
        VLLMGenerateClient(base_url, limiter=limits.model_requests) as client,
        SandboxManager(factory_for(backend), limits=limits, warm_pool=pool) as manager,
    ):
        if pooled:
            await until_full(manager, at_once)
        waited_before = manager.statistics().create_wait_seconds

        async def group(g: int, wave: int) -> None:
            nonlocal wall, clean
            start = anyio.current_time()
            scored = await scripted_group(
                client,
                tools,
                f"{wave}-{g}",
                size=args.size,
                tokenizer=tokenizer,
                options=options,
                sandboxes=manager,
                limits=limits,
                registry=registry,
            )
            wall += (anyio.current_time() - start) * args.size
            clean += sum(1 for r in scored.rollouts if r.error is None)

        for wave in range(args.waves):  # the pool refills between waves, as in a long run
            async with anyio.create_task_group() as tg:
                for g in range(args.groups):
                    tg.start_soon(group, g, wave)
        stats = manager.statistics()
        waited = stats.create_wait_seconds - waited_before
        if stats.warm_pool is not None:
            print(f"    pool: {stats.warm_pool.hits} hits, {stats.warm_pool.misses} misses")
    return waited, wall, clean


async def main(args: argparse.Namespace) -> None:
    results: dict[str, Any] = {}
    for backend in args.backends.split(","):
        print(f"== {backend}: {args.rollouts} rollouts, {args.concurrency} at once")
        sides: dict[str, list[float]] = {"cold": [], "pool": []}
        for r in range(args.rounds):
            for side in ("cold", "pool"):
                waits, hits = await wait_round(backend, side == "pool", args)
                sides[side] += waits
                print(
                    f"  round {r} {side:4s}: wait p50 {percentile(waits, 0.5) * 1e3:7.1f} ms, "
                    f"p99 {percentile(waits, 0.99) * 1e3:7.1f} ms{hits}",
                    flush=True,
                )
        summary = {
            side: {"p50_ms": percentile(v, 0.5) * 1e3, "p99_ms": percentile(v, 0.99) * 1e3}
            for side, v in sides.items()
        }
        p50 = summary["cold"]["p50_ms"] / summary["pool"]["p50_ms"]
        p99 = summary["cold"]["p99_ms"] / summary["pool"]["p99_ms"]
        print(f"  cold/pool: p50 x{p50:.1f}, p99 x{p99:.1f}")
        results[backend] = {"wait": summary, "cold_over_pool_p50": p50, "cold_over_pool_p99": p99}
        if args.agent:
            results[backend]["agent"] = await agent_part(backend, args)
    print(json.dumps(results, indent=2))


async def agent_part(backend: str, args: argparse.Namespace) -> dict[str, float]:
    shares: dict[str, float] = {}
    arguments = ["--model-latency", str(args.model_latency), "--turns", str(args.turns)]
    arguments += ["--tool-seconds", str(args.tool_seconds)]
    async with server_process(__file__, arguments) as base_url:
        n = args.groups * args.size
        print(
            f"  agent: {args.waves} waves of {args.groups} groups x {args.size} = {n} "
            f"rollouts at once, {args.turns} tool turns each, model latency "
            f"{args.model_latency}s (scripted server in its own process)"
        )
        for side in ("cold", "pool"):
            waited, wall, clean = await agent_round(base_url, backend, side == "pool", args)
            shares[side] = waited / wall
            print(
                f"  agent {side:4s}: waiting for sandboxes {waited:7.2f} s of {wall:8.1f} s "
                f"rollout wall time = {waited / wall:.2%} ({clean} clean)",
                flush=True,
            )
    return shares


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default="local")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--work", type=float, default=0.2, help="seconds a rollout works")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--agent", action="store_true", help="also run the agent part")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--model-latency", type=float, default=0.2)
    parser.add_argument("--tool-seconds", type=float, default=1.0, help="agent: each command")
    parsed = parser.parse_args()
    if parsed.serve:
        anyio.run(serve, make_policy(parsed.turns, parsed.tool_seconds), parsed.model_latency)
    else:
        anyio.run(main, parsed)
