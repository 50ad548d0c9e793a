"""HermesAgentLoop against a token server (Phase 2): exact tokens, early dispatch, failures."""

from __future__ import annotations

import json
from array import array
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

from hermes_async.agent import AgentOptions, HermesAgentLoop
from hermes_async.inference.generate import (
    Completion,
    SamplingParams,
    TokenStream,
    VLLMGenerateClient,
)
from hermes_async.inference.trajectory import MASK_ID
from hermes_async.jsontypes import JSONObject
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import Fault, FixedScript, ScriptedModelServer
from hermes_async.tools.registry import Tool, ToolRegistry, ToolRuntime
from hermes_async.tools.todo import TODO_TOOL
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio


def call_text(name: str, arguments: JSONObject) -> str:
    """A hermes tool call exactly as the chat template renders it."""
    return (
        '<tool_call>\n{"name": '
        + json.dumps(name)
        + ', "arguments": '
        + json.dumps(arguments, ensure_ascii=False)
        + "}\n</tool_call>"
    )


class Recorder:
    """A tool that records when it started and finished."""

    def __init__(self) -> None:
        self.started: list[float] = []
        self.args: list[JSONObject] = []

    async def __call__(self, args: JSONObject, runtime: ToolRuntime) -> str:
        self.started.append(anyio.current_time())
        self.args.append(args)
        await anyio.sleep(float(args.get("seconds", 0)))
        return json.dumps({"ok": True, "tag": args.get("tag")})


def registry(recorder: Recorder) -> ToolRegistry:
    schema = {
        "type": "object",
        "properties": {"seconds": {"type": "number"}, "tag": {"type": "string"}},
        "required": ["tag"],
    }
    return ToolRegistry([Tool("record", "Records.", schema, recorder, "terminal"), TODO_TOOL])


@asynccontextmanager
async def token_server(
    texts: Sequence[str], *, loopback: bool = False, **server_kw: Any
) -> AsyncIterator[tuple[ScriptedModelServer, VLLMGenerateClient]]:
    server = ScriptedModelServer(FixedScript(texts), tokenizer=TOKENIZER, **server_kw)
    async with (
        open_app_endpoint(server, loopback=loopback) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        yield server, client


def make_loop(client: VLLMGenerateClient, rec: Recorder, **kw: Any) -> HermesAgentLoop:
    reg = registry(rec)
    defs = reg.definitions(["terminal", "todo"])
    return HermesAgentLoop(
        client,
        defs.schemas,
        defs.valid_names,
        registry=reg,
        tokenizer=TOKENIZER,
        options=AgentOptions(**kw),
    )


@pytest.mark.parametrize("loopback", [False, True], ids=["in-process", "loopback"])
async def test_token_identity_over_a_multi_turn_rollout(loopback: bool) -> None:
    texts = [
        "Let me record.\n" + call_text("record", {"tag": "a"}),
        call_text("todo", {"todos": [{"id": "1", "content": "ship", "status": "completed"}]})
        + "\n"
        + call_text("record", {"tag": "ü✓"}),
        "All done: 完成 🎉",
    ]
    rec = Recorder()
    async with token_server(texts, loopback=loopback, max_chunk_tokens=5) as (server, client):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Do the thing."},
        ]
        result = await make_loop(client, rec).run(messages)
    assert result.finished_naturally and result.turns_used == 3, result.error
    assert [a["tag"] for a in rec.args] == ["a", "ü✓"]
    assert result.tool_errors == []
    node = result.managed_state["nodes"][0] if result.managed_state else {}
    tokens, masks, logprobs = node["tokens"], node["masked_tokens"], node["logprobs"]
    assert len(tokens) == len(masks) == len(logprobs)

    # What the server saw as prompts and sent as completions is exactly the trajectory.
    served = server.requests
    assert len(served) == 3
    for i, req in enumerate(served):
        assert tokens[: len(req.prompt_ids)] == req.prompt_ids
        end = len(req.prompt_ids) + len(req.completion_ids)
        assert tokens[len(req.prompt_ids) : end] == req.completion_ids
        assert masks[len(req.prompt_ids) : end] == req.completion_ids
        assert logprobs[len(req.prompt_ids) : end] == pytest.approx(req.logprobs)
        if i + 1 < len(served):
            # The suffix (tool responses + generation prompt) is masked.
            nxt = served[i + 1].prompt_ids
            assert set(masks[end : len(nxt)]) == {MASK_ID}
            assert set(logprobs[end : len(nxt)]) == {1.0}
    assert len(tokens) == len(served[-1].prompt_ids) + len(served[-1].completion_ids)
    trained = [m for m in masks if m != MASK_ID]
    assert trained == [t for req in served for t in req.completion_ids]
    # Every turn ended on the sampled <|im_end|>; it is never duplicated.
    eos = TOKENIZER.eos_token_id
    assert all(tokens[i] != eos or tokens[i + 1] != eos for i in range(len(tokens) - 1))
    # The decoded trajectory is the template's rendering of the final messages.
    assert result.template_mismatches == 0
    rendered = TOKENIZER.apply_chat_template(
        messages, make_loop(client, rec).tool_schemas, add_generation_prompt=False
    )
    assert rendered.startswith(TOKENIZER.decode(tokens))
    assert messages[-1] == {"role": "assistant", "content": "All done: 完成 🎉"}
    assert [m["role"] for m in messages].count("tool") == 3


