"""The reproductions of issue 16's "Why", end to end through ``run_group`` / ``run_rollout``.

Each failed before the change: ~1,000 levels of JSON nesting in one rollout's tool call made
the whole group raise (``RecursionError``); nine ``{`` in a row made ``llama3_json`` /
``llama4_json`` raise ``RuntimeError("parser made no progress")``; a lone surrogate in a chat
reply, echoed back in the next request, failed that request with ``UnicodeEncodeError`` (an
``infra`` failure, every attempt, the rollout lost). Out-of-range token ids are in
``tests/inference/test_token_validation.py`` (``test_a_rollout_never_trains_on_invalid_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from hermes_async.agent import (
    AgentOptions,
    AgentResult,
    FailurePolicy,
    RolloutSetup,
    ToolContext,
    run_group,
)
from hermes_async.inference.chat import ChatClient
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.testing import (
    FakeSandboxFactory,
    PolicyRequest,
    ScriptedModelServer,
    open_app_endpoint,
)
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox.base import ExecResult
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import FAST, TOKENIZER

pytestmark = pytest.mark.anyio

TOOLS = get_tool_definitions(["terminal"])
PROMPT = [{"role": "user", "content": "Run the check."}]
DEEP = (
    '<tool_call>\n{"name": "terminal", "arguments": {"command": '
    + '{"a": ' * 1000
    + "1"
    + "}" * 1000
    + "}}\n</tool_call>"
)


def _first_request_gets(hostile: str) -> Any:
    """The first model request of the run gets ``hostile``; every rollout then finishes."""

    def policy(request: PolicyRequest) -> str:
        if request.request_number == 1:
            return hostile
        if any(m.get("role") == "tool" for m in request.messages):
            return "Done."
        return '<tool_call>\n{"name": "terminal", "arguments": {"command": "check"}}\n</tool_call>'

    return policy


async def _one(result: AgentResult, ctx: ToolContext) -> float:
    return 1.0


@asynccontextmanager
async def _world(policy: Any, protocol: str, exec_script: Any = None) -> AsyncIterator[Any]:
    scripted = ScriptedModelServer(policy, tokenizer=TOKENIZER)
    factory = FakeSandboxFactory(exec_script=exec_script or {"*": ExecResult("ok\n", "", 0)})
    async with open_app_endpoint(scripted, loopback=False) as (url, transport):
        client: Any
        if protocol == "chat":
            client = ChatClient(url + "/v1", model="scripted", transport=transport, options=FAST)
        else:
            client = VLLMGenerateClient(url, transport=transport, options=FAST)
        async with client, SandboxManager(factory, close_timeout=1.0) as manager:
            yield client, manager, scripted


def _encodable(messages: list[dict[str, Any]]) -> None:
    json.dumps(messages, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("protocol", ["vllm", "chat"])
async def test_deep_nesting_in_one_rollout_never_sinks_its_group(protocol: str) -> None:
    async with _world(_first_request_gets(DEEP), protocol) as (client, manager, _):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=3,
            setup=RolloutSetup(
                reward=_one,
                tokenizer=TOKENIZER,
                sandboxes=manager,
                failure_policy=FailurePolicy(max_attempts=1),
            ),
        )
    assert group.outcome == "ok" and len(group.rollouts) == 3
    assert group.rewards == [1.0, 1.0, 1.0]  # the hostile one is judged by its reward
    categories = sorted(str(r.category) for r in group.rollouts)
    if protocol == "vllm":
        assert categories == ["None", "None", "model"]  # a model-visible error, nothing else
        hostile = next(r for r in group.rollouts if r.category == "model")
        assert [e.category for e in hostile.result.tool_errors] == ["model"]
    else:
        # Phase 1 keeps the reference's fallback: a <tool_call> block that does not parse
        # stays the reply's content, and the rollout ends there (no call, no error).
        assert categories == ["None", "None", "None"]
        assert sorted(r.result.turns_used for r in group.rollouts) == [1, 2, 2]
    assert len(group.to_scored_data_group()["tokens"]) == 3


@pytest.mark.parametrize("parser", ["llama3_json", "llama4_json"])
async def test_nine_braces_are_content_not_a_crash(parser: str) -> None:
    async with _world(_first_request_gets("{" * 9), "vllm") as (client, manager, _):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=2,
            options=AgentOptions(tool_call_parser=parser),
            setup=RolloutSetup(
                reward=_one,
                tokenizer=TOKENIZER,
                sandboxes=manager,
                failure_policy=FailurePolicy(max_attempts=1),
            ),
        )
    assert group.outcome == "ok"
    assert all(r.failure is None or r.category in ("model", "tool") for r in group.rollouts)
    braces = [r for r in group.rollouts if r.result.turns_used == 1]
    assert braces and braces[0].messages[-1]["content"] == "{" * 9


async def _echo(command: str) -> ExecResult:
    return ExecResult(command.removeprefix("echo ") + "\n", "", 0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_lone_surrogate_echoed_back_never_fails_the_next_request(stream: bool) -> None:
    def policy(request: PolicyRequest) -> str:
        if any(m.get("role") == "tool" for m in request.messages):
            return "Done \ud800."
        return (
            "I echo \udfff now.\n<tool_call>\n"
            '{"name": "terminal", "arguments": {"command": "echo \\ud800 and \\udfff"}}\n'
            "</tool_call>"
        )

    async with _world(policy, "chat", _echo) as (client, manager, scripted):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=4,
            options=AgentOptions(extra_body={"stream": stream}),
            setup=RolloutSetup(
                reward=_one,
                tokenizer=TOKENIZER,
                sandboxes=manager,
                failure_policy=FailurePolicy(max_attempts=1),
            ),
        )
    # Before: 'utf-8' codec can't encode character '\udfff' -> infra on every attempt.
    assert group.outcome == "ok" and group.rewards == [1.0] * 4
    assert [r.failure for r in group.rollouts] == [None] * 4
    assert len(scripted.requests) == 8  # every rollout made its second request
    for rollout in group.rollouts:
        _encodable(rollout.messages)
        assert rollout.result.finished_naturally
        assert "\ufffd" in rollout.messages[2]["content"]  # the tool saw U+FFFD, not a crash
    json.dumps(group.to_scored_data_group(), ensure_ascii=False).encode("utf-8")
