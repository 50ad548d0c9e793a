"""A real CPU vLLM (tiny random model, offline Qwen tokenizer), spoken to at the wire level.

These pin down the facts the clients and the agent loop rely on, independently of our clients:
streamed ids == non-streamed ids for the same seed, logprobs aligned per chunk, a
``structured_outputs`` regex forcing a hermes tool call, and vLLM rendering the same prompt ids
as our chat template.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from hermes_async.inference.tokenizer import QwenTokenizer, Tokenizer
from hermes_async.jsontypes import JSONObject
from tests.inference.test_tokenizer import CONVERSATION, TOOLS

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

TIMEOUT = httpx.Timeout(60.0, connect=5.0)
#: Forces a hermes tool call: tags spelled out, arguments JSON with a short lowercase command.
TOOL_CALL_REGEX = (
    r'<tool_call>\n\{"name": "terminal", "arguments": \{"command": "[a-z]{1,12}( -[a-z]{1,3})?"\}\}'
    r"\n</tool_call>"
)
IM_END = 151645


def _generate_body(prompt_ids: list[int], *, stream: bool, seed: int) -> JSONObject:
    return {
        "token_ids": prompt_ids,
        "sampling_params": {
            "max_tokens": 96,
            "temperature": 1.0,
            "top_p": 1.0,
            "logprobs": 0,
            "stop_token_ids": [IM_END],
            "seed": seed,
            "structured_outputs": {"regex": TOOL_CALL_REGEX},
        },
        "stream": stream,
    }


def _prompt_ids(tok: Tokenizer) -> list[int]:
    messages: list[JSONObject] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "List the files."},
    ]
    return tok.encode(tok.apply_chat_template(messages, TOOLS[:1]))


async def _stream_generate(
    client: httpx.AsyncClient, body: JSONObject
) -> tuple[list[list[int]], list[list[float]], str | None]:
    chunks: list[list[int]] = []
    logprobs: list[list[float]] = []
    finish: str | None = None
    async with client.stream("POST", "/inference/v1/generate", json=body) as response:
        assert response.status_code == 200, await response.aread()
        done = False
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                continue
            data = json.loads(payload)
            assert "error" not in data, data
            for choice in data.get("choices") or []:
                ids = list(choice["token_ids"])
                lps = [entry["logprob"] for entry in choice["logprobs"]["content"]]
                assert len(lps) == len(ids)  # aligned in every chunk
                assert [e["token_id"] for e in choice["logprobs"]["content"]] == ids
                chunks.append(ids)
                logprobs.append(lps)
                finish = choice["finish_reason"] or finish
        assert done, "stream ended without data: [DONE]"
    return chunks, logprobs, finish


async def test_streamed_ids_equal_non_streamed_ids_for_a_forced_tool_call(
    vllm_url: str, qwen: QwenTokenizer
) -> None:
    prompt = _prompt_ids(qwen)
    async with httpx.AsyncClient(base_url=vllm_url, timeout=TIMEOUT) as client:
        chunks, chunk_logprobs, finish = await _stream_generate(
            client, _generate_body(prompt, stream=True, seed=11)
        )
        response = await client.post(
            "/inference/v1/generate", json=_generate_body(prompt, stream=False, seed=11)
        )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    streamed = [i for chunk in chunks for i in chunk]
    streamed_logprobs = [lp for chunk in chunk_logprobs for lp in chunk]
    assert streamed == choice["token_ids"]
    assert streamed_logprobs == pytest.approx(
        [e["logprob"] for e in choice["logprobs"]["content"]], abs=1e-4
    )
    assert finish == choice["finish_reason"] == "stop"
    # The regex produced exactly a hermes tool call, then the model stopped on <|im_end|>,
    # which is part of the sampled ids.
    assert streamed[-1] == IM_END
    text = qwen.decode(streamed)
    assert re.fullmatch(TOOL_CALL_REGEX + "<\\|im_end\\|>", text), text
    # Constrained decoding spells the tags in ordinary tokens, not the special id 151657.
    assert qwen.special_tokens["<tool_call>"] not in streamed
    # Our incremental decoder over the real chunking equals the full decode.
    decoder = qwen.incremental_decoder()
    assert "".join(decoder.decode(c) for c in chunks) + decoder.flush() == text


async def test_different_seeds_give_different_completions(
    vllm_url: str, qwen: QwenTokenizer
) -> None:
    prompt = _prompt_ids(qwen)
    async with httpx.AsyncClient(base_url=vllm_url, timeout=TIMEOUT) as client:
        texts = set()
        for seed in (1, 2, 3):
            response = await client.post(
                "/inference/v1/generate", json=_generate_body(prompt, stream=False, seed=seed)
            )
            assert response.status_code == 200, response.text
            texts.add(qwen.decode(response.json()["choices"][0]["token_ids"]))
    assert len(texts) > 1  # the seed really reaches the sampler (guards the equality test)


@pytest.mark.parametrize("with_tools", [False, True], ids=["no-tools", "tools"])
async def test_vllm_renders_the_same_prompt_ids_as_our_template(
    vllm_url: str, qwen: QwenTokenizer, served_tokenizer: Tokenizer, with_tools: bool
) -> None:
    # vLLM renders with the chat template from the HF tokenizer directory, using its own
    # transformers version; /v1/chat/completions keeps reasoning_content (/tokenize drops it).
    tools = TOOLS if with_tools else None
    async with httpx.AsyncClient(base_url=vllm_url, timeout=TIMEOUT) as client:
        for k in (2, 3, 5, 7, 9):
            messages = CONVERSATION[:k]
            body: JSONObject = {
                "model": "tiny",
                "messages": messages,
                "max_tokens": 1,
                "return_token_ids": True,
            }
            if tools:
                body.update(tools=tools, tool_choice="none")
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            expected = qwen.encode(qwen.apply_chat_template(messages, tools))
            assert response.json()["prompt_token_ids"] == expected, k
            served = served_tokenizer.apply_chat_template(messages, tools)
            assert served_tokenizer.encode(served) == expected
