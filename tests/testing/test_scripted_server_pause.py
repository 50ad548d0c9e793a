"""The scripted server's abort / pause / resume controls and its deterministic continuations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest

from hermes_async.inference import SamplingParams, VLLMGenerateClient
from hermes_async.testing.http import open_asgi_transport
from hermes_async.testing.scripted_server import Fault, FixedScript, ScriptedModelServer
from tests.support import TOKENIZER

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

TEXT = (
    'Thinking about it. <tool_call>\n{"name": "record", "arguments": {"tag": "abc"}}\n</tool_call>'
)
PROMPT = TOKENIZER.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@asynccontextmanager
async def client_of(server: ScriptedModelServer) -> AsyncIterator[VLLMGenerateClient]:
    async with (
        open_asgi_transport(server) as transport,
        VLLMGenerateClient("http://scripted.test", transport=transport) as client,
    ):
        yield client


def make(**kw: object) -> ScriptedModelServer:
    return ScriptedModelServer(
        FixedScript([TEXT], repeat=True),
        tokenizer=TOKENIZER,
        rng_key="prompt",
        max_chunk_tokens=4,
        **kw,
    )


async def reference() -> tuple[tuple[int, ...], tuple[float, ...]]:
    async with client_of(make()) as client:
        done = await client.generate(PROMPT, SamplingParams(max_tokens=64))
    return done.token_ids, done.logprobs


@pytest.mark.parametrize("position", [0, 1, 5, 13])
async def test_an_aborted_request_continues_exactly(position: int) -> None:
    ids, logprobs = await reference()
    server = make(faults={1: Fault.abort(position)})
    async with client_of(server) as client:
        first = await client.generate(PROMPT, SamplingParams(max_tokens=64))
        assert first.finish_reason == "abort"
        assert first.token_ids == ids[:position]
        rest = await client.generate(
            [*PROMPT, *first.token_ids], SamplingParams(max_tokens=64 - position)
        )
    assert rest.finish_reason == "stop"
    assert first.token_ids + rest.token_ids == ids
    assert first.logprobs + rest.logprobs == logprobs
    assert server.requests[1].continued == position
    assert server.aborted == 1


async def test_a_continuation_keeps_the_original_budget_and_shows_an_overflow() -> None:
    ids, _ = await reference()
    budget = 10
    server = make(faults={1: Fault.abort(4), 3: Fault.abort(4)})
    async with client_of(server) as client:
        first = await client.generate(PROMPT, SamplingParams(max_tokens=budget))
        rest = await client.generate(
            [*PROMPT, *first.token_ids], SamplingParams(max_tokens=budget - 4)
        )
        # The same abort again, but the client (wrongly) asks for the full budget.
        again = await client.generate(PROMPT, SamplingParams(max_tokens=budget))
        wrong = await client.generate(
            [*PROMPT, *again.token_ids], SamplingParams(max_tokens=budget)
        )
    assert first.token_ids + rest.token_ids == ids[:budget]
    assert rest.finish_reason == "length"
    assert len(again.token_ids) + len(wrong.token_ids) == budget + 4  # visible overflow


async def test_pause_abort_ends_inflight_streams_and_holds_new_requests() -> None:
    ids, logprobs = await reference()
    server = make(chunk_delay_seconds=0.01)
    async with client_of(server) as client:
        got: list[int] = []
        async with client.stream(PROMPT, SamplingParams(max_tokens=64)) as deltas:
            async for delta in deltas:
                got.extend(delta.token_ids)
                if len(got) >= 6 and not server.is_paused:
                    server.pause("abort")
        assert deltas.finish_reason == "abort"
        assert tuple(got) == ids[: len(got)] and len(got) < len(ids)
        resumed = anyio.Event()
        result: list[tuple[int, ...]] = []

        async def continue_() -> None:
            rest = await client.generate([*PROMPT, *got], SamplingParams(max_tokens=64))
            assert resumed.is_set()  # it waited for the resume
            result.append(rest.token_ids)

        async with anyio.create_task_group() as tg:
            tg.start_soon(continue_)
            await anyio.sleep(0.05)
            assert not result
            resumed.set()
            server.resume()
    assert tuple(got) + result[0] == ids
    assert server.aborted == 1
    assert len(logprobs) == len(ids)


async def test_pause_keep_holds_inflight_streams_until_resume() -> None:
    ids, _ = await reference()
    server = make(chunk_delay_seconds=0.005)
    async with client_of(server) as client:
        got: list[int] = []
        paused_at = 0
        async with anyio.create_task_group() as tg:

            async def unpause() -> None:
                await anyio.sleep(0.05)
                assert len(got) == paused_at  # nothing arrived while paused
                server.resume()

            async with client.stream(PROMPT, SamplingParams(max_tokens=64)) as deltas:
                async for delta in deltas:
                    got.extend(delta.token_ids)
                    if len(got) >= 3 and not paused_at:
                        paused_at = len(got)
                        server.pause("keep")
                        tg.start_soon(unpause)
    assert deltas.finish_reason == "stop"
    assert tuple(got) == ids


async def test_http_pause_resume_and_is_paused() -> None:
    server = make()
    async with (
        open_asgi_transport(server) as transport,
        httpx.AsyncClient(transport=transport, base_url="http://scripted.test") as http,
    ):
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
        assert (await http.post("/pause?mode=keep")).status_code == 200
        assert (await http.get("/is_paused")).json() == {"is_paused": True}
        assert (await http.post("/pause?mode=bogus")).status_code == 400
        assert (await http.post("/resume")).status_code == 200
        assert not server.is_paused
    with pytest.raises(ValueError, match="pause mode must be"):
        server.pause("later")  # type: ignore[arg-type]


async def test_token_rate_and_shared_capacity_pace_the_streams() -> None:
    ids, _ = await reference()
    n = len(ids)
    server = make(capacity_tokens_per_second=n / 0.1)  # two streams: >= 0.2 s in all
    async with client_of(server) as client:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(client.generate, PROMPT, SamplingParams(max_tokens=64))
        assert anyio.current_time() - start >= 0.2 * 0.9
    paced = make(seconds_per_token=0.1 / n)
    async with client_of(paced) as client:
        start = anyio.current_time()
        done = await client.generate(PROMPT, SamplingParams(max_tokens=64))
        assert anyio.current_time() - start >= 0.1 * 0.9
    assert done.token_ids == ids
    with pytest.raises(ValueError, match="capacity_tokens_per_second must be > 0"):
        make(capacity_tokens_per_second=0)
