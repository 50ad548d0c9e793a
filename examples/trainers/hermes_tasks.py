"""The task every trainer example runs, and the scripted model that solves it.

``task(item)`` is a task source (``item -> RolloutTask``): the trainer's item is ignored, every
rollout puts 42 in ``~/answer.txt`` with two tool calls and is rewarded by reading it back in
its own sandbox. ``scripted_model()`` serves vLLM's token protocol on 127.0.0.1 with a policy
that does exactly that, so the examples run offline. Point an adapter at a real vLLM instead
and keep ``task``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from hermes_async.agent import AgentOptions, AgentResult, RolloutSetup, RolloutTask, ToolContext
from hermes_async.inference.tokenizer import load_tokenizer
from hermes_async.testing import PolicyRequest, ScriptedModelServer, open_loopback_server
from hermes_async.tools.registry import get_tool_definitions

TOKENIZER = load_tokenizer()
TOOLS = get_tool_definitions(["terminal", "file"])


async def check_answer(result: AgentResult, ctx: ToolContext) -> float:
    out = await ctx.terminal("cat ~/answer.txt")
    return 1.0 if str(out.get("output", "")).strip() == "42" else 0.0


def task(item: Any) -> RolloutTask:
    """The rollout of any item: sandboxes are the default (a private local manager)."""
    return RolloutTask(
        [{"role": "user", "content": "Put 42 in ~/answer.txt, then check it."}],
        TOOLS,
        RolloutSetup(reward=check_answer, tokenizer=TOKENIZER),
        AgentOptions(max_tokens=256, max_turns=6),
    )


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def solve(request: PolicyRequest) -> str:
    """Write the file, read it back, answer: three turns, two tool calls."""
    done = sum(1 for m in request.messages if m.get("role") == "tool")
    if done == 0:
        return "I will write it." + _call("write_file", {"path": "~/answer.txt", "content": "42\n"})
    if done == 1:
        return _call("terminal", {"command": "cat ~/answer.txt"})
    return "The file holds 42."


@asynccontextmanager
async def scripted_model() -> AsyncIterator[tuple[ScriptedModelServer, str]]:
    """``(server, base_url)``: the scripted model over loopback HTTP while the block runs."""
    server = ScriptedModelServer(solve, tokenizer=TOKENIZER)
    async with open_loopback_server(server) as url:
        yield server, url
