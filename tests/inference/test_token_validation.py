"""Token data is validated at the client boundary: ids in the vocabulary and in 32 bits,
logprobs finite and <= 0 -- a typed error naming the server, never training data."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import example, given, settings, strategies as st

from hermes_async.agent import AgentOptions, FailurePolicy, RolloutSetup, run_rollout
from hermes_async.inference import (
    AtroposGenerateClient,
    GenerateClient,
    InvalidTokenDataError,
    ServerProtocolError,
    SGLangGenerateClient,
    VLLMGenerateClient,
)
from hermes_async.inference._token_chunks import (
    MAX_LOGPROB,
    TOKEN_ID_LIMIT,
    AtroposDecoder,
    ChunkDecoder,
    ChunkError,
    SGLangDecoder,
    VLLMDecoder,
)
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


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=4),
)
_KEYS = st.sampled_from(
    ["choices", "token_ids", "logprobs", "content", "logprob", "token_id", "finish_reason",
     "error", "object", "type", "meta_info", "output_ids", "output_token_logprobs",
     "finish_reasons"]
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)
_IDS = st.lists(st.integers(-2, 200_000) | _SCALARS, max_size=3)
#: Near-valid chunks of each server's shape, with any value anywhere.
_CHUNKS = st.one_of(
    _VALUES,
    st.fixed_dictionaries(
        {
            "choices": st.lists(
                st.fixed_dictionaries(
                    {
                        "token_ids": _IDS,
                        "logprobs": _VALUES
                        | st.fixed_dictionaries(
                            {
                                "content": st.lists(
                                    _VALUES
                                    | st.fixed_dictionaries(
                                        {"logprob": _VALUES, "token_id": _VALUES}
                                    ),
                                    max_size=3,
                                )
                            }
                        ),
                        "finish_reason": _VALUES,
                    }
                )
                | _VALUES,
                max_size=2,
            )
        }
    ),
    st.fixed_dictionaries(
        {
            "output_ids": _IDS,
            "meta_info": _VALUES
            | st.fixed_dictionaries(
                {
                    "output_token_logprobs": st.lists(
                        st.lists(_VALUES, max_size=3) | _VALUES, max_size=3
                    ),
                    "finish_reason": _VALUES,
                }
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "token_ids": st.lists(_IDS | _VALUES, max_size=2),
            "logprobs": st.lists(
                st.lists(
                    st.dictionaries(st.text(max_size=3), _VALUES, max_size=2) | _VALUES, max_size=3
                )
                | _VALUES,
                max_size=2,
            ),
            "finish_reasons": _VALUES,
        }
    ),
)
_DECODERS: list[Callable[[int | None], ChunkDecoder]] = [
    lambda vocab: VLLMDecoder(vocab_size=vocab),
    lambda vocab: SGLangDecoder(incremental=True, vocab_size=vocab),
    lambda vocab: SGLangDecoder(incremental=False, vocab_size=vocab),
    lambda vocab: AtroposDecoder(vocab_size=vocab),
]


@settings(max_examples=400, deadline=None, derandomize=True)  # the same cases each run
@given(payload=_CHUNKS, vocab=st.sampled_from([None, 1000]))
# Found by this test: an unhashable token_id (a TypeError), a logprobs that is not an object.
@example(
    payload={
        "choices": [{"token_ids": [], "logprobs": {"content": [{"logprob": None, "token_id": []}]}}]
    },
    vocab=None,
)
@example(
    payload={"choices": [{"token_ids": [0], "logprobs": True, "finish_reason": None}]}, vocab=None
)
def test_any_chunk_is_decoded_checked_or_refused_with_a_chunk_error(
    payload: Any, vocab: int | None
) -> None:
    """Whatever JSON a server sends, a decoder gives checked tokens, nothing, or a ChunkError
    (which the client turns into a protocol error naming the server): never another exception."""
    for make in _DECODERS:
        try:
            chunk = make(vocab).feed(payload)
        except ChunkError:
            continue
        if chunk is not None:
            assert len(chunk.token_ids) == len(chunk.logprobs)
            assert all(
                type(i) is int and 0 <= i < (vocab or TOKEN_ID_LIMIT) for i in chunk.token_ids
            )
            assert all(math.isfinite(lp) and lp <= MAX_LOGPROB for lp in chunk.logprobs)


@pytest.mark.parametrize("logprobs", [True, -3.5, "none", ["x"]])
async def test_a_vllm_chunk_whose_logprobs_is_not_an_object_is_a_protocol_error(
    logprobs: Any,
) -> None:
    choice = {"index": 0, "token_ids": [9707], "logprobs": logprobs, "finish_reason": "stop"}
    body = f"data: {json.dumps({'choices': [choice]})}\n\ndata: [DONE]\n\n".encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async with VLLMGenerateClient(URL, transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ServerProtocolError, match="logprobs must be an object or null"):
            await client.generate([1, 2, 3])
