"""Multi-turn Phase 2 rollouts per model family against the scripted server, each with the
family's own tokenizer directory, chat template, end-of-turn tokens and parser.

Every rollout: two tool-call turns and a final answer. Asserted: the trajectory is exactly
what the server was prompted with and sampled (ids and logprobs), masks and logprobs aligned,
no end-of-turn token doubled, and the template check -- zero, or the named, documented break.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from hermes_async.agent import AgentOptions, AgentResult, HermesAgentLoop
from hermes_async.inference.families import FamilyTokenizer, load_family_tokenizer
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.tokenizer import load_tokenizer
from hermes_async.inference.trajectory import MASK_ID
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import FixedScript, ScriptedModelServer
from tests.agent.test_loop_phase2 import Recorder, registry

pytestmark = pytest.mark.anyio

ANSWER = "All recorded."


def hermes_call(tag: str, *, compact: bool = False) -> str:
    if compact:
        return '<tool_call>\n{"name":"record","arguments":{"tag":"' + tag + '"}}\n</tool_call>'
    return '<tool_call>\n{"name": "record", "arguments": {"tag": "' + tag + '"}}\n</tool_call>'


#: Per family: the scripted replies (two calls, one answer).
SCRIPTS: dict[str, list[str]] = {
    "hermes": ["Let me record.\n" + hermes_call("a"), hermes_call("b", compact=True), ANSWER],
    "qwen3": [
        "<think>\nI should record a.\n</think>\n\n" + hermes_call("a"),
        "<think>\nNow b.\n</think>\n\n" + hermes_call("b", compact=True),
        "<think>\nDone.\n</think>\n\n" + ANSWER,
    ],
    "qwen3-nothink": [hermes_call("a"), hermes_call("b", compact=True), ANSWER],
    "llama3": [
        '{"name": "record", "parameters": {"tag": "a"}}',
        '{"name":"record","parameters":{"tag":"b"}}',
        ANSWER,
    ],
    "mistral_v11": [
        '[TOOL_CALLS]record[ARGS]{"tag": "a"}',
        'Next one.[TOOL_CALLS]record[ARGS]{"tag":"b"}',
        ANSWER,
    ],
    "deepseek_v3": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>record\n```json\n"
        '{"tag": "a"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "Next.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>record\n```json\n"
        '{"tag":"b"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        ANSWER,
    ],
    "deepseek_v31": [
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>record<｜tool▁sep｜>{"tag": "a"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>record<｜tool▁sep｜>{"tag":"b"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ANSWER,
    ],
    # Thinking on: the generation prompt opens <think>; the model writes reasoning, </think>.
    "deepseek_v31-think": [
        "I should record a.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>record<｜tool▁sep｜>"
        '{"tag": "a"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "Now b.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>record<｜tool▁sep｜>"
        '{"tag":"b"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "Done.</think>" + ANSWER,
    ],
    # GLM ends a turn by writing the next role token: the server stops on it (a stop id).
    "glm45": [
        "\n<think>Record a.</think>\n<tool_call>record\n<arg_key>tag</arg_key>\n"
        "<arg_value>a</arg_value>\n</tool_call><|observation|>",
        "\n<think>Then b.</think>\nOne more.\n<tool_call>record\n<arg_key>tag</arg_key>\n"
        "<arg_value>b</arg_value>\n</tool_call><|observation|>",
        "\n<think>Done.</think>\n" + ANSWER + "<|user|>",
    ],
    "kimi_k2": [
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.record:0"
        '<|tool_call_argument_begin|>{"tag": "a"}<|tool_call_end|><|tool_calls_section_end|>',
        "Next.<|tool_calls_section_begin|><|tool_call_begin|>functions.record:1"
        '<|tool_call_argument_begin|>{"tag":"b"}<|tool_call_end|><|tool_calls_section_end|>',
        ANSWER,
    ],
}

#: family case -> (family, template variables)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "hermes": ("hermes", {}),
    "qwen3": ("qwen3", {}),
    "qwen3-nothink": ("qwen3", {"enable_thinking": False}),
    "qwen3-nothink-keep": ("qwen3", {"enable_thinking": False, "keep_history_thinking": True}),
    "llama3": ("llama3", {}),
    "mistral_v11": ("mistral_v11", {}),
    "deepseek_v3": ("deepseek_v3", {}),
    "deepseek_v31": ("deepseek_v31", {}),
    "deepseek_v31-think": ("deepseek_v31", {"enable_thinking": True}),
    "glm45": ("glm45", {}),
    "kimi_k2": ("kimi_k2", {}),
}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


_LOADED: dict[tuple[str, Path], FamilyTokenizer] = {}


def tokenizer_for(case: str, root: Path) -> FamilyTokenizer:
    # Built and loaded once per directory (blocking: outside the loop); keyed by the root too,
    # since other modules build their own (a test reads the directory itself).
    if (case, root) not in _LOADED:
        name, variables = CASES[case]
        _LOADED[case, root] = load_family_tokenizer(name, root / name, **variables)
    return _LOADED[case, root]


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest, family_dirs: Path) -> tuple[str, FamilyTokenizer]:
    name = str(request.param)
    return name, tokenizer_for(name, family_dirs)


@pytest.fixture
def qwen3(family_dirs: Path) -> FamilyTokenizer:
    return tokenizer_for("qwen3", family_dirs)  # loaded outside the event loop (blocking)


@pytest.fixture
def llama3(family_dirs: Path) -> FamilyTokenizer:
    return tokenizer_for("llama3", family_dirs)  # loaded outside the event loop (blocking)


async def rollout(
    tok: FamilyTokenizer,
    texts: Sequence[str],
    messages: list[dict[str, Any]] | None = None,
    **loop_kwargs: Any,
) -> tuple[AgentResult, ScriptedModelServer, Recorder]:
    rec = Recorder()
    server = ScriptedModelServer(FixedScript(texts), tokenizer=tok, max_chunk_tokens=3)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        reg = registry(rec)
        defs = reg.definitions(["terminal"])
        loop = HermesAgentLoop(
            client,
            defs.schemas,
            defs.valid_names,
            registry=reg,
            tokenizer=tok,
            options=AgentOptions(tool_call_parser=tok.parser, **loop_kwargs),
        )
        convo = messages or [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Record a, then b."},
        ]
        result = await loop.run(convo)
    return result, server, rec


def assert_exact(result: AgentResult, server: ScriptedModelServer, tok: FamilyTokenizer) -> None:
    state = result.managed_state or {}
    node = state["nodes"][0]
    tokens, masks, logprobs = node["tokens"], node["masked_tokens"], node["logprobs"]
    assert len(tokens) == len(masks) == len(logprobs)
    served = server.requests
    for i, req in enumerate(served):
        start = len(req.prompt_ids)
        end = start + len(req.completion_ids)
        assert tokens[:start] == req.prompt_ids
        assert tokens[start:end] == req.completion_ids == masks[start:end]
        assert logprobs[start:end] == pytest.approx(req.logprobs)
        if i + 1 < len(served):
            nxt = len(served[i + 1].prompt_ids)
            assert set(masks[end:nxt]) == {MASK_ID} and set(logprobs[end:nxt]) == {1.0}
    assert len(tokens) == len(served[-1].prompt_ids) + len(served[-1].completion_ids)
    trained = [t for t, m in zip(tokens, masks, strict=True) if m != MASK_ID]
    assert trained == [t for r in served for t in r.completion_ids]
    for eot in tok.end_of_turn_ids:
        assert all(tokens[i] != eot or tokens[i + 1] != eot for i in range(len(tokens) - 1))
    # Every completion ended on one of the family's end-of-turn tokens, sampled.
    assert all(r.completion_ids[-1] in tok.end_of_turn_ids for r in served)


def assert_rendering(result: AgentResult, tok: FamilyTokenizer, schemas: Any) -> None:
    decoded = tok.decode((result.managed_state or {})["nodes"][0]["tokens"])
    rendered = tok.apply_chat_template(result.messages, schemas, add_generation_prompt=False)
    if rendered.startswith(decoded):
        assert not rendered[len(decoded) :].strip()
    else:  # a stop token that opens the next message is not rendered after the last turn
        tail = decoded[len(rendered) :]
        assert decoded.startswith(rendered) and tail in {
            tok.decode([i]) for i in tok.end_of_turn_ids
        }, (decoded[-200:], rendered[-200:])


async def test_multi_turn_rollout_per_family(case: tuple[str, FamilyTokenizer]) -> None:
    name, tok = case
    texts = SCRIPTS.get(name) or SCRIPTS["qwen3-nothink"]
    result, server, rec = await rollout(tok, texts)
    assert result.finished_naturally and result.turns_used == 3, result.error
    assert [a["tag"] for a in rec.args] == ["a", "b"]
    assert not result.tool_errors
    assert_exact(result, server, tok)
    checks = [(c.turn, c.reason) for c in result.template_checks]
    if name == "qwen3-nothink":
        # The named break: the empty think block of each generation prompt is left out of
        # earlier turns by Qwen3's rule -- once per turn that is followed by another.
        assert checks == [(1, "history"), (2, "history")]
        assert result.template_mismatches == 2
        assert all(c.actual.startswith("<think>") for c in result.template_checks)
    elif name == "deepseek_v31-think":
        # The named break: V3.1 renders past turns non-thinking (``</think>`` + content), so
        # every generation prompt's ``<think>`` is rewritten once the turn is history -- the
        # final one included. The documented fix: keep enable_thinking=False.
        assert checks == [(1, "history"), (2, "history"), (3, "history")]
        assert result.template_mismatches == 3
        assert all(
            c.actual == "<think>" and c.expected.startswith("</think>")
            for c in result.template_checks
        )
    else:
        assert checks == [] and result.template_mismatches == 0
        reg = registry(Recorder())
        assert_rendering(result, tok, reg.definitions(["terminal"]).schemas)
    calls = [m["tool_calls"][0] for m in result.messages if m.get("tool_calls")]
    assert len(calls) == 2
    if name not in ("glm45",):  # XML arguments have no JSON text of their own
        assert calls[1]["function"]["arguments"] == '{"tag":"b"}'  # the model's words
    if name == "kimi_k2":
        assert [c["native_id"] for c in calls] == ["functions.record:0", "functions.record:1"]


@pytest.mark.parametrize("reasoning", [True, False], ids=["earlier-reasoning", "no-reasoning"])
async def test_qwen3_history_with_and_without_earlier_reasoning(
    qwen3: FamilyTokenizer, reasoning: bool
) -> None:
    tok = qwen3
    earlier: dict[str, Any] = {"role": "assistant", "content": "Earlier answer."}
    if reasoning:
        earlier["reasoning_content"] = "earlier thoughts"
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "First question."},
        earlier,
        {"role": "user", "content": "Record a, then b."},
    ]
    result, server, _rec = await rollout(tok, SCRIPTS["qwen3"], messages)
    assert result.finished_naturally
    assert_exact(result, server, tok)
    # Reasoning before the last user message is dropped from the prompt and from the final
    # rendering alike: consistent, no break.
    assert "earlier thoughts" not in tok.decode(server.requests[0].prompt_ids)
    assert result.template_checks == [] and result.template_mismatches == 0


def test_load_tokenizer_recognizes_a_family_directory(family_dirs: Path) -> None:
    tok = tokenizer_for("glm45", family_dirs)
    loaded = load_tokenizer(str(family_dirs / "glm45"))
    assert isinstance(loaded, FamilyTokenizer)
    assert loaded.end_of_turn_ids == tok.end_of_turn_ids
    specials = loaded.special_tokens
    assert [specials[t] for t in ("<|user|>", "<|observation|>", "<|endoftext|>")] == list(
        loaded.end_of_turn_ids
    )
    assert loaded.parser == "glm45" and loaded.family == "glm45"


async def test_the_end_of_turn_tokens_come_from_the_family_and_can_be_overridden(
    llama3: FamilyTokenizer,
) -> None:
    tok = llama3
    specials = tok.special_tokens
    eot, eom = specials["<|eot_id|>"], specials["<|eom_id|>"]
    assert tok.end_of_turn_ids == (eot, eom)
    _result, server, _rec = await rollout(tok, SCRIPTS["llama3"])
    assert {tuple(r.body["sampling_params"]["stop_token_ids"]) for r in server.requests} == {
        (eot, eom)
    }
    result, server, _rec = await rollout(tok, SCRIPTS["llama3"], end_of_turn=("<|eot_id|>",))
    assert {tuple(r.body["sampling_params"]["stop_token_ids"]) for r in server.requests} == {(eot,)}
    assert result.finished_naturally and result.template_mismatches == 0
    assert_exact(result, server, tok)


def test_an_end_of_turn_text_that_is_not_one_token_is_an_error(llama3: FamilyTokenizer) -> None:
    tok = llama3
    reg = registry(Recorder())
    defs = reg.definitions(["terminal"])
    client = VLLMGenerateClient("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="'end of turn' is not a single token"):
        HermesAgentLoop(
            client,
            defs.schemas,
            defs.valid_names,
            tokenizer=tok,
            registry=reg,
            options=AgentOptions(end_of_turn=("end of turn",)),
        )
