"""Asynchronous RL: aborted generations resume exactly; versions label every segment (#20)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from hermes_async.agent import AgentOptions, HermesAgentLoop
from hermes_async.agent.result import AgentResult
from hermes_async.inference.generate import SamplingParams, VLLMGenerateClient
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import Fault, FixedScript, ScriptedModelServer
from tests.agent.test_loop_phase2 import TOKENIZER, Recorder, call_text, registry

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

USER = [{"role": "user", "content": "Record twice, then stop."}]
TEXTS = [
    "Recording.\n"
    + call_text("record", {"tag": "first ü"})
    + "\n"
    + call_text("record", {"tag": "second"}),
    "Done: 完成.",
]
BUDGET = 200


@asynccontextmanager
async def serve(
    texts: Sequence[str] = TEXTS, *, stream: bool = True, **server_kw: Any
) -> AsyncIterator[tuple[ScriptedModelServer, VLLMGenerateClient]]:
    server = ScriptedModelServer(
        FixedScript(texts), tokenizer=TOKENIZER, rng_key="prompt", max_chunk_tokens=5, **server_kw
    )
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, stream=stream, transport=transport) as client,
    ):
        yield server, client


async def run(
    client: VLLMGenerateClient, rec: Recorder | None = None, **options: Any
) -> AgentResult:
    reg = registry(rec or Recorder())
    defs = reg.definitions(["terminal"])
    opts = AgentOptions(sampling=SamplingParams(max_tokens=BUDGET, seed=7), **options)
    loop = HermesAgentLoop(
        client, defs.schemas, defs.valid_names, options=opts, registry=reg, tokenizer=TOKENIZER
    )
    return await loop.run([dict(m) for m in USER])


def node(result: AgentResult) -> dict[str, Any]:
    assert result.managed_state is not None
    return dict(result.managed_state["nodes"][0])


async def reference() -> tuple[AgentResult, list[dict[str, Any]], ScriptedModelServer]:
    rec = Recorder()
    async with serve() as (server, client):
        result = await run(client, rec)
    assert result.finished_naturally, result.error
    return result, rec.args, server


def assert_same_rollout(got: AgentResult, want: AgentResult) -> None:
    a, b = node(got), node(want)
    assert a["tokens"] == b["tokens"]
    assert a["masked_tokens"] == b["masked_tokens"]
    assert a["logprobs"] == b["logprobs"]
    assert len(a["tokens"]) == len(a["masked_tokens"]) == len(a["logprobs"])
    assert got.template_mismatches == 0
    strip = [{k: v for k, v in m.items() if k != "tool_call_id"} for m in got.messages]
    want_strip = [{k: v for k, v in m.items() if k != "tool_call_id"} for m in want.messages]
    for m in (*strip, *want_strip):
        for call in m.get("tool_calls") or ():
            call.pop("id", None)
    assert strip == want_strip


def call_positions() -> tuple[int, int, int]:
    """Token positions in turn 1: inside the first call's arguments, between calls, end."""
    ids = TOKENIZER.encode(TEXTS[0])
    text_upto = [len(TOKENIZER.decode(ids[:i])) for i in range(len(ids) + 1)]
    inside = next(i for i, n in enumerate(text_upto) if n > TEXTS[0].index("first"))
    between = next(i for i, n in enumerate(text_upto) if n >= TEXTS[0].index("</tool_call>") + 12)
    return inside, between, len(ids) - 1


