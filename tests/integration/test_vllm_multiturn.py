"""Multi-turn Phase 2 rollouts against a real CPU vLLM, on the generate route and on the stock
completions route.

N rollouts run at once, 3 turns each: two tool calls forced by ``structured_outputs`` (the
first through the loop's ``extra_body``; the second, a compact-JSON call, and the final short
answer by regexes a ``sampling_hook`` puts on turns 2 and 3). What vLLM streamed is recorded at the HTTP level (a
tee on the transport) and parsed here independently of our clients; every rollout's trajectory
must hold exactly those ids and bit-equal logprobs, aligned masks, no doubled end-of-turn, and
the template check must find nothing. A ``max_tokens`` cut inside a call is the cut call's
text as content plus a model-visible error, and still no template mismatch.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import httpx
import pytest

from hermes_async.agent import AgentOptions, AgentResult, HermesAgentLoop
from hermes_async.inference._http import HTTPOptions
from hermes_async.inference.completions import VLLMCompletionsClient, detect_token_endpoint
from hermes_async.inference.generate import GenerateClient, SamplingParams, VLLMGenerateClient
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.inference.trajectory import MASK_ID
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import Tool, ToolRegistry, ToolRuntime
from tests.integration.test_vllm_wire import IM_END, TOOL_CALL_REGEX

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

ROLLOUTS = 6
ANSWER_REGEX = r"[a-z]{1,12}"
# The model's own spelling of a call (no spaces): the message must keep it, so the template
# renders what was sampled.
COMPACT_CALL_REGEX = (
    r'<tool_call>\n\{"name":"terminal","arguments":\{"command":"[a-z]{1,12}"\}\}\n</tool_call>'
)
OPTIONS = HTTPOptions(connect_timeout=5, read_timeout=120, request_timeout=300)
TERMINAL_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, sink: bytearray) -> None:
        self._inner = inner
        self._sink = sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._sink += chunk
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class RecordingTransport(httpx.AsyncBaseTransport):
    """A real network transport that keeps every request body and raw response body."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[tuple[JSONObject, bytearray]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread())
        response = await self._inner.handle_async_request(request)
        raw = bytearray()
        self.exchanges.append((body, raw))
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Tee(response.stream, raw),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def streamed(raw: bytes, route: str) -> tuple[list[int], list[float], str | None]:
    """The ids, logprobs and finish reason in a raw SSE body, parsed here (not by our client)."""
    ids: list[int] = []
    lps: list[float] = []
    finish = None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line[len("data: ") :])
        assert "error" not in data, data
        for choice in data.get("choices") or []:
            chunk_ids = list(choice.get("token_ids") or [])
            if route == "vllm":
                chunk_lps = [e["logprob"] for e in choice["logprobs"]["content"]]
            else:
                chunk_lps = list((choice.get("logprobs") or {}).get("token_logprobs") or [])
            assert len(chunk_ids) == len(chunk_lps)  # aligned in every chunk
            ids += chunk_ids
            lps += chunk_lps
            finish = choice.get("finish_reason") or finish
    return ids, lps, finish


async def _terminal(args: JSONObject, runtime: ToolRuntime) -> str:
    return json.dumps({"output": f"ran {args['command']}", "exit_code": 0})


def _registry() -> ToolRegistry:
    return ToolRegistry(
        [Tool("terminal", "Run a command.", TERMINAL_SCHEMA, _terminal, "terminal")]
    )


def _per_turn(turn: int, messages: Sequence[JSONObject], params: SamplingParams) -> Any:
    if turn == 1:
        return None  # the loop's extra_body
    regex = COMPACT_CALL_REGEX if turn == 2 else ANSWER_REGEX
    return dataclasses.replace(params, extra={"structured_outputs": {"regex": regex}})


TURN_REGEXES = (TOOL_CALL_REGEX, COMPACT_CALL_REGEX, ANSWER_REGEX)


def _client(route: str, url: str, transport: RecordingTransport) -> GenerateClient:
    if route == "vllm":
        return VLLMGenerateClient(url, options=OPTIONS, transport=transport)
    return VLLMCompletionsClient(url, model="tiny", options=OPTIONS, transport=transport)


def _check_rollout(
    result: AgentResult,
    exchanges: list[tuple[JSONObject, bytearray]],
    route: str,
    tokenizer: Tokenizer,
) -> list[tuple[list[int], str | None]]:
    """Assert one rollout's trajectory is what vLLM streamed; return (ids, finish) per turn."""
    state = result.managed_state or {}
    node = state["nodes"][0]
    tokens, masks, logprobs = node["tokens"], node["masked_tokens"], node["logprobs"]
    assert len(tokens) == len(masks) == len(logprobs)
    prompt_key = "token_ids" if route == "vllm" else "prompt"
    turns = []
    for segment in state["segments"]:
        if segment["kind"] != "completion":
            continue
        start, end = segment["start"], segment["end"]
        # The request whose prompt is exactly this trajectory's prefix up to the completion.
        (raw,) = [r for body, r in exchanges if body.get(prompt_key) == tokens[:start]]
        ids, lps, finish = streamed(bytes(raw), route)
        assert tokens[start:end] == ids
        assert masks[start:end] == ids
        assert logprobs[start:end] == lps  # bit-equal: the floats as JSON carried them
        turns.append((ids, finish))
    trained = [t for t, m in zip(tokens, masks, strict=True) if m != MASK_ID]
    assert trained == [t for ids, _ in turns for t in ids]
    assert all(lp == 1.0 for lp, m in zip(logprobs, masks, strict=True) if m == MASK_ID)
    assert all(tokens[i] != IM_END or tokens[i + 1] != IM_END for i in range(len(tokens) - 1))
    assert result.template_mismatches == 0, [c.describe() for c in result.template_checks]
    return turns


