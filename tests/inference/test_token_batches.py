"""TokenStream.next_batch: the same deltas as iterating, however the body is cut, errors after
the deltas before them; vLLM chunk checks give the same results on their fast path."""

from __future__ import annotations

import json
import math
import random

import anyio
import pytest

from hermes_async.inference import ServerProtocolError, StreamInterruptedError
from hermes_async.inference._body import BodyContext, LineReader
from hermes_async.inference._errors import ModelServerError
from hermes_async.inference._sse import SSEJSONReader
from hermes_async.inference._token_chunks import ChunkError, VLLMDecoder
from hermes_async.inference.generate import TokenDelta, TokenStream
from tests.inference.test_body import ChunkedResponse, cut

pytestmark = pytest.mark.anyio


def _event(ids: list[int], finish: str | None = None, *, token_id: bool = True) -> str:
    content = [
        {"token_id": i, "logprob": -0.5 - i / 100} if token_id else {"logprob": -1} for i in ids
    ]
    choice = {"token_ids": ids, "logprobs": {"content": content}, "finish_reason": finish}
    return "data: " + json.dumps({"choices": [choice]})


#: One body with every SSE shape a server may send: one-line events, CRLF, comments, an
#: ``event:`` field, a data line split in two, the usage chunk, ``[DONE]``.
BODY = "\n".join(
    [
        ": keep-alive",
        "",
        _event([1, 2]),
        "",
        _event([3]) + "\r",
        "\r",
        "event: tokens",
        _event([4, 5, 6]),
        "",
        'data: {"choices": [{"token_ids": [7], "finish_reason": null,',
        'data: "logprobs": {"content": [{"token_id": 7, "logprob": -0.25}]}}]}',
        "",
        _event([8, 9], token_id=False),
        "",
        _event([10], "stop"),
        "",
        'data: {"choices": [], "usage": {"completion_tokens": 10}}',
        "",
        "data: [DONE]",
        "",
        "",
    ]
).encode()


def _stream(chunks: list[bytes]) -> tuple[TokenStream, ChunkedResponse]:
    response = ChunkedResponse(chunks)
    context = BodyContext("POST http://m/generate", 1, anyio.current_time() + 60, 30.0, 2**20)
    reader = LineReader(response, context, max_line_bytes=2**20)
    sse = SSEJSONReader(reader, max_event_bytes=2**20)
    return TokenStream(sse, VLLMDecoder(vocab_size=100), "POST http://m/generate", max_tokens=64), (
        response
    )


async def _iterated(chunks: list[bytes]) -> list[TokenDelta] | ModelServerError:
    stream, _ = _stream(chunks)
    out: list[TokenDelta] = []
    try:
        async for delta in stream:
            out.append(delta)
    except ModelServerError as exc:
        return exc
    return out


async def _batched(chunks: list[bytes]) -> tuple[list[list[TokenDelta]], ModelServerError | None]:
    stream, _ = _stream(chunks)
    batches: list[list[TokenDelta]] = []
    try:
        while (batch := await stream.next_batch()) is not None:
            batches.append(batch)
    except ModelServerError as exc:
        return batches, exc
    return batches, None


async def test_batches_hold_the_iterated_deltas_however_the_body_is_cut() -> None:
    expected = await _iterated([BODY])
    assert isinstance(expected, list)
    assert [i for d in expected for i in d.token_ids] == list(range(1, 11))
    assert expected[-1].finish_reason == "stop"
    rng = random.Random(3)
    for max_piece in (2, 7, 40, 200, len(BODY)):
        for _ in range(5):
            chunks = cut(BODY, rng, max_piece)
            batches, error = await _batched(chunks)
            assert error is None
            assert [d for batch in batches for d in batch] == expected
    # Received at once, the deltas come in one batch: one parser feed per network read.
    batches, _ = await _batched([BODY])
    assert len(batches) == 1


