"""A scripted workload for rollout workers: a task factory and the oracle that solves it.

Serve :func:`echo_policy` with a ``ScriptedModelServer`` and start a worker with
``hermes_async.testing.worker_tasks:echo_task``: the model runs terminal commands in a real
sandbox and writes the item's label to ``answer.txt``; the reward reads it back.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hermes_async.agent.context import ToolContext
from hermes_async.agent.options import AgentOptions
from hermes_async.agent.result import AgentResult
from hermes_async.agent.rollout import RolloutSetup, RolloutTask
from hermes_async.inference.generate import SamplingParams
from hermes_async.jsontypes import JSON
from hermes_async.testing.scripted_server import PolicyRequest
from hermes_async.tools.registry import ToolDefinitions, get_tool_definitions

__all__ = ("MAX_TURNS", "echo_policy", "echo_task")

#: Most turns an item may ask for.
MAX_TURNS = 20

_PROMPT = re.compile(
    r"Task (?P<label>[\w.-]+): (?P<turns>\d+) step\(s\), (?P<sleep>[\d.]+) s each\."
)
_TOOLS: ToolDefinitions | None = None


async def _reward(result: AgentResult, ctx: ToolContext) -> float:
    out = await ctx.terminal("cat answer.txt")
    label = str(result.messages[0]["content"]).split(":")[0].removeprefix("Task ")
    return 1.0 if str(out.get("output", "")).strip() == label else 0.0


def echo_task(item: JSON) -> RolloutTask:
    """The task for ``item`` (``{"label": str, "turns": int = 1, "sleep": float = 0}``).

    Raises:
        ValueError: A label that is not a plain word, turns outside 0-20, a negative sleep.
        TypeError: ``item`` is not an object.
    """
    global _TOOLS
    if not isinstance(item, dict):
        raise TypeError(f"an echo item is an object, got {type(item).__name__}")
    label, turns, sleep = str(item.get("label", "")), item.get("turns", 1), item.get("sleep", 0)
    if not re.fullmatch(r"[\w.-]{1,64}", label):
        raise ValueError(f"label must be a plain word of 1-64 characters, got {label!r}")
    if not isinstance(turns, int) or not 0 <= turns <= MAX_TURNS:
        raise ValueError(f"turns must be an integer in 0-{MAX_TURNS}, got {turns!r}")
    if not isinstance(sleep, int | float) or not 0 <= sleep <= 3600:
        raise ValueError(f"sleep must be 0-3600 seconds, got {sleep!r}")
    if _TOOLS is None:
        _TOOLS = get_tool_definitions(["terminal"], quiet_mode=True)
    prompt = f"Task {label}: {turns} step(s), {float(sleep):g} s each."
    return RolloutTask(
        [{"role": "user", "content": prompt}],
        _TOOLS,
        RolloutSetup(reward=_reward),
        AgentOptions(max_turns=turns + 1, sampling=SamplingParams(max_tokens=256)),
    )


def echo_policy(request: PolicyRequest) -> str:
    """The oracle for :func:`echo_task`: ``turns`` terminal calls, then an answer."""
    match = None
    for message in request.messages:
        if message.get("role") == "user":
            match = _PROMPT.search(str(message.get("content") or ""))
            break
    if match is None:
        return "I cannot tell what the task is."
    done = sum(1 for m in request.messages if m.get("role") == "assistant")
    if done >= int(match["turns"]):
        return f"Done: answer.txt holds {match['label']}."
    command = f"sleep {match['sleep']}; echo {match['label']} > answer.txt"
    call: dict[str, Any] = {"name": "terminal", "arguments": {"command": command}}
    return f"Step {done + 1}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
