"""The stock-vLLM completions client, the generate-route probe, and the request-extras table."""

from __future__ import annotations

import pytest

from hermes_async.inference import ServerProtocolError
from hermes_async.inference._token_chunks import ChunkError
from hermes_async.inference.completions import (
    CompletionsDecoder,
    VLLMCompletionsClient,
    detect_token_endpoint,
)
from hermes_async.inference.generate import (
    AtroposGenerateClient,
    SamplingParams,
    VLLMGenerateClient,
)
from hermes_async.inference.request_extras import (
    UnsupportedExtraError,
    accepted_extras,
    split_extras,
)
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import FixedScript, ScriptedModelServer
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio

PROMPT = TOKENIZER.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def chunk(ids: list[int] | None, lps: list[float], tokens: list[str], finish: str | None = None):
    choice: dict[str, object] = {
        "index": 0,
        "text": "x",
        "logprobs": {"tokens": tokens, "token_logprobs": lps},
        "finish_reason": finish,
    }
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice]}


def test_decoder_reads_ids_checks_them_against_the_logprob_tokens() -> None:
    decoder = CompletionsDecoder()
    got = decoder.feed(chunk([5, 6], [-0.1, -0.2], ["token_id:5", "token_id:6"]))
    assert got is not None and got.token_ids == (5, 6) and got.logprobs == (-0.1, -0.2)
    # An older server without token_ids: the ids come from "token_id:N" tokens.
    got = decoder.feed(chunk(None, [-0.3], ["token_id:7"], "stop"))
    assert got is not None and got.token_ids == (7,) and got.finish_reason == "stop"
    assert decoder.feed({"choices": [], "usage": {}}) is None
    with pytest.raises(ChunkError, match="logprob entry 0 is for token 9"):
        decoder.feed(chunk([5], [-0.1], ["token_id:9"]))
    with pytest.raises(ChunkError, match="1 token ids but 2 logprobs"):
        decoder.feed(chunk([5], [-0.1, -0.2], ["token_id:5", "token_id:6"]))
    with pytest.raises(ChunkError, match=r"return_token_ids \(vLLM >= 0.10.2\)"):
        decoder.feed(chunk(None, [-0.1], ["hello"]))


def test_request_body_asks_for_ids_and_logprobs_and_puts_extras_at_the_top() -> None:
    client = VLLMCompletionsClient("http://h/v1", model="tiny")
    assert client.endpoint == "POST http://h/v1/completions"
    params = SamplingParams(
        max_tokens=7, seed=2, stop_token_ids=(1,), extra={"guided_regex": "a+", "min_p": 0.1}
    )
    body = client.request_body([3, 4], params)
    assert body["prompt"] == [3, 4] and body["model"] == "tiny" and body["max_tokens"] == 7
    assert body["logprobs"] == 0 and body["return_token_ids"] is True and body["stream"] is True
    assert body["structured_outputs"] == {"regex": "a+"} and body["min_p"] == 0.1
    assert body["stop_token_ids"] == [1] and body["seed"] == 2


def test_extras_are_checked_and_translated_per_server_kind() -> None:
    extra = {"structured_outputs": {"json": {"type": "object"}}, "min_tokens": 2, "rid": "r"}
    sampling, top = split_extras("sglang", extra)
    assert sampling == {"json_schema": '{"type": "object"}', "min_new_tokens": 2}
    assert top == {"rid": "r"}
    sampling, top = split_extras("vllm", {"structured_outputs": {"regex": "x"}, "priority": 1})
    assert sampling == {"structured_outputs": {"regex": "x"}} and top == {"priority": 1}
    choice, _ = split_extras("sglang", {"guided_choice": ["a.b", "c"]})
    assert choice == {"regex": r"(a\.b|c)"}
    with pytest.raises(
        UnsupportedExtraError, match="'structured_outputs' is not accepted by a 'atropos'"
    ):
        split_extras("atropos", {"structured_outputs": {"regex": "x"}})
    with pytest.raises(UnsupportedExtraError, match=r"use SamplingParams\.seed") as info:
        split_extras("completions", {"seed": 1})
    assert info.value.key == "seed" and info.value.kind == "completions"
    assert "min_p" in accepted_extras("completions")