async def test_the_connection_is_left_read_to_its_end() -> None:
    stream, response = _stream([BODY])
    while await stream.next_batch() is not None:
        pass
    assert response.body_received and stream.completion().token_ids == tuple(range(1, 11))


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ("data: {not json", ServerProtocolError, "stream chunk is not valid JSON"),
        ("retry", ServerProtocolError, "malformed Server-Sent Events stream"),
        (_event([3, 500]), ServerProtocolError, "outside the vocabulary"),
        ('data: {"object": "error", "message": "KV cache"}', StreamInterruptedError, "KV cache"),
    ],
    ids=["json", "sse", "vocabulary", "error-frame"],
)
async def test_an_error_comes_after_the_deltas_before_it(
    bad: str, error: type[ModelServerError], message: str
) -> None:
    body = "\n".join([_event([1, 2]), "", _event([3]), "", bad, "", _event([4], "stop"), ""])
    chunks = [body.encode()]
    iterated = await _iterated(chunks)
    assert isinstance(iterated, error) and message in str(iterated)
    batches, batched = await _batched(chunks)
    assert [[d.token_ids for d in batch] for batch in batches] == [[(1, 2), (3,)]]
    assert type(batched) is type(iterated) and str(batched) == str(iterated)
    assert batched.token_ids == iterated.token_ids == (1, 2, 3)


@pytest.mark.parametrize(
    ("content", "outcome"),
    [
        ([{"token_id": 5, "logprob": -1}, {"token_id": 6, "logprob": -0.5}], (-1.0, -0.5)),
        ([{"logprob": 0}, {"logprob": -2.5}], (0.0, -2.5)),
        ([{"token_id": 5, "logprob": -1}, {"logprob": -2}], (-1.0, -2.0)),
        ([{"token_id": 5.0, "logprob": -1}, {"token_id": 6, "logprob": -1}], (-1.0, -1.0)),
        (
            [{"token_id": 5, "logprob": -1}, {"token_id": 7, "logprob": -1}],
            "entry 1 is for token 7",
        ),
        ([{"token_id": 5, "logprob": True}, {"logprob": -1}], "must be a number, got True"),
        ([{"token_id": 5, "logprob": "-1"}, {"logprob": -1}], "must be a number, got '-1'"),
        ([{"token_id": 5}, {"logprob": -1}], "must be a number, got None"),
        ([[5, -1.0], {"logprob": -1}], "entries must be objects"),
        ([{"logprob": -1}], "2 token ids but 1 logprobs"),
        ([{"logprob": -1}, {"logprob": math.nan}], "logprob nan of token 6 at position 1"),
        ([{"logprob": -math.inf}, {"logprob": -1}], "logprob -inf of token 5 at position 0"),
        ([{"logprob": -1}, {"logprob": 1e-3}], "logprob 0.001 of token 6 at position 1"),
        ([{"logprob": -1e308}, {"logprob": -1e308}], (-1e308, -1e308)),
    ],
)
def test_vllm_chunk_checks(content: list[object], outcome: tuple[float, ...] | str) -> None:
    payload = {"choices": [{"token_ids": [5, 6], "logprobs": {"content": content}}]}
    if isinstance(outcome, str):
        with pytest.raises(ChunkError, match=outcome):
            VLLMDecoder(vocab_size=10).feed(payload)
        return
    chunk = VLLMDecoder(vocab_size=10).feed(payload)
    assert chunk is not None and chunk.token_ids == (5, 6) and chunk.logprobs == outcome
    assert all(type(lp) is float for lp in chunk.logprobs)


@pytest.mark.parametrize(
    ("ids", "message"),
    [([5, True], "must be a list of integers"), ([5, 10], "token id 10 at position 1")],
)
def test_vllm_chunk_ids_are_checked(ids: list[object], message: str) -> None:
    content = [{"logprob": -1}, {"logprob": -1}]
    payload = {"choices": [{"token_ids": ids, "logprobs": {"content": content}}]}
    with pytest.raises(ChunkError, match=message):
        VLLMDecoder(vocab_size=10).feed(payload)


