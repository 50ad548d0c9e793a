"""The scripted model server and the loopback / in-process serving helpers."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from hermes_async.inference import (
    HTTPOptions,
    RetryPolicy,
    SamplingParams,
    ServerStatusError,
    VLLMGenerateClient,
)
from hermes_async.testing.http import open_app_endpoint, open_asgi_transport, open_loopback_server
from hermes_async.testing.scripted_server import (
    Fault,
    FixedScript,
    PolicyRequest,
    ScriptedModelServer,
    parse_chatml,
)
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}]
CONVERSATION = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "What is in /tmp? Answer in 日本語."},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "ls /tmp"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
    {"role": "tool", "tool_call_id": "c2", "content": "exit code 0"},
]


def test_parse_chatml_recovers_the_conversation() -> None:
    text = TOKENIZER.apply_chat_template(CONVERSATION, TOOLS)
    messages = parse_chatml(text)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert messages[0]["content"].startswith("You are a careful agent.\n\n# Tools")
    assert messages[1]["content"] == CONVERSATION[1]["content"]
    assert messages[2]["content"].startswith("Looking.\n<tool_call>\n")
    assert [m["content"] for m in messages[3:]] == ["a.txt\nb.txt", "exit code 0"]


async def test_oracle_policy_answers_from_the_conversation_on_token_routes() -> None:
    seen: list[PolicyRequest] = []

    def oracle(request: PolicyRequest) -> str:
        seen.append(request)
        outputs = [m["content"] for m in request.messages if m["role"] == "tool"]
        return f"I saw {sum(o.count('.txt') for o in outputs)} files."

    server = ScriptedModelServer(oracle, tokenizer=TOKENIZER)
    prompt = TOKENIZER.encode(TOKENIZER.apply_chat_template(CONVERSATION, TOOLS))
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        completion = await client.generate(prompt)
    assert TOKENIZER.decode(completion.token_ids) == "I saw 2 files.<|im_end|>"
    (request,) = seen
    assert request.protocol == "vllm" and request.request_number == 1
    assert request.last_user_text == CONVERSATION[1]["content"]
    assert request.prompt_text == TOKENIZER.decode(prompt)


async def test_fixed_script_exhaustion_is_a_clear_500() -> None:
    server = ScriptedModelServer(FixedScript(["only one"]), tokenizer=TOKENIZER)
    options = HTTPOptions(retry=RetryPolicy(max_attempts=1))
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport, options=options) as client,
    ):
        await client.generate([1, 2])
        with pytest.raises(
            ServerStatusError,
            match=r"HTTP 500.*FixedScript exhausted: all 1 replies were used \(request 2\)",
        ):
            await client.generate([1, 2])


async def test_a_server_that_keeps_no_requests_still_numbers_them_for_faults() -> None:
    # A benchmark's server runs for hours: it keeps no record, and fault numbers still count.
    server = ScriptedModelServer(
        FixedScript(["one", "two", "three"]),
        tokenizer=TOKENIZER,
        faults={3: Fault.http_error(503)},
        keep_requests=False,
    )
    options = HTTPOptions(retry=RetryPolicy(max_attempts=1))
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport, options=options) as client,
    ):
        await client.generate([1, 2])
        await client.generate([1, 2])
        with pytest.raises(ServerStatusError, match="HTTP 503"):
            await client.generate([1, 2])
    assert server.requests == []


async def test_chunking_and_logprobs_are_seeded() -> None:
    text = "A reply long enough to be cut into many chunks of varying size, " * 3

    async def run(seed: int) -> tuple[list[list[int]], list[float]]:
        server = ScriptedModelServer(FixedScript([text]), tokenizer=TOKENIZER, seed=seed)
        async with (
            open_app_endpoint(server, loopback=False) as (base_url, transport),
            VLLMGenerateClient(base_url, transport=transport) as client,
        ):
            await client.generate([1])
        return server.requests[0].chunks, server.requests[0].logprobs

    first, again, other = await run(1), await run(1), await run(2)
    assert first == again
    assert first[0] != other[0]
    sizes = {len(chunk) for chunk in first[0]}
    assert len(sizes) > 2 and max(sizes) <= 8
    assert all(lp <= 0 for lp in first[1])


async def test_latency_and_finite_stall_slow_the_stream_down() -> None:
    server = ScriptedModelServer(
        FixedScript(["one two three four five six"]),
        tokenizer=TOKENIZER,
        max_chunk_tokens=1,
        response_delay_seconds=0.1,
        faults={1: Fault.stall(after_tokens=2, seconds=0.2)},
    )
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        start = anyio.current_time()
        completion = await client.generate([1], SamplingParams(max_tokens=50))
        elapsed = anyio.current_time() - start
    assert elapsed >= 0.3
    assert list(completion.token_ids) == server.requests[0].completion_ids
    assert server.requests[0].fault_at_token == 2
    assert server.requests[0].completed.is_set()


@pytest.mark.parametrize("loopback", [False, True], ids=["inproc", "loopback"])
async def test_health_models_and_bad_requests(loopback: bool) -> None:
    server = ScriptedModelServer(FixedScript(["x"]), tokenizer=TOKENIZER, model_name="tiny")
    async with (
        open_app_endpoint(server, loopback=loopback) as (base_url, transport),
        httpx.AsyncClient(base_url=base_url, transport=transport) as http,
    ):
        health = await http.get("/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        models = await http.get("/v1/models")
        assert models.json()["data"][0]["id"] == "tiny"
        missing = await http.post("/nope", json={})
        assert missing.status_code == 404 and "no route POST /nope" in missing.text
        assert (await http.get("/generate")).status_code == 405
        bad = await http.post("/generate", content=b"{not json")
        assert bad.status_code == 400 and "invalid JSON body" in bad.text
        no_ids = await http.post("/inference/v1/generate", json={"token_ids": "abc"})
        assert no_ids.status_code == 400 and "prompt token ids" in no_ids.text
    assert len(server.requests) == 1  # only the generation request with a body is counted


async def test_httpx_asgi_transport_works_but_buffers() -> None:
    """httpx.ASGITransport runs the app to completion before the client sees a byte: fine
    for complete responses, so this works; stalls and disconnects need open_asgi_transport."""
    server = ScriptedModelServer(FixedScript(["buffered reply"]), tokenizer=TOKENIZER)
    transport = httpx.ASGITransport(app=server)
    async with VLLMGenerateClient("http://buffered", transport=transport) as client:
        completion = await client.generate([1])
    assert list(completion.token_ids) == server.requests[0].completion_ids


async def test_loopback_server_serves_concurrent_streams_and_shuts_down() -> None:
    server = ScriptedModelServer(
        FixedScript(["concurrent " * 10], repeat=True),
        tokenizer=TOKENIZER,
        chunk_delay_seconds=0.01,
    )
    results: list[list[int]] = []
    async with open_loopback_server(server) as base_url:
        assert base_url.startswith("http://127.0.0.1:")
        async with VLLMGenerateClient(base_url) as client, anyio.create_task_group() as tg:

            async def one() -> None:
                results.append(list((await client.generate([1])).token_ids))

            for _ in range(6):
                tg.start_soon(one)
    assert len(results) == 6
    assert sorted(results) == sorted(r.completion_ids for r in server.requests)
    # The port is closed after the block.
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"{base_url}/health")


async def test_in_process_transport_reports_app_failure_before_response() -> None:
    async def broken(scope: object, receive: object, send: object) -> None:
        raise RuntimeError("app bug")

    async with (
        open_asgi_transport(broken) as transport,  # type: ignore[arg-type]
        httpx.AsyncClient(transport=transport, base_url="http://x") as http,
    ):
        with pytest.raises(
            httpx.RemoteProtocolError, match="ASGI app failed before responding: RuntimeError"
        ):
            await http.get("/")


@pytest.mark.parametrize(
    "delays",
    [
        {"response_delay_seconds": -1.0},
        {"response_delay_seconds": float("nan")},
        {"chunk_delay_seconds": float("inf")},
    ],
)
def test_a_delay_that_is_negative_nan_or_infinite_is_refused(delays: dict[str, float]) -> None:
    # Before: a negative or NaN delay was taken as none, and an infinite one never answered.
    with pytest.raises(ValueError, match="delay_seconds must be >= 0 and finite"):
        ScriptedModelServer(lambda request: "ok", **delays)


def test_a_policy_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="policy must be a callable"):
        ScriptedModelServer("All done.")  # type: ignore[arg-type]


def test_tool_results_are_the_steps_since_the_last_user_message() -> None:
    def request(messages: list[dict[str, object]]) -> PolicyRequest:
        return PolicyRequest(tuple(messages), "", (), 1, "chat")  # type: ignore[arg-type]

    first = {"role": "user", "content": "one"}
    call = {"role": "assistant", "content": "", "tool_calls": []}
    assert request([first]).tool_results == ()
    done = [first, call, {"role": "tool", "content": "a"}, call, {"role": "tool", "content": "b"}]
    assert request(done).tool_results == ("a", "b")
    # A new user message starts over: earlier tool results are another task's.
    again = [*done, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "two"}]
    assert request(again).tool_results == ()


async def test_hermes_tool_call_is_read_back_as_the_call_it_writes() -> None:
    from hermes_async.parsers import get_parser
    from hermes_async.testing import hermes_tool_call

    arguments = {"command": "echo 'é' \"quoted\" <b>", "timeout": 5}
    text = "Let me look.\n" + hermes_tool_call("terminal", arguments)
    calls = get_parser("hermes").parse(text).tool_calls or []
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("terminal", arguments)]
    # And the chat route turns it into the structured call.
    server = ScriptedModelServer(lambda r: hermes_tool_call("terminal", arguments))
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        httpx.AsyncClient(transport=transport, base_url=base_url) as client,
    ):
        reply = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS},
        )
    sent = reply.json()["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in sent] == [arguments]