@pytest.mark.parametrize("scale_out", [True, False])
async def test_probe_finds_the_generate_route_or_falls_back_to_completions(
    scale_out: bool,
) -> None:
    server = ScriptedModelServer(FixedScript(["hi"]), tokenizer=TOKENIZER, scale_out=scale_out)
    async with open_app_endpoint(server, loopback=False) as (base_url, transport):
        kind = await detect_token_endpoint(base_url + "/v1", transport=transport)
    assert kind == ("vllm" if scale_out else "completions")
    assert all(not r.completion_ids for r in server.requests)  # the probe generated nothing


async def test_completions_client_streams_exactly_what_the_server_sent() -> None:
    server = ScriptedModelServer(
        FixedScript(["Hello, wörld 🎉"]), tokenizer=TOKENIZER, scale_out=False, max_chunk_tokens=2
    )
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMCompletionsClient(base_url, transport=transport) as client,
    ):
        completion = await client.generate(
            PROMPT, SamplingParams(stop_token_ids=(TOKENIZER.eos_token_id,))
        )
    served = server.requests[0]
    assert list(completion.token_ids) == served.completion_ids
    assert list(completion.logprobs) == pytest.approx(served.logprobs)
    assert completion.token_ids[-1] == TOKENIZER.eos_token_id and completion.finish_reason == "stop"
    assert completion.chunks == len(served.chunks) > 1


async def test_completions_client_rejects_a_server_that_returns_no_ids() -> None:
    class NoIds(ScriptedModelServer):
        pass

    server = NoIds(FixedScript(["hi"]), tokenizer=TOKENIZER)
    # A server that ignores return_token_ids and return_tokens_as_token_ids (a chat server's
    # completions imitation): text and logprobs, no ids.
    async with (
        open_app_endpoint(_strip_ids(server), loopback=False) as (base_url, transport),
        VLLMCompletionsClient(base_url, transport=transport) as client,
    ):
        with pytest.raises(ServerProtocolError, match="no token ids"):
            await client.generate(PROMPT)


def _strip_ids(app: ScriptedModelServer):  # an ASGI wrapper rewriting the SSE frames
    import json

    async def wrapped(scope, receive, send):  # type: ignore[no-untyped-def]
        async def rewrite(message):  # type: ignore[no-untyped-def]
            body = message.get("body", b"")
            if message["type"] == "http.response.body" and body.startswith(b"data: {"):
                data = json.loads(body[len(b"data: ") :])
                for choice in data.get("choices", []):
                    choice.pop("token_ids", None)
                    if choice.get("logprobs"):
                        choice["logprobs"]["tokens"] = ["t"] * len(choice["logprobs"]["tokens"])
                message = {**message, "body": b"data: " + json.dumps(data).encode() + b"\n\n"}
            await send(message)

        await app(scope, receive, rewrite)

    return wrapped


def test_the_flat_bodies_carry_the_same_sampling_fields_as_the_generate_route() -> None:
    params = SamplingParams(
        max_tokens=5, temperature=0.3, top_p=0.8, top_k=20, stop=("</x>",), stop_token_ids=(9,)
    )
    nested = VLLMGenerateClient("http://h").request_body([1], params)["sampling_params"]
    expected = {k: nested[k] for k in ("temperature", "top_p", "top_k", "stop", "stop_token_ids")}
    assert expected == {
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 20,
        "stop": ["</x>"],
        "stop_token_ids": [9],
    }
    for client in (VLLMCompletionsClient("http://h/v1"), AtroposGenerateClient("http://h")):
        body = client.request_body([1], params)
        assert {k: body[k] for k in expected} == expected, type(client).__name__