async def test_an_unstreamed_rollout_is_the_streamed_one() -> None:
    """``VLLMGenerateClient(stream=False)``: one JSON response per turn, the same exact ids,
    logprobs, masks and messages as the streamed rollout."""
    want, want_args, _ = await reference()
    rec = Recorder()
    async with serve(stream=False) as (server, client):
        got = await run(client, rec)
    assert got.finished_naturally, got.error
    assert_same_rollout(got, want)
    assert rec.args == want_args
    assert [len(r.chunks) for r in server.requests] == [1, 1]
    assert all(r.body["stream"] is False for r in server.requests)


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
@pytest.mark.parametrize("where", ["start", "inside-arguments", "between-calls", "last-token"])
async def test_an_abort_resumes_into_the_same_exact_rollout(where: str, stream: bool) -> None:
    want, want_args, _ = await reference()
    inside, between, last = call_positions()
    position = {"start": 0, "inside-arguments": inside, "between-calls": between}.get(where, last)
    rec = Recorder()
    async with serve(stream=stream, faults={1: Fault.abort(position)}) as (server, client):
        got = await run(client, rec)
    assert got.finished_naturally, got.error
    assert_same_rollout(got, want)
    assert rec.args == want_args  # early-dispatched calls: each exactly once
    first, resumed = server.requests[0], server.requests[1]
    assert first.finish_reason == "abort" and len(first.completion_ids) == position
    assert resumed.continued == position
    # The resume asks for the remaining budget only (slime #2260) and continues the prompt.
    assert resumed.body["sampling_params"]["max_tokens"] == BUDGET - position
    assert resumed.prompt_ids == first.prompt_ids + first.completion_ids
    assert got.managed_state is not None and got.managed_state["resumes"] == 1
    # One completion segment per turn: no version source, nothing to split.
    kinds = [(s["kind"], s["turn"]) for s in got.managed_state["segments"]]
    assert kinds == [("prompt", 0), ("completion", 1), ("suffix", 1), ("completion", 2)]


async def test_random_aborts_on_every_request_keep_the_rollout_exact() -> None:
    want, want_args, _ = await reference()
    rng = random.Random(3)

    def plan(number: int, body: dict[str, Any]) -> Fault | None:
        return Fault.abort(rng.randint(0, 12)) if rng.random() < 0.7 else None

    rec = Recorder()
    async with serve(fault_plan=plan) as (server, client):
        got = await run(client, rec, max_resumes=50)
    assert got.finished_naturally, got.error
    assert_same_rollout(got, want)
    assert rec.args == want_args
    assert server.aborted >= 2
    for req in server.requests:
        budget_left = req.body["sampling_params"]["max_tokens"]
        assert budget_left == BUDGET - (req.continued or 0)


async def test_a_version_change_splits_the_segment_exactly_at_the_resume() -> None:
    version = 3
    reads: list[int] = []

    async def source() -> int:
        reads.append(version)
        return version

    server_kw: dict[str, Any] = {"faults": {1: Fault.abort(9)}}
    async with serve(**server_kw) as (server, client):

        async def versioned() -> int:
            # The trainer bumps the version while the aborted request waits: the resume
            # (request 2) and everything after it is version 4.
            nonlocal version
            if len(server.requests) == 1 and server.requests[0].finish_reason == "abort":
                version = 4
            return await source()

        got = await run(client, version_source=versioned)
    assert got.finished_naturally, got.error
    state = got.managed_state or {}
    completions = [s for s in state["segments"] if s["kind"] == "completion"]
    first = server.requests[0]
    start = len(first.prompt_ids)
    assert [(s["turn"], s["version"]) for s in completions] == [(1, 3), (1, 4), (2, 4)]
    assert completions[0]["start"] == start
    assert completions[0]["end"] == completions[1]["start"] == start + 9
    assert state["policy_versions"] == [3, 4]
    assert reads == [3, 4, 4]  # once per request: two requests in turn 1, one in turn 2


async def test_resumes_are_bounded() -> None:
    async with serve(fault_plan=lambda n, body: Fault.abort(1)) as (server, client):
        got = await run(client, max_resumes=2)
    assert not got.finished_naturally
    assert got.failure is not None and got.failure.category == "infra"
    assert "max_resumes=2" in got.failure.message
    assert len(server.requests) == 3
    n = node(got)
    assert len(n["tokens"]) == len(n["masked_tokens"]) == len(n["logprobs"])


async def test_a_stream_cut_while_paused_resumes_when_the_probe_says_so() -> None:
    want, _, _ = await reference()
    async with serve(chunk_delay_seconds=0.01) as (server, client):

        async def trainer() -> None:
            while not server.requests or len(server.requests[0].completion_ids) < 6:
                await anyio.sleep(0.002)
            server.pause("cut")
            await anyio.sleep(0.05)
            server.resume()

        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer)
            got = await run(client, pause_probe=lambda: server.is_paused)
    assert got.finished_naturally, got.error
    assert_same_rollout(got, want)
    assert server.requests[1].continued == len(server.requests[0].completion_ids)


