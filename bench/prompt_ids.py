"""A group's shared prompt encoded once (``agent/_prompt_ids.py``) vs once per rollout.

Workload: ``--groups`` groups of ``--size`` Phase 2 rollouts (``run_group``), each group sharing
one prompt: a long system prompt plus the schemas of the terminal, file, web and browser
toolsets (16 tools, ~3,700 tokens with the Qwen tokenizer). The model (the scripted server, in a
separate process so its CPU does not count) answers at once, so a rollout is: render and encode
the prompt, one streamed request, the result rows. Rounds alternate between the cache off
(``PROMPT_IDS.max_entries = 0``: every rollout encodes) and on (the default), in one process;
printed: client CPU per rollout (medians) and their ratio, and the longest event-loop stall
(all groups start together).

Then memory: the same groups, each rollout parked in its first tool call (its user message
asks for one), the prompt's text and ids held by every rollout (cache off) or once per group
(on: ``PromptIds.share``, the trajectory keeps the cache's array, the renderer the cache's
text); printed: memory traced (``tracemalloc``) per parked rollout, and the ratio. Counted
in this process only (the server runs in its own).

    .venv/bin/python bench/prompt_ids.py
    .venv/bin/python bench/prompt_ids.py --groups 8 --size 16 --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc

import anyio
from _scripted import serve, server_process

from hermes_async import HermesAgentLoop, Tool, ToolRegistry, ToolRuntime, load_tokenizer
from hermes_async.agent import AgentOptions, RolloutSetup, run_group
from hermes_async.agent._prompt_ids import PROMPT_IDS
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits, open_lag_monitor
from hermes_async.testing import PolicyRequest
from hermes_async.tools.registry import get_tool_definitions

SYSTEM = "You are a careful software agent working in a Linux sandbox. " * 60


PARK = "Park in the wait tool."


def policy(request: PolicyRequest) -> str:
    if PARK in str(request.messages[-1].get("content")):
        return '<tool_call>\n{"name": "wait", "arguments": {}}\n</tool_call>'
    return "Nothing to do: the task is already complete."


async def parked_memory(base_url: str, args: argparse.Namespace, *, cache: bool) -> float:
    """Memory traced per rollout (KB) while every rollout waits in its first tool call."""
    PROMPT_IDS.clear()
    PROMPT_IDS.max_entries = 32 if cache else 0
    tokenizer = load_tokenizer()
    n = args.groups * args.size
    arrived = 0
    everyone_in, release = anyio.Event(), anyio.Event()

    async def wait(arguments: JSONObject, runtime: ToolRuntime) -> str:
        nonlocal arrived
        arrived += 1
        if arrived == n:
            everyone_in.set()
        await release.wait()
        return "{}"

    schema: JSONObject = {"type": "object", "properties": {}}
    registry = ToolRegistry([Tool("wait", "Wait.", schema, wait, "terminal")])
    defs = registry.definitions(["terminal"])
    tools = get_tool_definitions(["terminal", "file", "web", "browser"])
    schemas = [*tools.schemas, *defs.schemas]
    limits = Limits(tool_calls=n)
    async with VLLMGenerateClient(base_url, limiter=limits.model_requests) as client:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            async with anyio.create_task_group() as tg:
                for g in range(args.groups):
                    content = f"Task {g}: check that the build passes. {PARK}"
                    for i in range(args.size):
                        loop = HermesAgentLoop(
                            client,
                            schemas,
                            defs.valid_names,
                            task_id=f"m{g}-{i}",
                            tokenizer=tokenizer,
                            registry=registry,
                            limits=limits,
                            max_tokens=64,
                        )
                        messages = [
                            {"role": "system", "content": SYSTEM},
                            {"role": "user", "content": content},
                        ]
                        tg.start_soon(loop.run, messages)
                with anyio.fail_after(120):
                    await everyone_in.wait()
                gc.collect()
                held = tracemalloc.get_traced_memory()[0] - before
                release.set()
        finally:
            tracemalloc.stop()
    return held / n / 1024


async def one_round(base_url: str, args: argparse.Namespace, *, cache: bool) -> tuple[float, float]:
    """(client CPU ms per rollout, longest loop stall in ms) of one round."""
    PROMPT_IDS.clear()
    PROMPT_IDS.max_entries = 32 if cache else 0
    PROMPT_IDS.hits = PROMPT_IDS.misses = 0
    tokenizer = load_tokenizer()
    tools = get_tool_definitions(["terminal", "file", "web", "browser"])
    limits = Limits()
    options = AgentOptions(max_tokens=64)

    async def reward(result: object, ctx: object) -> float:
        return 1.0

    async with VLLMGenerateClient(base_url, limiter=limits.model_requests) as client:

        async def group(g: int) -> None:
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task {g}: check that the build passes."},
            ]
            result = await run_group(
                client,
                messages,
                tools,
                size=args.size,
                options=options,
                setup=RolloutSetup(reward=reward, tokenizer=tokenizer, limits=limits),
            )
            assert result.rewards == [1.0] * args.size, result.rewards

        start = time.process_time()
        async with open_lag_monitor() as monitor:
            async with anyio.create_task_group() as tg:
                for g in range(args.groups):
                    tg.start_soon(group, g)
            stall = monitor.statistics().max
        cpu = time.process_time() - start
    return cpu / (args.groups * args.size) * 1e3, stall * 1e3


async def main(args: argparse.Namespace) -> None:
    load_tokenizer()
    async with server_process(__file__, ["--latency", str(args.latency)]) as base_url:
        await one_round(base_url, args, cache=True)  # warm-up: imports, templates, connections
        off: list[tuple[float, float]] = []
        on: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            off.append(await one_round(base_url, args, cache=False))
            on.append(await one_round(base_url, args, cache=True))
    cpu_off = statistics.median(c for c, _ in off)
    cpu_on = statistics.median(c for c, _ in on)
    print(
        f"{args.groups} groups x {args.size} rollouts sharing a prompt, {args.rounds} rounds each "
        f"(medians; last round with the cache: {PROMPT_IDS.misses} prompts encoded, "
        f"{PROMPT_IDS.hits} encodings saved)"
    )
    print(
        f"  encode per rollout (cache off): {cpu_off:6.2f} ms CPU/rollout, "
        f"longest stall {statistics.median(s for _, s in off):6.1f} ms"
    )
    print(
        f"  encode per prompt  (cache on):  {cpu_on:6.2f} ms CPU/rollout, "
        f"longest stall {statistics.median(s for _, s in on):6.1f} ms"
    )
    print(f"  ratio off/on: {cpu_off / cpu_on:.2f}x client CPU per rollout")
    async with server_process(__file__, ["--latency", str(args.latency)]) as base_url:
        mem_off = await parked_memory(base_url, args, cache=False)
        mem_on = await parked_memory(base_url, args, cache=True)
    tokenizer = load_tokenizer()
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}],
        get_tool_definitions(["terminal", "file", "web", "browser"]).schemas,
    )
    print(
        f"memory traced per rollout parked in a tool call (prompt ~"
        f"{len(tokenizer.encode(prompt))} tokens): each its own prompt {mem_off:.1f} KB, "
        f"the group's shared {mem_on:.1f} KB; ratio {mem_off / mem_on:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        anyio.run(serve, policy, args.latency)
        sys.exit(0)
    anyio.run(main, args)