async def test_reasoning_is_split_and_tokens_kept() -> None:
    texts = ["<think>\nhmm, easy\n</think>\n\nThe answer is 4."]
    async with token_server(texts) as (_server, client):
        result = await make_loop(client, Recorder()).run([{"role": "user", "content": "2+2"}])
    assert result.reasoning_per_turn == ["hmm, easy"]
    assert result.messages[-1] == {
        "role": "assistant",
        "content": "The answer is 4.",
        "reasoning_content": "hmm, easy",
    }
    assert result.template_mismatches == 0


@pytest.mark.virtual_clock
async def test_early_dispatch_starts_tools_before_the_stream_ends() -> None:
    long_tail = " ".join(f"word{i}" for i in range(60))
    texts = [call_text("record", {"tag": "early"}) + "\n" + long_tail, "ok"]
    rec = Recorder()
    async with token_server(texts, max_chunk_tokens=2, chunk_delay_seconds=0.01) as (
        _server,
        client,
    ):
        start = anyio.current_time()
        result = await make_loop(client, rec).run([{"role": "user", "content": "go"}])
    turn = result.timings[0]
    stream_end = start + turn["generation_seconds"]
    assert len(rec.started) == 1
    # The call was sealed long before the 60-word tail finished streaming.
    assert rec.started[0] < stream_end - 0.1
    assert turn["time_to_first_token"] < turn["generation_seconds"]


@pytest.mark.virtual_clock
async def test_without_early_dispatch_tools_wait_for_the_stream() -> None:
    texts = [call_text("record", {"tag": "late"}) + "\n" + "tail " * 30, "ok"]
    rec = Recorder()
    async with token_server(texts, max_chunk_tokens=2, chunk_delay_seconds=0.01) as (
        _server,
        client,
    ):
        start = anyio.current_time()
        result = await make_loop(client, rec, early_dispatch=False).run(
            [{"role": "user", "content": "go"}]
        )
    assert rec.started[0] >= start + result.timings[0]["generation_seconds"] - 0.02


async def test_call_cut_off_by_max_tokens_is_not_executed() -> None:
    texts = [call_text("record", {"tag": "x" * 200}), "never"]
    rec = Recorder()
    async with token_server(texts) as (_server, client):
        loop = make_loop(client, rec, max_tokens=20, max_turns=1)
        result = await loop.run([{"role": "user", "content": "go"}])
    assert rec.args == []
    assert len(result.tool_errors) == 1
    assert "cut off" in result.tool_errors[0].error
    assert "cut off" in result.messages[-1]["content"]
    node = result.managed_state["nodes"][0] if result.managed_state else {}
    # The turn did not end on <|im_end|>: the loop closed it (masked), it did not sample it.
    assert len(node["tokens"]) == len(node["masked_tokens"])


