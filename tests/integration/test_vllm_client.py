"""Our token client (``VLLMGenerateClient``) against a real CPU vLLM."""

from __future__ import annotations

import json
import re

import anyio
import httpx
import pytest

from hermes_async.inference._http import HTTPOptions
from hermes_async.inference.generate import SamplingParams, TokenDelta, VLLMGenerateClient
from hermes_async.inference.tokenizer import QwenTokenizer
from hermes_async.parsers import ToolCallSealed, get_parser
from tests.inference.test_tokenizer import TOOLS
from tests.integration.test_vllm_wire import (
    IM_END,
    TIMEOUT,
    TOOL_CALL_REGEX,
    _generate_body,
    _prompt_ids,
)

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

OPTIONS = HTTPOptions(connect_timeout=5, read_timeout=60, request_timeout=120)


def _forced_tool_call(seed: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=96,
        temperature=1.0,
        seed=seed,
        stop_token_ids=(IM_END,),
        extra={"structured_outputs": {"regex": TOOL_CALL_REGEX}},
    )


async def test_streamed_deltas_equal_the_non_streamed_completion(
    vllm_url: str, qwen: QwenTokenizer
) -> None:
    prompt = _prompt_ids(qwen)
    deltas: list[TokenDelta] = []
    async with VLLMGenerateClient(vllm_url, options=OPTIONS) as client:
        async with client.stream(prompt, _forced_tool_call(seed=5)) as stream:
            async for delta in stream:
                assert len(delta.token_ids) == len(delta.logprobs)
                deltas.append(delta)
        completion = stream.completion()
    async with httpx.AsyncClient(base_url=vllm_url, timeout=TIMEOUT) as raw:
        response = await raw.post(
            "/inference/v1/generate", json=_generate_body(prompt, stream=False, seed=5)
        )
    reference = response.json()["choices"][0]

    streamed = [i for d in deltas for i in d.token_ids]
    assert streamed == list(completion.token_ids) == reference["token_ids"]
    assert list(completion.logprobs) == pytest.approx(
        [e["logprob"] for e in reference["logprobs"]["content"]], abs=1e-4
    )
    assert completion.finish_reason == "stop"
    assert deltas[-1].finish_reason == "stop"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert completion.token_ids[-1] == IM_END

    decoder = qwen.incremental_decoder()
    text = "".join(decoder.decode(d.token_ids) for d in deltas) + decoder.flush()
    assert text == qwen.decode(streamed)
    assert re.fullmatch(TOOL_CALL_REGEX + "<\\|im_end\\|>", text), text


async def test_hermes_parser_seals_the_forced_call_while_streaming(
    vllm_url: str, qwen: QwenTokenizer
) -> None:
    # The loop's path: deltas -> incremental decode -> streaming hermes parser. The call must
    # be sealed from the stream itself (before finish()), although constrained decoding spelled
    # the tags in ordinary tokens.
    prompt = _prompt_ids(qwen)
    parser = get_parser("hermes", tools=TOOLS[:1], tokenizer=qwen)
    decoder = qwen.incremental_decoder()
    sealed: list[ToolCallSealed] = []
    texts: list[str] = []
    async with (
        VLLMGenerateClient(vllm_url, options=OPTIONS) as client,
        client.stream(prompt, _forced_tool_call(seed=9)) as stream,
    ):
        async for delta in stream:
            ids = [i for i in delta.token_ids if i != IM_END]  # the loop drops end-of-turn
            text = decoder.decode(ids)
            texts.append(text)
            sealed += [e for e in parser.feed(text, ids) if isinstance(e, ToolCallSealed)]
    texts.append(decoder.flush())
    result = parser.finish()
    assert len(sealed) == 1
    assert result.tool_calls is not None
    assert [c.name for c in result.tool_calls] == ["terminal"]
    arguments = json.loads(result.tool_calls[0].arguments)
    assert re.fullmatch(r"[a-z]{1,12}( -[a-z]{1,3})?", arguments["command"])
    assert sealed[0].call.function == result.tool_calls[0].function
    whole = get_parser("hermes", tools=TOOLS[:1]).parse("".join(texts))
    assert whole.tool_calls is not None  # same calls (ids are fresh per parse)
    assert [c.function for c in whole.tool_calls] == [c.function for c in result.tool_calls]
    assert whole.content == result.content
    assert not result.invalid_calls and not result.truncated_calls


async def test_cancelling_the_caller_aborts_the_generation_on_the_server(
    vllm_url: str, qwen: QwenTokenizer
) -> None:
    # A long generation (1800 tokens take ~11 s here) that we abandon after the first delta:
    # closing the stream must make vLLM abort the request: it stops running at once and
    # generates far fewer than 1800 tokens. (vLLM 0.32 does not count aborts in
    # request_success_total, so the token counter is the evidence.)
    prompt = qwen.encode(qwen.apply_chat_template([{"role": "user", "content": "go"}]))
    params = SamplingParams(max_tokens=1800, seed=1, extra={"ignore_eos": True})
    async with httpx.AsyncClient(base_url=vllm_url, timeout=TIMEOUT) as raw:
        generated_before = await _metric(raw, "vllm:generation_tokens_total")
        async with VLLMGenerateClient(vllm_url, options=OPTIONS) as client:
            with anyio.CancelScope() as scope:
                async with client.stream(prompt, params) as stream:
                    async for _ in stream:
                        scope.cancel()
                        await anyio.sleep(0)  # a checkpoint: cancellation lands here
            assert scope.cancelled_caught
        with anyio.fail_after(8):  # the full generation would run ~11 s
            while await _metric(raw, "vllm:num_requests_running") > 0:
                await anyio.sleep(0.2)
        generated = await _metric(raw, "vllm:generation_tokens_total") - generated_before
        assert generated < 900, generated
        # The server is still fine.
        response = await raw.post(
            "/inference/v1/generate",
            json={"token_ids": prompt, "sampling_params": {"max_tokens": 4, "logprobs": 0}},
        )
        assert response.status_code == 200


async def _metric(client: httpx.AsyncClient, name: str) -> float:
    metrics = (await client.get("/metrics")).text
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", metrics, re.M)
    assert match, f"vLLM /metrics has no {name}"
    return float(match.group(1))
