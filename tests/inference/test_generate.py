"""Token clients against the scripted server: exact ids, aligned logprobs, the fault matrix,
cancellation, and chunk validation -- each adapter, in-process and over loopback."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
import httpx
import pytest

from hermes_async.agent import AgentOptions
from hermes_async.errors import ConfigError
from hermes_async.inference import (
    AtroposGenerateClient,
    GenerateClient,
    HTTPOptions,
    SamplingParams,
    ServerProtocolError,
    ServerStatusError,
    ServerTimeoutError,
    SGLangGenerateClient,
    StreamInterruptedError,
    TokenClient,
    TokenDelta,
    VLLMGenerateClient,
)
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import (
    MALFORMED_LINE,
    Fault,
    FixedScript,
    ScriptedModelServer,
)
from tests.support import FAST, TOKENIZER

pytestmark = pytest.mark.anyio

REPLY = (
    "Let me look at the files first. 日本語のテキスト and emoji 🎉 split across tokens.\n"
    '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls -la /tmp"}}\n</tool_call>'
)
PROMPT_IDS = TOKENIZER.encode(
    TOKENIZER.apply_chat_template([{"role": "user", "content": "List the files in /tmp."}])
)

CLIENTS: dict[str, Callable[..., GenerateClient]] = {
    "vllm": VLLMGenerateClient,
    "vllm-json": partial(VLLMGenerateClient, stream=False),  # one JSON response per request
    "atropos": AtroposGenerateClient,
    "sglang": SGLangGenerateClient,
}
STREAMING = ["vllm", "sglang"]


def make_server(**kwargs: object) -> ScriptedModelServer:
    return ScriptedModelServer(FixedScript([REPLY], repeat=True), tokenizer=TOKENIZER, **kwargs)  # type: ignore[arg-type]


def make_client(
    kind: str, base_url: str, transport: httpx.AsyncBaseTransport | None, **kwargs: object
) -> GenerateClient:
    if kind == "atropos":
        base_url += "/v1"  # as atroposlib configs name it; the client strips it
    return CLIENTS[kind](base_url, transport=transport, **kwargs)


def concat(deltas: Sequence[TokenDelta]) -> tuple[list[int], list[float]]:
    ids: list[int] = []
    lps: list[float] = []
    for delta in deltas:
        assert len(delta.token_ids) == len(delta.logprobs)
        ids.extend(delta.token_ids)
        lps.extend(delta.logprobs)
    return ids, lps


# ------------------------------------------------------------------ exact ids


@pytest.mark.parametrize("loopback", [False, True], ids=["inproc", "loopback"])
@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_streamed_ids_equal_the_ids_the_server_sent(kind: str, loopback: bool) -> None:
    server = make_server(seed=7)
    async with (
        open_app_endpoint(server, loopback=loopback) as (base_url, transport),
        make_client(kind, base_url, transport) as client,
    ):
        assert isinstance(client, TokenClient)
        for _ in range(2):
            async with client.stream(PROMPT_IDS, SamplingParams(max_tokens=512)) as stream:
                deltas = [d async for d in stream]
            sent = server.requests[-1]
            ids, lps = concat(deltas)
            assert ids == sent.completion_ids
            assert lps == sent.logprobs
            assert [list(d.token_ids) for d in deltas] == sent.chunks
            assert [d.finish_reason for d in deltas][-1] == "stop"
            assert all(d.finish_reason is None for d in deltas[:-1])
            assert sent.prompt_ids == PROMPT_IDS
            assert ids[-1] == TOKENIZER.eos_token_id
            assert TOKENIZER.decode(ids[:-1]) == REPLY
    if kind in STREAMING:
        assert all(len(r.chunks) > 3 for r in server.requests)


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_a_request_waiting_for_a_slot_holds_its_body_encoded(kind: str) -> None:
    # Thousands of requests wait for a model-request slot at once: each holds its body as the
    # JSON bytes (~7 bytes a token), not as a list of Python ints (~45).
    server = make_server()
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        make_client(kind, base_url, transport) as client,
    ):
        connection = client.connection
        bodies: list[object] = []
        for name in ("open_lines", "post_json"):
            method = getattr(connection, name)

            def recording(path: str, body: object, *rest: Any, _method: Any = method) -> Any:
                bodies.append(body)
                return _method(path, body, *rest)

            setattr(connection, name, recording)
        completion = await client.generate(PROMPT_IDS, SamplingParams(max_tokens=512))
    assert list(completion.token_ids) == server.requests[-1].completion_ids
    assert len(bodies) == 1 and isinstance(bodies[0], bytes)
    assert json.loads(bodies[0]) == client.request_body(PROMPT_IDS, SamplingParams(max_tokens=512))


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_generate_collects_and_max_tokens_gives_length(kind: str) -> None:
    server = make_server()
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        make_client(kind, base_url, transport) as client,
    ):
        completion = await client.generate(PROMPT_IDS, SamplingParams(max_tokens=5))
    assert completion.finish_reason == "length"
    assert list(completion.token_ids) == server.requests[0].completion_ids
    assert len(completion.token_ids) == 5
    assert completion.chunks == len(server.requests[0].chunks)


async def test_sglang_incremental_mode() -> None:
    server = make_server(sglang_incremental=True)
    async with open_app_endpoint(server, loopback=False) as (base_url, transport):
        async with SGLangGenerateClient(base_url, transport=transport, incremental=True) as client:
            completion = await client.generate(PROMPT_IDS)
        assert list(completion.token_ids) == server.requests[0].completion_ids
        # The wrong mode is detected, not silently mis-assembled.
        async with SGLangGenerateClient(base_url, transport=transport) as client:
            with pytest.raises(
                ServerProtocolError, match=r"use SGLangGenerateClient\(\.\.\., incremental=True\)"
            ):
                await client.generate(PROMPT_IDS)


def test_request_bodies_follow_each_wire_format() -> None:
    params = SamplingParams(
        max_tokens=9,
        temperature=0.7,
        seed=3,
        stop_token_ids=(151645,),
        extra={"structured_outputs": {"regex": "a+"}},
    )
    vllm = VLLMGenerateClient("http://h").request_body([1, 2], params)
    assert vllm == {
        "token_ids": [1, 2],
        "sampling_params": {
            "temperature": 0.7,
            "top_p": 1.0,
            "stop_token_ids": [151645],
            "max_tokens": 9,
            "logprobs": 0,
            "seed": 3,
            "structured_outputs": {"regex": "a+"},
        },
        "stream": True,
    }
    atropos = AtroposGenerateClient("http://h/v1")
    assert atropos.endpoint == "POST http://h/generate"
    body = atropos.request_body([1], replace(params, extra={"min_p": 0.1}))
    assert body["prompt"] == {"prompt_token_ids": [1]} and body["logprobs"] == 0 and body["n"] == 1
    assert body["min_p"] == 0.1  # Atropos: extras at the top level
    sglang = SGLangGenerateClient("http://h").request_body([1], params)
    assert sglang["input_ids"] == [1] and sglang["return_logprob"] is True
    assert sglang["sampling_params"]["max_new_tokens"] == 9
    assert sglang["sampling_params"]["sampling_seed"] == 3
    # vLLM's structured_outputs, in SGLang's spelling.
    assert sglang["sampling_params"]["regex"] == "a+"
    assert "structured_outputs" not in sglang["sampling_params"]


# ------------------------------------------------------------------ fault matrix


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_fault_500_is_retried_then_succeeds(kind: str) -> None:
    server = make_server(faults={1: Fault.http_error(500), 2: Fault.http_error(502)})
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        make_client(kind, base_url, transport, options=FAST) as client,
    ):
        completion = await client.generate(PROMPT_IDS)
    assert len(server.requests) == 3
    assert list(completion.token_ids) == server.requests[2].completion_ids


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_fault_429_waits_for_retry_after(kind: str) -> None:
    server = make_server(faults={1: Fault.rate_limited(retry_after=0.25)})
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        make_client(kind, base_url, transport, options=FAST) as client,
    ):
        start = anyio.current_time()
        completion = await client.generate(PROMPT_IDS)
        elapsed = anyio.current_time() - start
    assert 0.25 <= elapsed < 5.0
    assert list(completion.token_ids) == server.requests[1].completion_ids


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_fault_400_is_not_retried(kind: str) -> None:
    server = make_server(faults={1: Fault.http_error(400)})
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        make_client(kind, base_url, transport, options=FAST) as client,
    ):
        with pytest.raises(ServerStatusError, match=r"HTTP 400 .*injected HTTP 400") as info:
            await client.generate(PROMPT_IDS)
    assert len(server.requests) == 1
    assert info.value.status == 400


@pytest.mark.parametrize("loopback", [False, True], ids=["inproc", "loopback"])
@pytest.mark.parametrize("kind", STREAMING)
async def test_fault_disconnect_mid_stream_raises_with_partial_tokens(
    kind: str, loopback: bool
) -> None:
    server = make_server(faults={1: Fault.disconnect(after_tokens=6)})
    received: list[int] = []
    async with (
        open_app_endpoint(server, loopback=loopback) as (base_url, transport),
        make_client(kind, base_url, transport, options=FAST) as client,
    ):
        with pytest.raises(
            StreamInterruptedError, match="closed before the response body ended"
        ) as info:
            async with client.stream(PROMPT_IDS) as stream:
                async for delta in stream:
                    received.extend(delta.token_ids)
    sent = server.requests[0]
    assert len(server.requests) == 1  # never retried once tokens flowed
    assert len(received) >= 6
    assert received == sent.completion_ids
    assert list(info.value.token_ids) == received
    assert list(info.value.logprobs) == sent.logprobs
    assert f"after {len(received)} completion tokens" in str(info.value)


async def test_fault_disconnect_atropos_is_an_interrupted_response() -> None:
    server = make_server(faults={1: Fault.disconnect()})
    async with (
        open_app_endpoint(server, loopback=True) as (base_url, transport),
        make_client("atropos", base_url, transport, options=FAST) as client,
    ):
        with pytest.raises(StreamInterruptedError, match="closed before the response body ended"):
            await client.generate(PROMPT_IDS)
    assert len(server.requests) == 1


@pytest.mark.parametrize("kind", STREAMING)
async def test_fault_malformed_chunk_names_endpoint_and_line(kind: str) -> None:
    server = make_server(faults={1: Fault.malformed(after_tokens=4)})
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        make_client(kind, base_url, transport) as client,
    ):
        with pytest.raises(
            ServerProtocolError, match=r"/generate: stream chunk is not valid JSON"
        ) as info:
            await client.generate(PROMPT_IDS)
    assert info.value.line == MALFORMED_LINE
    assert MALFORMED_LINE in str(info.value)
    sent = server.requests[0]
    assert sent.fault_at_token is not None and sent.fault_at_token >= 4
    assert list(info.value.token_ids) == sent.completion_ids[: sent.fault_at_token]


async def test_fault_malformed_atropos_body() -> None:
    server = make_server(faults={1: Fault.malformed()})
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        make_client("atropos", base_url, transport) as client,
    ):
        with pytest.raises(
            ServerProtocolError, match=r"POST .*/generate: response body is not valid JSON"
        ):
            await client.generate(PROMPT_IDS)


@pytest.mark.parametrize("loopback", [False, True], ids=["inproc", "loopback"])
@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_fault_stall_hits_the_read_timeout(kind: str, loopback: bool) -> None:
    server = make_server(faults={1: Fault.stall(after_tokens=3)})
    # 1 s, not less: under a loaded suite the in-process server once took 0.5 s to take the
    # request, and a shorter timeout fired before the stall it is here to catch.
    options = HTTPOptions(read_timeout=1.0)
    start = anyio.current_time()
    async with (
        open_app_endpoint(server, loopback=loopback) as (base_url, transport),
        make_client(kind, base_url, transport, options=options) as client,
    ):
        with pytest.raises(ServerTimeoutError, match=r"(no data for 1 s|read timeout)") as info:
            await client.generate(PROMPT_IDS)
        # The stalled request was abandoned: the server saw the client go away.
        with anyio.fail_after(5):
            await server.requests[0].disconnected.wait()
    assert anyio.current_time() - start < 10
    assert info.value.kind == "read"
    assert list(info.value.token_ids) == server.requests[0].completion_ids
    if kind in STREAMING:
        assert len(info.value.token_ids) >= 3


@pytest.mark.parametrize("kind", STREAMING)
async def test_request_deadline_bounds_a_slow_stream(kind: str) -> None:
    server = make_server(chunk_delay_seconds=0.1)
    options = HTTPOptions(request_timeout=0.35)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        make_client(kind, base_url, transport, options=options) as client,
    ):
        with pytest.raises(
            ServerTimeoutError, match="request deadline passed while reading the response"
        ) as info:
            await client.generate(PROMPT_IDS)
    assert info.value.kind == "request"
    assert 0 < len(info.value.token_ids) < len(server.requests[0].text)


# ------------------------------------------------------------------ cancellation


@pytest.mark.parametrize("loopback", [False, True], ids=["inproc", "loopback"])
@pytest.mark.parametrize("kind", STREAMING)
async def test_cancelling_the_caller_disconnects_the_server(kind: str, loopback: bool) -> None:
    server = make_server(faults={1: Fault.stall(after_tokens=2)})
    got_tokens = anyio.Event()
    async with (
        open_app_endpoint(server, loopback=loopback) as (base_url, transport),
        make_client(kind, base_url, transport) as client,
    ):

        async def consume() -> None:
            async with client.stream(PROMPT_IDS) as stream:
                async for _ in stream:
                    got_tokens.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            with anyio.fail_after(5):
                await got_tokens.wait()
            tg.cancel_scope.cancel()
        with anyio.fail_after(5):
            await server.requests[0].disconnected.wait()
        assert not server.requests[0].completed.is_set()
        # The client is still usable, and its limiter slot was released.
        server.faults.clear()
        completion = await client.generate(PROMPT_IDS)
        assert list(completion.token_ids) == server.requests[1].completion_ids
        assert client.connection.limiter.statistics().in_use == 0


@pytest.mark.parametrize("kind", STREAMING)
async def test_leaving_the_block_early_disconnects(kind: str) -> None:
    server = make_server(chunk_delay_seconds=0.05)
    async with (
        open_app_endpoint(server, loopback=True) as (base_url, transport),
        make_client(kind, base_url, transport) as client,
    ):
        async with client.stream(PROMPT_IDS) as stream:
            async for delta in stream:
                assert delta.token_ids
                break
        with anyio.fail_after(5):
            await server.requests[0].disconnected.wait()


# ------------------------------------------------------------------ chunk validation


async def _serve_lines(lines: list[str], kind: str = "vllm") -> GenerateClient:
    body = "".join(f"{line}\n" for line in lines).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return make_client(kind, "http://m", httpx.MockTransport(handler))


def _vllm(ids: list[int], lps: list[float], finish: str | None = None, **extra: object) -> str:
    content = [{"token_id": i, "logprob": lp} for i, lp in zip(ids, lps, strict=False)]
    choice = {
        "index": 0,
        "token_ids": ids,
        "logprobs": {"content": content},
        "finish_reason": finish,
    }
    return "data: " + json.dumps({"choices": [choice], **extra}) + "\n"


async def test_ids_logprobs_length_mismatch_is_an_error_not_a_pad() -> None:
    client = await _serve_lines(
        [_vllm([1, 2], [-0.1, -0.2]), _vllm([3, 4, 5], [-0.3, -0.4], "stop")]
    )
    async with client:
        with pytest.raises(
            ServerProtocolError, match="chunk has 3 token ids but 2 logprobs"
        ) as info:
            await client.generate([1])
    assert info.value.token_ids == (1, 2)
    assert info.value.line is not None and '"token_ids": [3, 4, 5]' in info.value.line


async def test_logprob_entry_for_another_token_is_an_error() -> None:
    line = "data: " + json.dumps(
        {
            "choices": [
                {
                    "token_ids": [7],
                    "logprobs": {"content": [{"token_id": 8, "logprob": -1}]},
                    "finish_reason": "stop",
                }
            ]
        }
    )
    client = await _serve_lines([line, ""])
    async with client:
        with pytest.raises(ServerProtocolError, match="logprob entry 0 is for token 8"):
            await client.generate([1])


async def test_stream_without_finish_reason_is_interrupted() -> None:
    client = await _serve_lines([_vllm([1, 2], [-0.1, -0.2]), "data: [DONE]", ""])
    async with client:
        with pytest.raises(StreamInterruptedError, match="ended without a finish_reason") as info:
            await client.generate([1])
    assert info.value.token_ids == (1, 2)


async def test_tokens_after_finish_are_an_error() -> None:
    client = await _serve_lines(
        [_vllm([1], [-0.1], "stop"), _vllm([2], [-0.2]), "data: [DONE]", ""]
    )
    async with client:
        with pytest.raises(ServerProtocolError, match="1 tokens after finish_reason 'stop'"):
            await client.generate([1])


async def test_error_frame_mid_stream() -> None:
    frame = "data: " + json.dumps({"object": "error", "message": "KV cache exhausted", "code": 500})
    client = await _serve_lines([_vllm([1], [-0.1]), "", frame, ""])
    async with client:
        with pytest.raises(
            StreamInterruptedError, match="reported an error mid-stream: KV cache exhausted"
        ) as info:
            await client.generate([1])
    assert info.value.token_ids == (1,)


async def test_non_sse_line_is_a_protocol_error() -> None:
    client = await _serve_lines(['{"text": "hello"}'])
    async with client:
        with pytest.raises(
            ServerProtocolError,
            match=r"malformed Server-Sent Events stream.*offending line: '\{\"text\"",
        ):
            await client.generate([1])


async def test_usage_chunk_and_keepalive_comments_are_skipped() -> None:
    usage = "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 2}})
    client = await _serve_lines(
        [
            ": ping",
            "",
            _vllm([1], [-0.1]),
            "",
            _vllm([2], [-0.2], "stop"),
            "",
            usage,
            "",
            "data: [DONE]",
            "",
        ]
    )
    async with client:
        completion = await client.generate([1])
    assert (
        completion.token_ids == (1, 2)
        and completion.finish_reason == "stop"
        and completion.chunks == 2
    )


def test_token_delta_rejects_misaligned_logprobs() -> None:
    with pytest.raises(ValueError, match="one logprob per token id, got 2 ids and 1 logprobs"):
        TokenDelta((1, 2), (-0.1,))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 0}, "SamplingParams.max_tokens must be an int >= 1, got 0"),
        ({"max_tokens": 2.0}, "max_tokens must be an int >= 1"),
        ({"temperature": -0.1}, "temperature must be a finite number >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ({"top_p": 0}, r"top_p must be a number in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be a number in \(0, 1\]"),
        ({"top_k": -2}, "top_k must be an int >= -1 or None"),
        ({"seed": "7"}, "seed must be an int or None, got '7'"),
        ({"stop": "###"}, r"stop must be a tuple of strings \(a bare string would stop at each"),
        ({"stop": ("a", 3)}, "stop must be a tuple of strings"),
        ({"stop_token_ids": 7}, "stop_token_ids must be a tuple of ints >= 0, got 7"),
        ({"stop_token_ids": (1, -1)}, "stop_token_ids must be a tuple of ints >= 0"),
    ],
)
def test_sampling_values_no_server_accepts_are_refused_when_made(
    fields: dict[str, Any], message: str
) -> None:
    # Before: only max_tokens was checked; a negative temperature or a bare stop string went
    # to the server, which refused every request of every rollout (or stopped on each char).
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**fields)
    assert isinstance(ConfigError(""), ValueError)  # the old `except ValueError` still holds


def test_sampling_values_at_the_edges_are_accepted() -> None:
    params = SamplingParams(
        max_tokens=1, temperature=0, top_p=1, top_k=-1, seed=0, stop=["x"], stop_token_ids=[0]
    )
    assert (params.temperature, params.top_p, params.top_k) == (0, 1, -1)
    assert replace(params, top_k=None, temperature=2.0).temperature == 2.0
    with pytest.raises(ConfigError, match=r"SamplingParams\.top_p"):
        replace(params, top_p=0.0)  # replace() runs the same checks


def test_agent_options_check_temperature_and_max_tokens_by_the_same_rules() -> None:
    with pytest.raises(ConfigError, match=r"AgentOptions\.temperature must be a finite number"):
        AgentOptions(temperature=-1)
    with pytest.raises(ConfigError, match=r"AgentOptions\.max_tokens must be an int >= 1"):
        AgentOptions(max_tokens=0)
    assert AgentOptions(temperature=None, max_tokens=None).temperature is None
    assert AgentOptions(temperature=0.0, max_tokens=8).max_tokens == 8