@pytest.mark.parametrize("route", ["vllm", "completions"])
async def test_concurrent_three_turn_rollouts_keep_every_sampled_token(
    vllm_url: str, served_tokenizer: Tokenizer, route: str
) -> None:
    transport = RecordingTransport()
    results: list[AgentResult] = []
    started = time.monotonic()
    async with _client(route, vllm_url, transport) as client:
        registry = _registry()
        defs = registry.definitions(["terminal"])
        loop = HermesAgentLoop(
            client,
            defs.schemas,
            defs.valid_names,
            max_turns=3,
            max_tokens=96,
            registry=registry,
            tokenizer=served_tokenizer,
            extra_body={"structured_outputs": {"regex": TOOL_CALL_REGEX}},
            options=AgentOptions(sampling_hook=_per_turn),
        )

        async def one(i: int) -> None:
            messages = [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": f"Task {i}: list the files."},
            ]
            results.append(await loop.run(messages, task_id=f"r{i}", seed=100 + i))

        async with anyio.create_task_group() as tg:
            for i in range(ROLLOUTS):
                tg.start_soon(one, i)
    seconds = time.monotonic() - started
    print(f"\n[{route}] {ROLLOUTS} rollouts x 3 turns in {seconds:.1f} s")
    assert len(results) == ROLLOUTS
    for result in results:
        assert result.turns_used == 3 and result.error is None
        turns = _check_rollout(result, transport.exchanges, route, served_tokenizer)
        assert len(turns) == 3
        for n, (ids, finish) in enumerate(turns, start=1):
            assert finish == "stop" and ids[-1] == IM_END
            text = served_tokenizer.decode(ids[:-1])
            # The extras reached vLLM: every output is what its regex forces.
            assert re.fullmatch(TURN_REGEXES[n - 1], text), text
        calls = [m for m in result.messages if m.get("tool_calls")]
        assert len(calls) == 2 and result.finished_naturally
        # The compact call is stored as the model wrote it.
        compact = calls[1]["tool_calls"][0]["function"]["arguments"]
        assert compact.startswith('{"command":"') and " " not in compact
        assert [m["role"] for m in result.messages].count("tool") == 2
        assert not result.tool_errors
    bodies = [body for body, _ in transport.exchanges]
    if route == "vllm":
        regexes = [b["sampling_params"]["structured_outputs"]["regex"] for b in bodies]
    else:
        regexes = [b["structured_outputs"]["regex"] for b in bodies]
    assert [regexes.count(r) for r in TURN_REGEXES] == [ROLLOUTS] * 3


@pytest.mark.parametrize("route", ["vllm", "completions"])
async def test_a_max_tokens_cut_inside_a_call_is_content_and_an_error(
    vllm_url: str, served_tokenizer: Tokenizer, route: str
) -> None:
    transport = RecordingTransport()

    def hook(turn: int, messages: Sequence[JSONObject], params: SamplingParams) -> Any:
        if turn == 1:  # cut inside the forced call
            return dataclasses.replace(params, max_tokens=14)
        return dataclasses.replace(params, extra={"structured_outputs": {"regex": ANSWER_REGEX}})

    async with _client(route, vllm_url, transport) as client:
        registry = _registry()
        defs = registry.definitions(["terminal"])
        loop = HermesAgentLoop(
            client,
            defs.schemas,
            defs.valid_names,
            max_turns=2,
            max_tokens=96,
            registry=registry,
            tokenizer=served_tokenizer,
            extra_body={"structured_outputs": {"regex": TOOL_CALL_REGEX}},
            options=AgentOptions(sampling_hook=hook),
        )
        messages = [{"role": "user", "content": "List the files."}]
        result = await loop.run(messages, seed=7)
    turns = _check_rollout(result, transport.exchanges, route, served_tokenizer)
    (cut_ids, cut_finish), (_, final_finish) = turns
    assert cut_finish == "length" and len(cut_ids) == 14 and IM_END not in cut_ids
    assistant, error = result.messages[1], result.messages[2]
    assert "tool_calls" not in assistant
    assert assistant["content"] == served_tokenizer.decode(cut_ids)
    assert assistant["content"].startswith("<tool_call>")
    assert error["role"] == "user" and "cut off" in error["content"]
    assert [e.error for e in result.tool_errors] == [error["content"]]
    assert final_finish == "stop" and result.finished_naturally
    assert result.template_checks == []


async def test_the_probe_finds_the_generate_route_on_a_scale_out_server(vllm_url: str) -> None:
    assert await detect_token_endpoint(vllm_url + "/v1") == "vllm"
