"""HermesAgentLoop with a Phase 1 (chat) server: the reference's behaviour and its gaps fixed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from hermes_async.agent import AgentOptions, AgentResult, HermesAgentLoop
from hermes_async.agent._start_ramp import STARTS_PER_PASS
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import Tool, ToolRegistry, ToolRuntime, get_tool_definitions
from tests.support import cancelled_once_set

pytestmark = pytest.mark.anyio


def _call(name: str, args: str, call_id: str = "c1") -> SimpleNamespace:
    return SimpleNamespace(
        id=call_id, type="function", function=SimpleNamespace(name=name, arguments=args)
    )


def _reply(content: str | None = "", calls: Sequence[object] = (), **extra: Any) -> SimpleNamespace:
    message = SimpleNamespace(content=content, tool_calls=list(calls) or None, **extra)
    return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")])


class ScriptServer:
    """Replies from a list; records every request."""

    def __init__(self, replies: Sequence[object]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    async def chat_completion(self, **kwargs: Any) -> Any:
        self.requests.append({**kwargs, "messages": list(kwargs["messages"])})
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply


#: Set when a sleepy call begins (a test that cancels mid-call appends its event).
_SLEEPING: list[anyio.Event] = []


async def _sleepy(args: JSONObject, runtime: ToolRuntime) -> str:
    for event in _SLEEPING:
        event.set()
    await anyio.sleep(float(args.get("seconds", 10)))
    return json.dumps({"slept": args.get("seconds"), "tag": args.get("tag")})


def _registry() -> ToolRegistry:
    schema = {
        "type": "object",
        "properties": {"seconds": {"type": "number"}, "tag": {"type": "string"}},
    }
    reg = ToolRegistry([Tool("sleepy", "Sleeps.", schema, _sleepy, "terminal")])
    from hermes_async.tools.todo import TODO_TOOL

    reg.register(TODO_TOOL)
    return reg


def _loop(server: ScriptServer, **kw: Any) -> HermesAgentLoop:
    reg = _registry()
    defs = reg.definitions(["terminal", "todo"])
    return HermesAgentLoop(
        server, defs.schemas, defs.valid_names, registry=reg, options=AgentOptions(**kw)
    )


async def test_plain_answer_finishes_naturally() -> None:
    server = ScriptServer([_reply("hello", reasoning_content="thinking...")])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    result = await _loop(server, max_tokens=50, extra_body={"top_k": 5}).run(messages)
    assert result.messages is messages
    assert result.finished_naturally and result.turns_used == 1
    assert messages[-1] == {
        "role": "assistant",
        "content": "hello",
        "reasoning_content": "thinking...",
    }
    assert result.reasoning_per_turn == ["thinking..."]
    req = server.requests[0]
    assert req["n"] == 1 and req["temperature"] == 1.0 and req["max_tokens"] == 50
    assert req["extra_body"] == {"top_k": 5}
    assert {t["function"]["name"] for t in req["tools"]} == {"sleepy", "todo"}
    assert "tool_choice" not in req


async def test_tool_call_round_trip_and_todo_per_loop() -> None:
    todo_args = json.dumps({"todos": [{"id": "1", "content": "x", "status": "pending"}]})
    server = ScriptServer([_reply("", [_call("todo", todo_args, "t1")]), _reply("done")])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "plan"}]
    result = await _loop(server).run(messages)
    assert result.finished_naturally and result.turns_used == 2
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "todo", "arguments": todo_args}
    assert messages[2]["tool_call_id"] == "t1"
    assert json.loads(messages[2]["content"])["summary"]["pending"] == 1
    assert result.tool_errors == []
    assert "tool:0:todo" in result.timings[0]


@pytest.mark.parametrize(
    ("name", "args", "error_pattern"),
    [
        ("nope", "{}", "Unknown tool 'nope'"),
        ("sleepy", "{not json", "Invalid JSON in tool arguments"),
        ("sleepy", "[1, 2]", "must be a JSON object"),
        ("sleepy", '{"seconds": "soon"}', "field 'seconds'"),
        ("memory", "{}", "not available in RL environments"),
        ("session_search", "{}", "not available in RL environments"),
    ],
)
async def test_model_errors_are_visible_and_recorded(
    name: str, args: str, error_pattern: str
) -> None:
    server = ScriptServer([_reply("", [_call(name, args)]), _reply("ok")])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    result = await _loop(server).run(messages)
    assert result.finished_naturally
    assert len(result.tool_errors) == 1
    err = result.tool_errors[0]
    assert err.turn == 1 and err.tool_name == name and err.arguments == args
    assert error_pattern in err.error
    assert messages[2]["role"] == "tool" and error_pattern in messages[2]["content"]
    assert err.tool_result == messages[2]["content"]


async def test_tool_timeout_is_a_tool_error() -> None:
    server = ScriptServer([_reply("", [_call("sleepy", '{"seconds": 30}')]), _reply("ok")])
    result = await _loop(server, tool_timeout=0.05).run([{"role": "user", "content": "x"}])
    assert len(result.tool_errors) == 1
    assert "timed out after 0.05 seconds" in result.tool_errors[0].error


async def test_server_failure_ends_rollout_with_error() -> None:
    server = ScriptServer([_reply("", [_call("todo", "{}")]), ConnectionError("down")])
    result = await _loop(server).run([{"role": "user", "content": "x"}])
    assert not result.finished_naturally
    assert result.turns_used == 2
    assert result.error == "model call failed: ConnectionError: down"


async def test_empty_choices_end_rollout() -> None:
    result = await _loop(ScriptServer([SimpleNamespace(choices=[])])).run(
        [{"role": "user", "content": "x"}]
    )
    assert (result.finished_naturally, result.turns_used, result.error) == (
        False,
        1,
        "model returned no choices",
    )


async def test_max_turns() -> None:
    server = ScriptServer([_reply("", [_call("todo", "{}", f"c{i}")]) for i in range(3)])
    result = await _loop(server, max_turns=3).run([{"role": "user", "content": "x"}])
    assert (result.finished_naturally, result.turns_used) == (False, 3)
    assert result.messages[-1]["role"] == "tool"


async def test_dict_shaped_calls_are_normalized() -> None:
    raw = {"function": {"name": "todo", "arguments": {"todos": []}}}
    server = ScriptServer([_reply("", [raw]), _reply("ok")])
    result = await _loop(server).run([{"role": "user", "content": "x"}])
    call = result.messages[1]["tool_calls"][0]
    assert call["id"].startswith("call_") and len(call["id"]) == 13
    assert call["function"] == {"name": "todo", "arguments": '{"todos": []}'}
    assert result.tool_errors == []


async def test_sequential_by_default_parallel_on_request() -> None:
    calls = [
        _call("sleepy", json.dumps({"seconds": 0.2, "tag": "a"}), "a"),
        _call("sleepy", json.dumps({"seconds": 0.01, "tag": "b"}), "b"),
    ]
    for parallel in (False, True):
        server = ScriptServer([_reply("", calls), _reply("ok")])
        result = await _loop(server, parallel_tool_calls=parallel).run(
            [{"role": "user", "content": "x"}]
        )
        # Results are appended in call order either way.
        assert [m["tool_call_id"] for m in result.messages if m["role"] == "tool"] == ["a", "b"]
        t = result.timings[0]["tool_seconds"]
        if parallel:
            assert t < 0.2 + 0.15
        else:
            assert t >= 0.2


async def test_rollout_deadline_returns_partial() -> None:
    server = ScriptServer([_reply("", [_call("sleepy", '{"seconds": 30}')])])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x"}]
    # 0.5 s: the model's reply and the call's start must come within it on a busy machine.
    result = await _loop(server, rollout_timeout=0.5).run(messages)
    assert not result.finished_naturally
    assert result.error == "rollout deadline of 0.5 s exceeded"
    # The interrupted turn is closed consistently: the call gets a result saying why.
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[2]["tool_call_id"] == messages[1]["tool_calls"][0]["id"]
    assert "not completed: rollout deadline of 0.5 s exceeded" in messages[2]["content"]


async def test_runs_cancelled_before_they_begin_leave_their_partial() -> None:
    # More runs than the start ramp admits in a pass: most are cancelled while they wait.
    loops = [_loop(ScriptServer([_reply("done")])) for _ in range(STARTS_PER_PASS * 3)]
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            for i, loop in enumerate(loops):
                tg.start_soon(loop.run, [{"role": "user", "content": f"task {i}"}])
            await anyio.lowlevel.checkpoint()
            scope.cancel()
    for i, loop in enumerate(loops):
        assert isinstance(loop.partial, AgentResult)
        assert loop.partial.messages[0]["content"] == f"task {i}"


async def test_outer_cancellation_propagates_and_partial_is_readable() -> None:
    server = ScriptServer([_reply("", [_call("sleepy", '{"seconds": 30}')])])
    loop = _loop(server)
    sleeping = anyio.Event()
    _SLEEPING.append(sleeping)
    try:
        assert await cancelled_once_set(
            sleeping, lambda: loop.run([{"role": "user", "content": "x"}])
        )
    finally:
        _SLEEPING.remove(sleeping)
    assert isinstance(loop.partial, AgentResult)
    assert loop.partial.turns_used == 1
    roles = [m["role"] for m in loop.partial.messages]
    assert roles == ["user", "assistant", "tool"]
    assert "the rollout was cancelled" in loop.partial.messages[2]["content"]
    assert loop.limits.tool_calls.statistics().in_use == 0


async def test_reasoning_details_fallback() -> None:
    reply = _reply("a", reasoning_details=[{"type": "x"}, {"text": "deep"}])
    result = await _loop(ScriptServer([reply])).run([{"role": "user", "content": "x"}])
    assert result.reasoning_per_turn == ["deep"]


def test_reference_defaults() -> None:
    defs = get_tool_definitions(["todo"])
    loop = HermesAgentLoop(ScriptServer([]), defs.schemas, defs.valid_names)
    assert (loop.max_turns, loop.temperature, loop.max_tokens, loop.extra_body) == (
        30,
        1.0,
        None,
        None,
    )
    assert len(loop.task_id) == 36
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        HermesAgentLoop(ScriptServer([]), [], set(), max_turns=0)
    with pytest.raises(TypeError, match=r"server must have `async chat_completion.*got object"):
        HermesAgentLoop(object(), [], set())


async def _huge(args: JSONObject, runtime: ToolRuntime) -> str:
    return "x" * 150_000


async def test_oversized_result_is_persisted_into_the_sandbox() -> None:
    from hermes_async.agent.budget import BudgetConfig
    from hermes_async.tools.sandbox.manager import open_sandbox_manager

    reg = _registry()
    reg.register(Tool("huge", "Huge.", {"type": "object"}, _huge, "terminal"))
    server = ScriptServer([_reply("", [_call("huge", "{}", "big1")]), _reply("ok")])
    async with open_sandbox_manager() as manager:
        loop = HermesAgentLoop(
            server, [], {"huge"}, registry=reg, budget_config=BudgetConfig(preview_size=100)
        )
        result = await loop.run([{"role": "user", "content": "x"}])
        content = result.messages[2]["content"]
        assert content.startswith("<persisted-output>")
        assert len(content) < 5_000
        sandbox = await manager.get(loop.task_id)
        listing = await sandbox.exec("cat ${TMPDIR:-/tmp}/hermes-results/big1-*.txt | wc -c")
        assert listing.stdout.strip() == "150000"


async def _medium(args: JSONObject, runtime: ToolRuntime) -> str:
    return "y" * 5_000


async def test_results_under_the_threshold_create_no_sandbox() -> None:
    from hermes_async.tools.sandbox.manager import open_sandbox_manager

    reg = _registry()
    reg.register(Tool("medium", "Medium.", {"type": "object"}, _medium, "terminal"))
    server = ScriptServer([_reply("", [_call("medium", "{}")]), _reply("ok")])
    async with open_sandbox_manager() as manager:
        result = await HermesAgentLoop(server, [], {"medium"}, registry=reg).run(
            [{"role": "user", "content": "x"}]
        )
        assert result.messages[2]["content"] == "y" * 5_000
        assert manager.task_ids() == []  # the budget check did not create a sandbox


async def test_a_call_cut_by_max_tokens_on_a_chat_server_is_an_error_the_next_prompt_carries() -> (
    None
):
    """Decision 001 on the chat path: the scripted chat server cuts the call at max_tokens."""
    from hermes_async.inference.chat import ChatClient
    from hermes_async.inference.tokenizer import load_tokenizer
    from hermes_async.testing import PolicyRequest, ScriptedModelServer, open_app_endpoint

    long_call = (
        '<tool_call>\n{"name": "sleepy", "arguments": {"tag": "' + "x" * 200 + '"}}\n</tool_call>'
    )

    def policy(request: PolicyRequest) -> str:
        return long_call if request.request_number == 1 else "Done."

    tokenizer = load_tokenizer()
    scripted = ScriptedModelServer(policy, tokenizer=tokenizer)
    async with (
        open_app_endpoint(scripted, loopback=False) as (url, transport),
        ChatClient(url + "/v1", model="scripted", transport=transport) as client,
    ):
        reg = _registry()
        defs = reg.definitions(["terminal"])
        loop = HermesAgentLoop(client, defs.schemas, defs.valid_names, registry=reg, max_tokens=20)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "tag it"}]
        result = await loop.run(messages)
    first, second = scripted.requests
    assert first.finish_reason == "length" and len(first.completion_ids) == 20
    assistant, error = messages[1], messages[2]
    assert assistant == {"role": "assistant", "content": tokenizer.decode(first.completion_ids)}
    assert assistant["content"].startswith("<tool_call>")
    assert error["role"] == "user" and "cut off" in error["content"]
    assert [(e.turn, e.tool_name, e.category, e.error) for e in result.tool_errors] == [
        (1, "sleepy", "model", error["content"])
    ]
    # The error reached the model: the second request's prompt ends with it.
    assert second.body["messages"][-1] == error
    assert messages[-1] == {"role": "assistant", "content": "Done."}
    assert result.finished_naturally and result.turns_used == 2


async def test_calls_past_the_per_turn_cap_are_answered_with_an_error_not_run() -> None:
    calls = [_call("todo", json.dumps({"todos": []}), f"c{i}") for i in range(4)]
    server = ScriptServer([_reply("", calls), _reply("done")])
    reg = _registry()
    defs = reg.definitions(["terminal", "todo"])
    loop = HermesAgentLoop(
        server,
        defs.schemas,
        defs.valid_names,
        registry=reg,
        options=AgentOptions(max_tool_calls_per_turn=3),
    )
    result = await loop.run([{"role": "user", "content": "hi"}])
    tool_messages = [m for m in result.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c0", "c1", "c2", "c3"]
    assert "max_tool_calls_per_turn" not in tool_messages[2]["content"]
    assert "not run: this turn already has 3 tool calls" in tool_messages[3]["content"]
    assert len(result.tool_errors) == 1 and result.tool_errors[0].category == "model"


def test_max_tool_calls_per_turn_is_checked() -> None:
    with pytest.raises(ValueError, match="max_tool_calls_per_turn must be >= 1, got 0"):
        AgentOptions(max_tool_calls_per_turn=0)
    with pytest.raises(TypeError, match=r"max_tool_calls_per_turn must be an int, got 2\.5"):
        AgentOptions(max_tool_calls_per_turn=2.5)  # type: ignore[arg-type]
    assert AgentOptions().max_tool_calls_per_turn == 64