async def test_malformed_call_is_reported_and_valid_ones_still_run() -> None:
    bad = '<tool_call>\n{"name": "record", "arguments": {"tag": }\n</tool_call>'
    texts = [bad + "\n" + call_text("record", {"tag": "good"}), "ok"]
    rec = Recorder()
    async with token_server(texts) as (_server, client):
        result = await make_loop(client, rec).run([{"role": "user", "content": "go"}])
    assert [a["tag"] for a in rec.args] == ["good"]
    assert len(result.tool_errors) == 1
    tool_msgs = [m for m in result.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 2 and "could not be parsed" in tool_msgs[0]["content"]
    assert result.finished_naturally


@pytest.mark.virtual_clock
async def test_stream_cut_mid_way_ends_the_rollout_with_an_error() -> None:
    texts = [call_text("record", {"tag": "a"}), "second"]
    async with token_server(texts, faults={2: Fault.disconnect(after_tokens=1)}) as (
        _server,
        client,
    ):
        result = await make_loop(client, Recorder()).run([{"role": "user", "content": "go"}])
    assert not result.finished_naturally
    assert result.turns_used == 2
    assert result.error is not None and "model call failed" in result.error
    # The first turn's tokens are kept; the broken turn contributed none.
    node = result.managed_state["nodes"][0] if result.managed_state else {}
    assert len(node["tokens"]) == len(node["logprobs"]) == len(node["masked_tokens"])


@pytest.mark.virtual_clock
async def test_turn_timeout_on_a_stalled_stream() -> None:
    texts = ["this will stall"]
    async with token_server(texts, faults={1: Fault.stall(after_tokens=1)}) as (_s, client):
        result = await make_loop(client, Recorder(), turn_timeout=0.2).run(
            [{"role": "user", "content": "go"}]
        )
    assert result.error == "generation timed out after 0.2 s"
    assert not result.finished_naturally


async def test_sampling_parameters_reach_the_server() -> None:
    async with token_server(["hi"]) as (server, client):
        loop = make_loop(
            client, Recorder(), temperature=0.5, max_tokens=33, sampling=SamplingParams(seed=7)
        )
        await loop.run([{"role": "user", "content": "go"}])
    params = server.requests[0].body["sampling_params"]
    assert params["temperature"] == 0.5 and params["max_tokens"] == 33 and params["seed"] == 7
    assert params["stop_token_ids"] == [TOKENIZER.eos_token_id]


class _ForeignClient:
    """A TokenClient that is not one of ours (it delegates): it records what it is given."""

    def __init__(self, inner: VLLMGenerateClient) -> None:
        self.inner = inner
        self.prompts: list[Sequence[int]] = []

    def stream(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> AbstractAsyncContextManager[TokenStream]:
        self.prompts.append(prompt_ids)
        return self.inner.stream(prompt_ids, params)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> Completion:
        raise AssertionError("the loop streams")


class _RecordingClient(VLLMGenerateClient):
    """One of ours: records the prompts its requests are built from."""

    prompts: list[Sequence[int]]

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> JSONObject:
        self.prompts.append(prompt_ids)
        return super().request_body(prompt_ids, params)


async def test_prompts_are_compact_arrays_for_our_clients_and_lists_for_others() -> None:
    texts = [call_text("record", {"tag": "a"}), "done"]
    seen: dict[str, list[list[int]]] = {}
    for kind in ("ours", "foreign"):
        server = ScriptedModelServer(FixedScript(texts), tokenizer=TOKENIZER)
        async with open_app_endpoint(server, loopback=False) as (base_url, transport):
            ours = _RecordingClient(base_url, transport=transport)
            ours.prompts = []
            async with ours:
                foreign = _ForeignClient(ours)
                reg = registry(Recorder())
                defs = reg.definitions(["terminal"])
                loop = HermesAgentLoop(
                    ours if kind == "ours" else foreign,
                    defs.schemas,
                    defs.valid_names,
                    registry=reg,
                    tokenizer=TOKENIZER,
                )
                result = await loop.run([{"role": "user", "content": "go"}])
        assert result.finished_naturally and result.turns_used == 2, result.error
        prompts = ours.prompts if kind == "ours" else foreign.prompts
        wanted = array if kind == "ours" else list
        assert [type(p) for p in prompts] == [wanted, wanted]
        # Either way the server was sent exactly the trajectory's prompts.
        assert [r.prompt_ids for r in server.requests] == [list(p) for p in prompts]
        seen[kind] = [list(p) for p in prompts]
    assert seen["ours"] == seen["foreign"]


def test_token_server_needs_a_tokenizer() -> None:
    client = VLLMGenerateClient("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        HermesAgentLoop(client, [], set())


@pytest.mark.parametrize("parallel", [False, True], ids=["in-order", "parallel"])
async def test_calls_past_the_per_turn_cap_are_answered_with_an_error_not_run(
    parallel: bool,
) -> None:
    # Issue 38, A1: every call of a turn ran, one after another (2,000 terminal calls: 22 s).
    texts = ["\n".join(call_text("record", {"tag": str(i)}) for i in range(7)), "done"]
    rec = Recorder()
    async with token_server(texts) as (_, client):
        loop = HermesAgentLoop(
            client,
            *_record_tools(rec),
            registry=registry(rec),
            tokenizer=TOKENIZER,
            options=AgentOptions(max_tool_calls_per_turn=5, parallel_tool_calls=parallel),
        )
        result = await loop.run([{"role": "user", "content": "go"}])
    assert result.finished_naturally, result.error
    assert sorted(a["tag"] for a in rec.args) == ["0", "1", "2", "3", "4"]
    tool_messages = [m for m in result.messages if m["role"] == "tool"]
    assert len(tool_messages) == 7  # every call answered, in order
    for message in tool_messages[5:]:
        assert "AgentOptions.max_tool_calls_per_turn" in message["content"]
    assert [e.category for e in result.tool_errors] == ["model", "model"]


def _record_tools(rec: Recorder) -> tuple[Any, Any]:
    defs = registry(rec).definitions(["terminal", "todo"])
    return defs.schemas, defs.valid_names


async def test_an_id_outside_the_vocabulary_fails_the_turn_after_the_chunks_before_it() -> None:
    # A client built without vocab_size lets ids up to 2**31 by; the loop refuses one the
    # tokenizer cannot have made, with every chunk before it taken (all arrive in one read).
    good = TOKENIZER.encode("Looking. " + call_text("record", {"tag": "a"}))
    content = [{"token_id": i, "logprob": -0.5} for i in good]
    events = [
        {"choices": [{"token_ids": good, "logprobs": {"content": content}, "finish_reason": None}]},
        {
            "choices": [
                {
                    "token_ids": [10**6],
                    "logprobs": {"content": [{"token_id": 10**6, "logprob": -0.5}]},
                    "finish_reason": "stop",
                }
            ]
        },
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})

    async with (
        open_app_endpoint(app, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        result = await make_loop(client, Recorder()).run([{"role": "user", "content": "go"}])
    assert result.error is not None
    assert "token id 1000000 is outside the tokenizer's vocabulary" in result.error
    assert result.failure is not None
    assert result.failure.detail["completion_tokens"] == len(good)
