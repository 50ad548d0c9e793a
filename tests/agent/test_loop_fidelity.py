"""Phase 2 fidelity: request extras and precedence, the per-turn hook, the model's own words in
the messages, cut calls, segment boundaries and the once-per-divergence template check."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest

from hermes_async.agent import HermesAgentLoop, TemplateCheck
from hermes_async.inference.completions import VLLMCompletionsClient
from hermes_async.inference.generate import SamplingParams, SGLangGenerateClient
from hermes_async.inference.request_extras import UnsupportedExtraError
from hermes_async.jsontypes import JSONObject
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import FixedScript, ScriptedModelServer
from tests.agent.test_loop_phase2 import (
    TOKENIZER,
    Recorder,
    call_text,
    make_loop,
    registry,
    token_server,
)

pytestmark = pytest.mark.anyio

USER: list[dict[str, Any]] = [{"role": "user", "content": "go"}]


def sampling_of(server: ScriptedModelServer, n: int = 0) -> dict[str, Any]:
    params = server.requests[n].body["sampling_params"]
    assert isinstance(params, dict)
    return params


# ------------------------------------------------------------ precedence and request extras


async def test_an_explicit_sampling_temperature_beats_the_loops_default() -> None:
    async with token_server(["a", "b"]) as (server, client):
        await make_loop(client, Recorder(), sampling=SamplingParams(temperature=0.3)).run(
            list(USER)
        )
        explicit = make_loop(
            client, Recorder(), temperature=0.5, sampling=SamplingParams(temperature=0.3)
        )
        await explicit.run(list(USER))
    assert sampling_of(server, 0)["temperature"] == 0.3  # was sent as 1.0 before issue 22
    assert sampling_of(server, 1)["temperature"] == 0.5  # the loop's, given explicitly
    assert explicit.temperature == 0.5


async def test_extra_body_reaches_the_generate_endpoint_in_sampling_params() -> None:
    extra = {"structured_outputs": {"regex": "[a-z]+"}, "min_p": 0.05}
    async with token_server(["hi"]) as (server, client):
        loop = make_loop(client, Recorder(), extra_body=extra, sampling=SamplingParams(seed=1))
        await loop.run(list(USER))
    params = sampling_of(server)
    assert params["structured_outputs"] == {"regex": "[a-z]+"}
    assert params["min_p"] == 0.05 and params["seed"] == 1


def test_a_key_the_server_does_not_accept_fails_when_the_loop_is_built() -> None:
    rec = Recorder()
    client = SGLangGenerateClient("http://127.0.0.1:9")
    with pytest.raises(UnsupportedExtraError, match="'bogus' is not accepted by a 'sglang'"):
        make_loop(client, rec, extra_body={"bogus": 1})  # type: ignore[arg-type]
    with pytest.raises(UnsupportedExtraError, match=r"use SamplingParams\.max_tokens"):
        make_loop(client, rec, sampling=SamplingParams(extra={"max_new_tokens": 5}))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="give it in one place"):
        make_loop(
            client,  # type: ignore[arg-type]
            rec,
            extra_body={"min_p": 0.1},
            sampling=SamplingParams(extra={"min_p": 0.2}),
        )
    # A typed key in extra_body fills the typed field.
    loop = make_loop(client, rec, extra_body={"top_k": 20})  # type: ignore[arg-type]
    assert loop._turns._sampling.top_k == 20  # type: ignore[attr-defined]


async def test_sampling_hook_changes_one_turn_only() -> None:
    seen: list[tuple[int, int]] = []

    def hook(turn: int, messages: Sequence[JSONObject], params: SamplingParams) -> Any:
        seen.append((turn, len(messages)))
        if turn == 2:
            return dataclasses.replace(params, extra={"structured_outputs": {"regex": "ok"}})
        return None

    texts = [call_text("record", {"tag": "1"}), call_text("record", {"tag": "2"}), "ok"]
    async with token_server(texts) as (server, client):
        result = await make_loop(client, Recorder(), sampling_hook=hook).run(list(USER), seed=9)
    assert result.finished_naturally
    assert seen == [(1, 1), (2, 3), (3, 5)]
    assert "structured_outputs" not in sampling_of(server, 0)
    assert sampling_of(server, 1)["structured_outputs"] == {"regex": "ok"}
    assert "structured_outputs" not in sampling_of(server, 2)
    # The hook's parameters keep the loop's stop ids and the run's seed.
    assert sampling_of(server, 1)["stop_token_ids"] == [TOKENIZER.eos_token_id]
    assert {sampling_of(server, n)["seed"] for n in range(3)} == {9}


async def test_a_hook_returning_a_bad_key_is_an_error() -> None:
    def hook(turn: int, messages: Sequence[JSONObject], params: SamplingParams) -> Any:
        return dataclasses.replace(params, extra={"nope": 1})

    async with token_server(["x"]) as (_server, client):
        with pytest.raises(UnsupportedExtraError, match="'nope'"):
            await make_loop(client, Recorder(), sampling_hook=hook).run(list(USER))


# ------------------------------------------------------------------ the model's own words


def _decoded(result: Any) -> str:
    return TOKENIZER.decode(result.managed_state["nodes"][0]["tokens"])


async def test_compact_json_calls_keep_the_models_text_and_match_the_template() -> None:
    compact = '<tool_call>\n{"name":"record","arguments":{"tag":"compact"}}\n</tool_call>'
    spaced = '<tool_call>\n{ "name" : "record" ,"arguments":  {"tag" :"two",  "seconds":0} }\n</tool_call>'
    rec = Recorder()
    async with token_server([compact, spaced, "done"]) as (_server, client):
        loop = make_loop(client, rec)
        result = await loop.run(list(USER))
    assert result.finished_naturally and result.template_mismatches == 0, result.template_checks
    assert result.template_checks == []
    calls = [m["tool_calls"][0] for m in result.messages if m.get("tool_calls")]
    assert calls[0]["function"]["arguments"] == '{"tag":"compact"}'  # as written
    assert calls[1]["function"]["arguments"] == '{"tag" :"two",  "seconds":0}'
    assert calls[0]["raw"] == '{"name":"record","arguments":{"tag":"compact"}}'
    assert rec.args == [{"tag": "compact"}, {"tag": "two", "seconds": 0}]  # parsed, validated
    rendered = TOKENIZER.apply_chat_template(
        result.messages, loop.tool_schemas, add_generation_prompt=False
    )
    assert rendered.rstrip() == _decoded(result)


async def test_a_call_cut_by_max_tokens_is_content_plus_a_model_visible_error() -> None:
    cut = "Let me look.\n" + call_text("record", {"tag": "x" * 200})
    rec = Recorder()
    async with token_server([cut, "fine"]) as (server, client):
        loop = make_loop(client, rec, max_tokens=20)
        result = await loop.run(list(USER))
    assert rec.args == []
    first_completion = TOKENIZER.decode(server.requests[0].completion_ids)
    assistant, error = result.messages[1], result.messages[2]
    assert "tool_calls" not in assistant
    assert assistant["content"] == first_completion  # the text produced, markers and all
    assert error["role"] == "user" and "cut off" in error["content"]
    assert [e.error for e in result.tool_errors] == [error["content"]]
    assert result.finished_naturally and result.turns_used == 2
    assert result.template_mismatches == 0 and result.template_checks == []
    node = result.managed_state["nodes"][0] if result.managed_state else {}
    # The <|im_end|> the model never sampled is a masked suffix token, once.
    eos = TOKENIZER.eos_token_id
    tokens = node["tokens"]
    assert all(tokens[i] != eos or tokens[i + 1] != eos for i in range(len(tokens) - 1))


async def test_a_final_answer_cut_by_length_is_recorded_but_not_counted() -> None:
    async with token_server(["word " * 50]) as (_server, client):
        result = await make_loop(client, Recorder(), max_tokens=10).run(list(USER))
    assert result.template_mismatches == 0
    assert [c.reason for c in result.template_checks] == ["length"]
    check = result.template_checks[0]
    assert not check.counted and check.turn == 1 and check.expected.startswith("<|im_end|>")


async def test_a_divergence_is_counted_once_at_the_turn_where_it_appears() -> None:
    # No newline between the content and the call: the message cannot say so (the template
    # puts one there), so turn 1 diverges -- and only turn 1, however many turns follow.
    texts = [
        "Let me record." + call_text("record", {"tag": "a"}),
        call_text("record", {"tag": "b"}),
        "done",
    ]
    async with token_server(texts) as (_server, client):
        result = await make_loop(client, Recorder()).run(list(USER))
    assert result.finished_naturally
    assert result.template_mismatches == 1
    (check,) = result.template_checks
    assert isinstance(check, TemplateCheck)
    assert (check.turn, check.reason, check.counted) == (1, "completion", True)
    assert check.expected.startswith("\n<tool_call>") and check.actual.startswith("<tool_call>")


async def test_segment_boundaries_are_the_served_prompts_and_completions() -> None:
    texts = [call_text("record", {"tag": "a"}), "done"]
    async with token_server(texts) as (server, client):
        result = await make_loop(client, Recorder()).run(list(USER))
    state = result.managed_state or {}
    segments = state["segments"]
    assert [(s["kind"], s["turn"]) for s in segments] == [
        ("prompt", 0),
        ("completion", 1),
        ("suffix", 1),
        ("completion", 2),
    ]
    tokens = state["nodes"][0]["tokens"]
    first, second = server.requests
    assert tokens[: segments[0]["end"]] == first.prompt_ids
    assert tokens[segments[1]["start"] : segments[1]["end"]] == first.completion_ids
    assert tokens[: segments[2]["end"]] == second.prompt_ids
    assert tokens[segments[3]["start"] : segments[3]["end"]] == second.completion_ids
    assert segments[-1]["end"] == len(tokens)


# --------------------------------------------------------------------- stock completions


async def test_a_multi_turn_rollout_over_the_stock_completions_route() -> None:
    texts = [call_text("record", {"tag": "a"}), "done"]
    rec = Recorder()
    server = ScriptedModelServer(
        FixedScript(texts), tokenizer=TOKENIZER, scale_out=False, max_chunk_tokens=3
    )
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMCompletionsClient(base_url, transport=transport, model="scripted") as client,
    ):
        reg = registry(rec)
        defs = reg.definitions(["terminal", "todo"])
        loop = HermesAgentLoop(
            client,
            defs.schemas,
            defs.valid_names,
            registry=reg,
            tokenizer=TOKENIZER,
            extra_body={"structured_outputs": {"regex": ".*"}},
        )
        result = await loop.run(list(USER))
    assert result.finished_naturally and result.template_mismatches == 0
    assert {r.protocol for r in server.requests} == {"completions"}
    body = server.requests[0].body
    assert body["structured_outputs"] == {"regex": ".*"} and body["model"] == "scripted"
    assert body["return_token_ids"] is True and body["prompt"] == server.requests[0].prompt_ids
    node = result.managed_state["nodes"][0] if result.managed_state else {}
    trained = [t for t, m in zip(node["tokens"], node["masked_tokens"], strict=True) if m != -100]
    assert trained == [t for r in server.requests for t in r.completion_ids]
    lps = [lp for lp, m in zip(node["logprobs"], node["masked_tokens"], strict=True) if m != -100]
    assert lps == pytest.approx([lp for r in server.requests for lp in r.logprobs])
    assert json.loads(result.messages[-2]["content"]) == {"ok": True, "tag": "a"}
