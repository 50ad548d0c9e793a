"""What the agent-loop benchmarks share: a tool-turn policy, and the scripted model server
run in its own process (so its CPU never counts against the client being measured)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from hermes_async.testing import PolicyRequest, ScriptedModelServer, open_loopback_server


def tool_turns(turns: int, call: Callable[[int], dict[str, Any]]) -> Callable[[PolicyRequest], str]:
    """A policy that makes ``turns`` tool calls (``call(turn)``: name and arguments), then
    answers."""

    def policy(request: PolicyRequest) -> str:
        done = sum(1 for m in request.messages if m.get("role") == "assistant")
        if done >= turns:
            return "All steps are complete."
        return f"Step {done + 1}.\n<tool_call>\n{json.dumps(call(done))}\n</tool_call>"

    return policy


async def serve(policy: Callable[[PolicyRequest], str], model_latency: float) -> None:
    """The server side (``--serve``): print the base URL, then serve until killed."""
    # Kept alive for whole benchmark runs: no record per request (it grew to GBs).
    server = ScriptedModelServer(
        policy, response_delay_seconds=model_latency, max_chunk_tokens=8, keep_requests=False
    )
    async with open_loopback_server(server) as base_url:
        print(base_url, flush=True)
        await anyio.sleep_forever()


@asynccontextmanager
async def server_process(script: str, arguments: Sequence[str]) -> AsyncIterator[str]:
    """Run ``script --serve *arguments`` in its own process; yield its base URL."""
    command = [sys.executable, script, "--serve", *arguments]
    async with await anyio.open_process(command) as proc:
        assert proc.stdout is not None
        with anyio.fail_after(30):
            base_url = (await proc.stdout.receive()).decode().split()[0]
        try:
            yield base_url
        finally:
            proc.terminate()


async def scripted_group(
    client: Any,
    tools: Any,
    label: str,
    *,
    size: int,
    tokenizer: Any,
    options: Any,
    sandboxes: Any,
    limits: Any,
    registry: Any,
) -> Any:
    """One ``run_group`` of ``size`` rollouts of "Do task {label}.", each rewarded 1.0."""
    from hermes_async.agent import RolloutSetup, run_group

    async def reward(result: object, ctx: object) -> float:
        return 1.0

    return await run_group(
        client,
        [{"role": "user", "content": f"Do task {label}."}],
        tools,
        size=size,
        options=options,
        task_ids=[f"{label}-{i}" for i in range(size)],
        setup=RolloutSetup(
            reward=reward,
            tokenizer=tokenizer,
            sandboxes=sandboxes,
            limits=limits,
            registry=registry,
        ),
    )
