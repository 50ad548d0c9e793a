"""Token data is validated at the client boundary: ids in the vocabulary and in 32 bits,
logprobs finite and <= 0 -- a typed error naming the server, never training data."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from hermes_async.agent import AgentOptions, FailurePolicy, RolloutSetup, run_rollout
from hermes_async.inference import (
    AtroposGenerateClient,
    GenerateClient,
    InvalidTokenDataError,
    ServerProtocolError,
    SGLangGenerateClient,
    VLLMGenerateClient,
)
from hermes_async.inference._token_chunks import MAX_LOGPROB, TOKEN_ID_LIMIT
from hermes_async.inference.trajectory import MASK_ID
from hermes_async.tools.registry import get_tool_definitions
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio

VOCAB = 151_665  # len() of the built-in Qwen tokenizer
URL = "http://trainer:hunter22pw@model-host:8000"


def _body(kind: str, ids: list[int], lps: list[float]) -> tuple[bytes, str]:
    if kind == "vllm":
        choice = {
            "index": 0,
            "token_ids": ids,
            "logprobs": {
                "content": [{"token_id": i, "logprob": lp} for i, lp in zip(ids, lps, strict=True)]
            },
            "finish_reason": "stop",
        }
        return (f"data: {json.dumps({'choices': [choice]})}\n\ndata: [DONE]\n\n").encode(), (
            "text/event-stream"
        )
    if kind == "sglang":
        chunk = {
            "output_ids": ids,
            "meta_info": {
                "finish_reason": {"type": "stop"},
                "output_token_logprobs": [[lp, i, None] for i, lp in zip(ids, lps, strict=True)],
            },
        }
        return (f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n").encode(), "text/event-stream"
    payload = {
        "token_ids": [ids],
        "logprobs": [[{str(i): lp} for i, lp in zip(ids, lps, strict=True)]],
        "finish_reasons": ["stop"],
    }
    return json.dumps(payload).encode(), "application/json"


def _client(kind: str, ids: list[int], lps: list[float], **kw: Any) -> GenerateClient:
    body, content_type = _body(kind, ids, lps)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    transport = httpx.MockTransport(handler)
    if kind == "vllm":
        return VLLMGenerateClient(URL, transport=transport, **kw)
    if kind == "sglang":
        return SGLangGenerateClient(URL, transport=transport, **kw)
    return AtroposGenerateClient(URL + "/v1", transport=transport, **kw)


KINDS = ["vllm", "sglang", "atropos"]

BAD = [
    pytest.param(
        [9707, -5],
        [-0.1, -0.2],
        VOCAB,
        "token id -5 at position 1 of the chunk is negative",
        id="negative",
    ),
    pytest.param(
        [9707, 10**6],
        [-0.1, -0.2],
        VOCAB,
        r"token id 1000000 at position 1 of the chunk is outside the vocabulary \[0, 151665\)",
        id="beyond-vocab",
    ),
    pytest.param(
        [2**31],
        [-0.1],
        None,
        "token id 2147483648 at position 0 of the chunk does not fit a 32-bit",
        id="2**31",
    ),
    pytest.param(
        [2**31], [-0.1], VOCAB, r"outside the vocabulary \[0, 151665\)", id="2**31-with-vocab"
    ),
    pytest.param(
        [9707, 11],
        [-0.1, math.nan],
        VOCAB,
        "logprob nan of token 11 at position 1 .* is not finite",
        id="nan",
    ),
    pytest.param([9707], [math.inf], VOCAB, "logprob inf of token 9707 .* is not finite", id="inf"),
    pytest.param([9707], [0.5], VOCAB, "logprob 0.5 of token 9707 .* is positive", id="positive"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("ids", "lps", "vocab", "match"), BAD)
async def test_invalid_token_data_is_a_typed_error_naming_the_server(
    kind: str, ids: list[int], lps: list[float], vocab: int | None, match: str
) -> None:
    async with _client(kind, ids, lps, vocab_size=vocab) as client:
        with pytest.raises(InvalidTokenDataError, match=match) as info:
            await client.generate([1, 2, 3])
    error = info.value
    assert isinstance(error, ServerProtocolError)  # a protocol error: an infra failure
    text = str(error)
    assert "model-host:8000" in text and "hunter22pw" not in text  # the server, redacted
    assert error.line is not None  # what it sent
    assert error.token_ids == ()  # nothing of the bad chunk is handed out


@pytest.mark.parametrize("kind", KINDS)
async def test_boundary_values_are_accepted(kind: str) -> None:
    ids, lps = [0, VOCAB - 1, 5], [0.0, -1e9, MAX_LOGPROB]
    async with _client(kind, ids, lps, vocab_size=VOCAB) as client:
        completion = await client.generate([1])
    assert list(completion.token_ids) == ids and list(completion.logprobs) == lps
    # Without a vocabulary, only the 32-bit bound applies.
    async with _client(kind, [TOKEN_ID_LIMIT - 1], [-0.5]) as client:
        assert (await client.generate([1])).token_ids == (TOKEN_ID_LIMIT - 1,)


def test_vocab_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="vocab_size must be >= 1 or None, got 0"):
        VLLMGenerateClient("http://m", vocab_size=0)


@pytest.mark.parametrize("client_vocab", [len(TOKENIZER), None], ids=["client-knows", "not"])
@pytest.mark.parametrize(
    ("ids", "lps"),
    [([10**6], [-0.1]), ([2**31], [-0.1]), ([-5], [-0.1]), ([9707], [math.nan]), ([9707], [0.5])],
    ids=["beyond-vocab", "2**31", "negative", "nan", "positive"],
)
async def test_a_rollout_never_trains_on_invalid_tokens(
    ids: list[int], lps: list[float], client_vocab: int | None
) -> None:
    # 2**31 used to crash the rollout with OverflowError in the trajectory's array; -5 and
    # 10**6 went silently into the training rows, and 10**6 still did from a client built
    # without vocab_size (a pool's): the turn checks against the tokenizer too.
    async with _client("vllm", ids, lps, vocab_size=client_vocab) as client:
        rollout = await run_rollout(
            client,
            [{"role": "user", "content": "hi"}],
            get_tool_definitions(["terminal"]),
            options=AgentOptions(max_tokens=16),
            setup=RolloutSetup(tokenizer=TOKENIZER, failure_policy=FailurePolicy(max_attempts=1)),
        )
    assert rollout.failure is not None and rollout.failure.category == "infra"
    assert rollout.failure.detail["exception"] == "InvalidTokenDataError"
    assert "hunter22pw" not in str(rollout.failure) and "model-host" in str(rollout.failure)
    assert set(rollout.masks) == {MASK_ID}  # only the prompt: nothing sampled is kept
    assert all(0 <= t < len(TOKENIZER) for t in rollout.tokens)
