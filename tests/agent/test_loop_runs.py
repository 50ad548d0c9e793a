"""One HermesAgentLoop, several runs at once: per-run state, strategy fixed at construction."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from hermes_async.agent import AgentOptions, HermesAgentLoop
from hermes_async.inference.chat import ChatClient
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.testing import PolicyRequest, ScriptedModelServer, open_app_endpoint
from hermes_async.tools.registry import Tool, ToolRegistry, ToolRuntime
from tests.support import TOKENIZER, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]


class Barrier:
    """A tool that returns only once ``parties`` calls are inside it at the same time."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.inside: list[str] = []
        self.all_in = anyio.Event()

    async def __call__(self, args: JSONObject, runtime: ToolRuntime) -> str:
        self.inside.append(runtime.task_id)
        if len(self.inside) == self.parties:
            self.all_in.set()
        with anyio.fail_after(10):
            await self.all_in.wait()
        return json.dumps({"task": runtime.task_id, "tag": args["tag"]})


def registry(barrier: Barrier) -> ToolRegistry:
    schema = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
    return ToolRegistry([Tool("meet", "Waits for the others.", schema, barrier, "terminal")])


def policy(request: PolicyRequest) -> str:
    """Call ``meet`` with the user's tag, then answer with what the tool said."""
    tool = next((m for m in request.messages if m.get("role") == "tool"), None)
    if tool is not None:
        return "met as " + json.loads(str(tool["content"]))["task"]
    call = {"name": "meet", "arguments": {"tag": request.last_user_text}}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


def make_loop(
    client: Any, reg: ToolRegistry, tokenizer: Tokenizer | None = None, **kw: Any
) -> HermesAgentLoop:
    defs = reg.definitions(["terminal"])
    return HermesAgentLoop(
        client,
        defs.schemas,
        defs.valid_names,
        registry=reg,
        tokenizer=tokenizer,
        options=AgentOptions(**kw),
    )


@pytest.mark.parametrize("phase", [1, 2])
async def test_one_loop_runs_two_rollouts_at_once(phase: int) -> None:
    barrier = Barrier(2)
    reg = registry(barrier)
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER)
    async with open_app_endpoint(server, loopback=False) as (base_url, transport):
        client: Any
        if phase == 2:
            client = VLLMGenerateClient(base_url, transport=transport)
            loop = make_loop(client, reg, tokenizer=TOKENIZER, max_tokens=128)
        else:
            client = ChatClient(base_url, transport=transport)
            loop = make_loop(client, reg)
        async with client:
            conversations = {
                "a": [{"role": "user", "content": "alpha"}],
                "b": [{"role": "user", "content": "beta"}],
            }
            results: dict[str, Any] = {}

            async def run(task_id: str) -> None:
                results[task_id] = await loop.run(conversations[task_id], task_id=task_id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "a")
                tg.start_soon(run, "b")
    # Both runs were inside the tool at the same moment, each under its own task id.
    assert sorted(barrier.inside) == ["a", "b"]
    for task_id, tag in (("a", "alpha"), ("b", "beta")):
        result = results[task_id]
        assert result.messages is conversations[task_id]
        assert result.finished_naturally and result.turns_used == 2, result.error
        assert result.messages[-1]["content"] == f"met as {task_id}"
        call = result.messages[1]["tool_calls"][0]
        assert json.loads(call["function"]["arguments"]) == {"tag": tag}
        assert len(result.timings) == 2 and result.tool_errors == []
        if phase == 2:
            node = result.managed_state["nodes"][0]
            assert len(node["tokens"]) == len(node["masked_tokens"]) == len(node["logprobs"])
            assert result.template_mismatches == 0
            assert tag in TOKENIZER.decode(node["tokens"])
            other = "beta" if tag == "alpha" else "alpha"
            assert other not in TOKENIZER.decode(node["tokens"])
        else:
            assert result.managed_state is None
    assert loop.partial in (results["a"], results["b"])  # the latest run started
    assert loop.task_id not in ("a", "b")  # the loop's own default id was not used


async def test_partial_is_the_latest_run_and_the_options_are_fixed() -> None:
    server = ScriptedModelServer(lambda r: "hello")
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url, transport=transport) as client,
    ):
        loop = HermesAgentLoop(
            client, [], [], task_id="t", options=AgentOptions(max_turns=3, temperature=0.5)
        )
        assert (loop.max_turns, loop.temperature, loop.task_id) == (3, 0.5, "t")
        first = await loop.run([{"role": "user", "content": "one"}])
        assert loop.partial is first
        second = await loop.run([{"role": "user", "content": "two"}])
        assert loop.partial is second and first is not second
        assert [m["content"] for m in first.messages] == ["one", "hello"]
        with pytest.raises(AttributeError):
            loop.max_turns = 5  # type: ignore[misc]
    assert all(r.body["temperature"] == 0.5 for r in server.requests)


class Hold:
    """A tool that blocks until the test releases its run's task id."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.release: dict[str, anyio.Event] = {}

    def event(self, task_id: str) -> anyio.Event:
        return self.release.setdefault(task_id, anyio.Event())

    async def __call__(self, args: JSONObject, runtime: ToolRuntime) -> str:
        self.inside.append(runtime.task_id)
        await self.event(runtime.task_id).wait()
        return json.dumps({"task": runtime.task_id, "tag": args["tag"]})


@pytest.mark.parametrize("phase", [1, 2])
async def test_cancelling_one_run_closes_its_own_turn_only(phase: int) -> None:
    hold = Hold()
    schema = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
    reg = ToolRegistry([Tool("meet", "Blocks.", schema, hold, "terminal")])
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER)
    async with open_app_endpoint(server, loopback=False) as (base_url, transport):
        client: Any
        if phase == 2:
            client = VLLMGenerateClient(base_url, transport=transport)
            loop = make_loop(client, reg, tokenizer=TOKENIZER, max_tokens=128)
        else:
            client = ChatClient(base_url, transport=transport)
            loop = make_loop(client, reg)
        async with client, anyio.create_task_group() as tg:
            a: list[dict[str, Any]] = [{"role": "user", "content": "alpha"}]
            b: list[dict[str, Any]] = [{"role": "user", "content": "beta"}]
            scope_a = anyio.CancelScope()
            results: dict[str, Any] = {}

            async def run_a() -> None:
                with scope_a:
                    await loop.run(a, task_id="a")

            async def run_b() -> None:
                results["b"] = await loop.run(b, task_id="b")

            tg.start_soon(run_a)
            await wait_until(lambda: "a" in hold.inside)
            tg.start_soon(run_b)  # b's turn starts after a's: the latest in-flight turn
            await wait_until(lambda: "b" in hold.inside)
            scope_a.cancel(reason="test: cancel run a")
            await anyio.wait_all_tasks_blocked()  # run a has closed its turn
            hold.event("b").set()
    # Run a was closed with its own call; run b finished untouched.
    if phase == 1:
        assert [m["role"] for m in a] == ["user", "assistant", "tool"]
        assert json.loads(a[1]["tool_calls"][0]["function"]["arguments"]) == {"tag": "alpha"}
        assert a[2]["tool_call_id"] == a[1]["tool_calls"][0]["id"]
        assert "not completed: the rollout was cancelled" in a[2]["content"]
    else:  # Phase 2 appends a turn only once its tools finished
        assert a == [{"role": "user", "content": "alpha"}]
    result = results["b"]
    assert result.finished_naturally, result.error
    assert result.messages[-1]["content"] == "met as b"
    assert [m["role"] for m in b] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(b[1]["tool_calls"][0]["function"]["arguments"]) == {"tag": "beta"}
