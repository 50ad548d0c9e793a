"""VLLMDecoder's inline path for the usual chunk: the same answer as the general path, on the
usual chunk and on every variation of it that the general path accepts, refuses or converts."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from hermes_async.inference._token_chunks import (
    TOKEN_ID_LIMIT,
    ChunkError,
    TokenChunk,
    VLLMDecoder,
)
from hermes_async.testing.scripted_server import _vllm_chunk


def _chunk(ids: list[int], logprobs: list[Any], finish: Any = None) -> dict[str, Any]:
    # The chunk the scripted server sends, as vLLM does.
    return _vllm_chunk(1, ids, logprobs, finish)


def _answer(feed: Callable[[Any], TokenChunk | None], payload: Any) -> object:
    try:
        chunk = feed(payload)
    except ChunkError as exc:
        return ("error", str(exc), exc.server_error, exc.invalid_tokens)
    if chunk is None:
        return None
    # Types too: a logprob given as an int is a float in the chunk, on both paths.
    return (chunk, [type(v) for v in chunk.logprobs], [type(v) for v in chunk.token_ids])


def _choice(payload: dict[str, Any]) -> dict[str, Any]:
    choice: dict[str, Any] = payload["choices"][0]
    return choice


def _set(path: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Any:
    def change(payload: dict[str, Any]) -> None:
        path(payload)[key] = value

    return change


def _entry(index: int, key: str, value: Any) -> Any:
    def change(payload: dict[str, Any]) -> None:
        _choice(payload)["logprobs"]["content"][index][key] = value

    return change


def _id(value: Any) -> Any:
    """The first id set to ``value``, in ``token_ids`` and in its logprob entry."""

    def change(payload: dict[str, Any]) -> None:
        _choice(payload)["token_ids"][0] = value
        _choice(payload)["logprobs"]["content"][0]["token_id"] = value

    return change


def _drop_entry_key(key: str) -> Any:
    def change(payload: dict[str, Any]) -> None:
        for entry in _choice(payload)["logprobs"]["content"]:
            del entry[key]

    return change


VARIATIONS: dict[str, Any] = {
    "as sent": lambda p: None,
    "finish stop": _set(_choice, "finish_reason", "stop"),
    "finish as an object": _set(_choice, "finish_reason", {"type": "stop"}),
    "finish a number": _set(_choice, "finish_reason", 3),
    "error frame": _set(lambda p: p, "error", {"message": "boom"}),
    "error object": _set(lambda p: p, "object", "error"),
    "null error": _set(lambda p: p, "error", None),
    "no choices": _set(lambda p: p, "choices", []),
    "choices not a list": _set(lambda p: p, "choices", {"0": {}}),
    "choice not an object": _set(lambda p: p, "choices", [1]),
    "ids missing": lambda p: _choice(p).pop("token_ids"),
    "ids empty, finish": lambda p: _choice(p).update(
        token_ids=[], logprobs={"content": []}, finish_reason="length"
    ),
    "ids empty, no finish": lambda p: _choice(p).update(token_ids=[], logprobs={"content": []}),
    "an id a bool": _id(True),
    "an id a float": _id(5.0),
    "an id negative": _id(-1),
    "an id past the limit": _id(TOKEN_ID_LIMIT),
    "an id past the vocabulary": _id(1000),
    "more ids than logprobs": lambda p: _choice(p)["token_ids"].append(7),
    "logprobs null": _set(_choice, "logprobs", None),
    "logprobs content null": lambda p: _choice(p)["logprobs"].update(content=None),
    "logprobs content not a list": lambda p: _choice(p)["logprobs"].update(content={}),
    "an entry not an object": lambda p: _choice(p)["logprobs"]["content"].__setitem__(0, 1),
    "an entry's id differs": _entry(0, "token_id", 99),
    "an id differs from its entry's": lambda p: _choice(p)["token_ids"].__setitem__(0, 2),
    "entries without ids": _drop_entry_key("token_id"),
    "an entry without a logprob": lambda p: _choice(p)["logprobs"]["content"][0].pop("logprob"),
    "a logprob an int": _entry(0, "logprob", 0),
    "a logprob a bool": _entry(0, "logprob", False),
    "a logprob a string": _entry(0, "logprob", "-1"),
    "a logprob positive": _entry(0, "logprob", 0.5),
    "a logprob NaN": _entry(0, "logprob", math.nan),
    "a logprob -inf": _entry(0, "logprob", -math.inf),
    "logprobs summing past float range": lambda p: [
        e.update(logprob=-1.7e308) for e in _choice(p)["logprobs"]["content"]
    ],
    "payload a list": lambda p: [],
}


@pytest.mark.parametrize("vocab_size", [None, 500, 2**40])
@pytest.mark.parametrize("name", list(VARIATIONS))
def test_the_inline_path_answers_as_the_general_path(name: str, vocab_size: int | None) -> None:
    base = _chunk([3, 1, 4], [-0.5, -1.25, 0.0])
    payload: Any = copy.deepcopy(base)
    changed = VARIATIONS[name](payload)
    if isinstance(changed, list) and name == "payload a list":
        payload = changed
    decoder = VLLMDecoder(vocab_size=vocab_size)
    assert _answer(decoder.feed, payload) == _answer(decoder._feed_checked, payload)


def test_the_inline_path_on_random_chunks() -> None:
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(1, 6)
        ids = [
            rng.choice([0, 1, 2, 499, 500, TOKEN_ID_LIMIT - 1, TOKEN_ID_LIMIT, -1])
            for _ in range(n)
        ]
        lps: list[Any] = [
            rng.choice([-0.1, 0.0, 1e-7, 1e-5, -math.inf, math.nan, -3, True]) for _ in range(n)
        ]
        payload = _chunk(ids, lps, rng.choice([None, "stop", "length", 1]))
        for vocab_size in (None, 500):
            decoder = VLLMDecoder(vocab_size=vocab_size)
            assert _answer(decoder.feed, payload) == _answer(decoder._feed_checked, payload)


def test_the_usual_chunk_is_decoded() -> None:
    chunk = VLLMDecoder(vocab_size=10).feed(_chunk([3, 1], [-0.5, -1.0], "stop"))
    assert chunk == TokenChunk((3, 1), (-0.5, -1.0), "stop")