async def test_a_one_line_event_over_the_event_bound_is_refused_in_a_batch() -> None:
    body = "\n".join([_event([3]), "", _event([1, 2]), "", _event([4], "stop"), ""]).encode()
    context = BodyContext("POST http://m/generate", 1, anyio.current_time() + 60, 30.0, 2**20)
    reader = LineReader(ChunkedResponse([body]), context, max_line_bytes=2**20)
    # The first event fits; the second is one byte over the bound (its "data: " line counts).
    bound = len(_event([3]))
    assert len(_event([1, 2])) > bound
    stream = TokenStream(
        SSEJSONReader(reader, max_event_bytes=bound),
        VLLMDecoder(),
        "POST http://m/generate",
        max_tokens=64,
    )
    batch = await stream.next_batch()
    assert batch is not None and [d.token_ids for d in batch] == [(3,)]
    with pytest.raises(ServerProtocolError, match=r"HTTPOptions\.max_event_bytes=") as caught:
        await stream.next_batch()
    assert caught.value.token_ids == (3,)


async def test_done_with_spaces_ends_a_batch() -> None:
    body = "\n".join([_event([1]), "", _event([2], "stop"), "", "data:  [DONE] ", "", ""])
    stream, response = _stream([body.encode()])
    batches = []
    while (batch := await stream.next_batch()) is not None:
        batches.append([d.token_ids for d in batch])
    assert batches == [[(1,), (2,)]] and response.body_received


async def _joined(
    chunks: list[bytes], limit: int
) -> tuple[list[list[TokenDelta]], ModelServerError | None]:
    stream, _ = _stream(chunks)
    batches: list[list[TokenDelta]] = []
    try:
        while (batch := await stream.next_joined(limit)) is not None:
            batches.append(batch)
    except ModelServerError as exc:
        return batches, exc
    return batches, None


async def test_joined_batches_hold_the_batched_ids_in_one_delta_however_the_body_is_cut() -> None:
    rng = random.Random(5)
    for max_piece in (2, 7, 40, 200, len(BODY)):
        for _ in range(5):
            chunks = cut(BODY, rng, max_piece)
            batches, _ = await _batched(chunks)
            joined, error = await _joined(chunks, 100)
            assert error is None
            assert [len(batch) for batch in joined] == [1] * len(batches)
            for batch, (one,) in zip(batches, joined, strict=True):
                assert one.token_ids == tuple(i for d in batch for i in d.token_ids)
                assert one.logprobs == tuple(lp for d in batch for lp in d.logprobs)
                assert one.finish_reason == batch[-1].finish_reason
    joined, _ = await _joined([BODY], 100)
    assert len(joined) == 1 and joined[0][0].token_ids == tuple(range(1, 11))


async def test_a_chunk_outside_the_limit_comes_alone_after_the_ones_before_it() -> None:
    body = "\n".join(
        [
            _event([1, 2]),
            "",
            _event([3]),
            "",
            _event([4, 60]),
            "",
            _event([5], "stop"),
            "",
            "data: [DONE]",
            "",
            "",
        ]
    )
    joined, error = await _joined([body.encode()], 50)
    assert error is None
    assert [[d.token_ids for d in batch] for batch in joined] == [[(1, 2, 3)], [(4, 60)], [(5,)]]
    # Its first delta too: nothing is joined to it.
    first, _ = await _joined([body.replace(_event([1, 2]), _event([1, 70])).encode()], 50)
    assert [[d.token_ids for d in batch] for batch in first] == [
        [(1, 70)],
        [(3,)],
        [(4, 60)],
        [(5,)],
    ]


async def test_a_joined_batch_comes_before_the_error_behind_it() -> None:
    body = "\n".join(
        [_event([1, 2]), "", _event([3]), "", "data: {not json", "", _event([4], "stop"), ""]
    )
    iterated = await _iterated([body.encode()])
    joined, error = await _joined([body.encode()], 100)
    assert [[d.token_ids for d in batch] for batch in joined] == [[(1, 2, 3)]]
    assert isinstance(error, ServerProtocolError) and str(error) == str(iterated)
    assert error.token_ids == (1, 2, 3)