async def test_a_stream_cut_without_a_pause_is_still_a_failure() -> None:
    async with serve(faults={1: Fault.disconnect(4)}) as (_, client):
        got = await run(client, pause_probe=lambda: False)
    assert got.failure is not None and got.failure.category == "infra"


async def test_a_server_paused_too_long_fails_the_rollout_by_the_pause_watchdog() -> None:
    async with serve(faults={1: Fault.abort(3)}) as (server, client):
        got = await run(client, pause_probe=lambda: True, pause_timeout=0.2)
    assert got.failure is not None and "pause_timeout" in got.failure.message
    assert got.failure.category == "infra"
    assert server.requests == []  # nothing is dispatched into a pause


async def test_a_keep_pause_makes_requests_wait_and_finish() -> None:
    want, _, _ = await reference()
    async with serve(chunk_delay_seconds=0.005) as (server, client):

        async def trainer() -> None:
            while not server.requests or len(server.requests[0].completion_ids) < 4:
                await anyio.sleep(0.002)
            server.pause("keep")
            await anyio.sleep(0.05)
            server.resume()

        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer)
            got = await run(client)
    assert_same_rollout(got, want)
    assert len(server.requests) == 2  # nothing resumed: the streams waited


@pytest.mark.parametrize("kind", ["completions", "sglang", "sglang-incremental"])
async def test_aborts_resume_exactly_on_the_other_token_endpoints(kind: str) -> None:
    from hermes_async.inference import SGLangGenerateClient
    from hermes_async.inference.completions import VLLMCompletionsClient

    inside, between, _ = call_positions()

    async def once(faults: dict[int, Fault]) -> tuple[AgentResult, ScriptedModelServer]:
        server = ScriptedModelServer(
            FixedScript(TEXTS),
            tokenizer=TOKENIZER,
            rng_key="prompt",
            max_chunk_tokens=5,
            faults=faults,
            sglang_incremental=kind == "sglang-incremental",
        )
        async with open_app_endpoint(server, loopback=False) as (base_url, transport):
            client: Any
            if kind == "completions":
                client = VLLMCompletionsClient(base_url, transport=transport)
            else:
                client = SGLangGenerateClient(
                    base_url, transport=transport, incremental=kind == "sglang-incremental"
                )
            async with client:
                return await run(client), server

    want, _ = await once({})
    got, server = await once({1: Fault.abort(inside), 3: Fault.abort(between - inside)})
    assert got.finished_naturally, got.error
    assert_same_rollout(got, want)
    assert server.aborted == 2


async def test_with_a_probe_requests_wait_out_a_pause_and_read_the_version_after_it() -> None:
    version = {"v": 1}
    async with serve() as (server, client):
        server.pause("abort")

        async def trainer() -> None:
            await anyio.sleep(0.1)
            version["v"] = 2  # the weight update happens while the server is paused
            server.resume()

        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer)
            got = await run(
                client, pause_probe=lambda: server.is_paused, version_source=lambda: version["v"]
            )
    assert got.finished_naturally, got.error
    state = got.managed_state or {}
    assert [s["version"] for s in state["segments"] if s["kind"] == "completion"] == [2, 2]


async def test_the_http_pause_probe_reads_the_servers_is_paused_route() -> None:
    from hermes_async.agent import PolledPause
    from hermes_async.testing.http import open_asgi_transport

    want, _, _ = await reference()
    async with (
        serve(chunk_delay_seconds=0.01) as (server, client),
        open_asgi_transport(server) as control,
        PolledPause("http://scripted.test/is_paused", transport=control) as probe,
    ):
        assert await probe() is False

        async def trainer() -> None:
            while not server.requests or len(server.requests[0].completion_ids) < 6:
                await anyio.sleep(0.002)
            server.pause("cut")
            await anyio.sleep(0.05)
            server.resume()

        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer)
            got = await run(client, pause_probe=probe)
        assert probe.polls >= 3
    assert_same_rollout(got, want)
