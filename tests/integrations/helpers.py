"""What the adapter tests share: a scripted two-tool-call policy and
the check that what a trainer received is what the server sent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from hermes_async.agent import AgentOptions, AgentResult, RolloutSetup, RolloutTask, ToolContext
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.testing import (
    PolicyRequest,
    ScriptedModelServer,
    ServedRequest,
    open_app_endpoint,
)
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import TOKENIZER, tool_call

TOOLS = get_tool_definitions(["terminal", "file"])
TASK = "Put 42 in ~/answer.txt, then check it."


def two_calls(request: PolicyRequest) -> str:
    """Turn 1 writes the file, turn 2 reads it back, turn 3 answers: three turns, two tools."""
    done = sum(1 for m in request.messages if m.get("role") == "tool")
    if done == 0:
        return "I will write it." + tool_call(
            "write_file", {"path": "~/answer.txt", "content": "42\n"}
        )
    if done == 1:
        return tool_call("terminal", {"command": "cat ~/answer.txt"})
    return "The file holds 42."


async def check_answer(result: AgentResult, ctx: ToolContext) -> float:
    out = await ctx.terminal("cat ~/answer.txt")
    return 1.0 if str(out.get("output", "")).strip() == "42" else 0.0


async def raising_reward(result: AgentResult, ctx: ToolContext) -> float:
    raise RuntimeError("the verifier broke")


def make_tasks(
    manager: SandboxManager,
    *,
    reward: Any = check_answer,
    tokenizer: Tokenizer | None = TOKENIZER,
    max_tokens: int = 256,
) -> Any:
    """A task source: every item is the same task (the prompt from ``TASK``)."""

    def tasks(item: Any) -> RolloutTask:
        return RolloutTask(
            [{"role": "user", "content": TASK}],
            TOOLS,
            RolloutSetup(reward=reward, tokenizer=tokenizer, sandboxes=manager),
            AgentOptions(max_tokens=max_tokens, max_turns=6),
        )

    return tasks


@asynccontextmanager
async def scripted(
    policy: Any = two_calls, *, loopback: bool = False, **kw: Any
) -> AsyncIterator[tuple[ScriptedModelServer, str, Any]]:
    """A scripted vLLM token server: ``(server, base_url, transport)``."""
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER, **kw)
    async with open_app_endpoint(server, loopback=loopback) as (url, transport):
        yield server, url, transport


@asynccontextmanager
async def vllm_client(transport: Any, url: str) -> AsyncIterator[VLLMGenerateClient]:
    async with VLLMGenerateClient(url, transport=transport, vocab_size=len(TOKENIZER)) as client:
        yield client


def sent(
    served: Sequence[ServedRequest], prompt: list[int], completion: list[int], logprobs: list[float]
) -> bool:
    """Whether one request had exactly this prompt and the server sent exactly this."""
    return any(
        r.prompt_ids == prompt and r.completion_ids == completion and r.logprobs == logprobs
        for r in served
    )


def assert_turns_match_wire(
    turns: Sequence[tuple[list[int], list[int], list[float]]], served: Sequence[ServedRequest]
) -> None:
    """Each ``(prompt_ids, completion_ids, logprobs)`` turn is one served request's prompt and
    what it sent; each prompt extends the previous turn's prompt + completion (append-only)."""
    previous: list[int] = []
    assert turns
    for prompt, completion, logprobs in turns:
        assert sent(served, prompt, completion, logprobs)
        assert prompt[: len(previous)] == previous
        previous = prompt + completion


def assert_flat_matches_wire(
    prompt: list[int],
    response: list[int],
    mask: list[int],
    logprobs: list[float],
    served: Sequence[ServedRequest],
) -> int:
    """The mask is 1 exactly on ids the server sent, each run of them one request's whole
    answer to the ids before it; logprobs 0.0 elsewhere. Returns how many runs (turns)."""
    assert len(response) == len(mask) == len(logprobs)
    assert all(lp == 0.0 for m, lp in zip(mask, logprobs, strict=True) if m == 0)
    full = prompt + response
    runs, start = 0, None
    for i, m in enumerate([*mask, 0]):
        if m == 1 and start is None:
            start = i
        elif m != 1 and start is not None:
            at = len(prompt) + start
            assert sent(served, full[:at], full[at : len(prompt) + i], logprobs[start:i])
            runs, start = runs + 1, None
    return runs
