"""Incremental chat-template rendering equals the full rendering, for every template we ship.

Randomized conversations grow the way a rollout's do (an assistant turn, its tool results, a
``user`` notice now and then, the final answer), with tool calls (``raw``, ``native_id``, string
and object arguments), reasoning, ``<think>`` in content, content-part lists and system
prompts. After every growth step the renderer's text must be exactly the full rendering, with the
project's Jinja environment and with transformers' (a plain ``HFTokenizer`` with the same source).
Also here: the family tokenizers' own rendering (the project's environment) is transformers' text,
and the built-in template in Python is the Jinja template's text.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from hermes_async.inference._chat_template import default_chat_template
from hermes_async.inference.families import FAMILIES
from hermes_async.inference.rendering import (
    ChatRenderer,
    RendererStatistics,
    window_rule,
    windowed_templates,
)
from hermes_async.inference.tokenizer import QwenTokenizer, Tokenizer
from hermes_async.jsontypes import JSONObject
from tests.envs.test_dropin_fixes import SWITCH_TEMPLATE

#: Templates the project ships, with the variable settings the tests and docs use.
SHIPPED: list[tuple[str, dict[str, Any]]] = [
    ("hermes", {}),
    ("qwen3", {}),
    ("qwen3", {"enable_thinking": False}),
    ("qwen3", {"enable_thinking": False, "keep_history_thinking": True}),
    ("llama3", {}),
    ("mistral_v11", {}),
    ("deepseek_v3", {}),
    ("deepseek_v31", {}),
    ("deepseek_v31", {"enable_thinking": True}),
    ("glm45", {}),
    ("glm45", {"enable_thinking": False}),
    ("kimi_k2", {}),
]
#: Settings whose template re-renders history at every turn: always a full rendering.
NEVER_EXTENDS = {("deepseek_v31", "enable_thinking=True")}
#: Other templates of the test suite (no window rule: rendered in full every time).
OTHERS = {
    "switch": SWITCH_TEMPLATE,
    "custom": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}",
}

TOOLS: list[JSONObject] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["command"],
            },
        },
    }
    for name in ("terminal", "read_file", "todo")
]

_WORDS = ["ls", "Done.", "héllo", "日本", "<b>", "{}", '"q"', "\\n", "  ", "\n", "x" * 30, "ok"]


def _text(rng: random.Random, *, empty: float = 0.2) -> str:
    if rng.random() < empty:
        return ""
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))


def _content(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.2:
        return [{"type": "text", "text": _text(rng)}, {"type": "image_url"}]
    if roll < 0.3:
        return "<think>\n" + _text(rng) + "\n</think>\n\n" + _text(rng)
    return _text(rng)


def _call(rng: random.Random, index: int) -> JSONObject:
    arguments: dict[str, Any] = {"command": _text(rng, empty=0), "n": rng.randint(0, 9)}
    name = rng.choice(["terminal", "read_file", "todo"])
    text = json.dumps(arguments, separators=(",", ":") if rng.random() < 0.5 else None)
    call: JSONObject = {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": text if rng.random() < 0.8 else arguments},
    }
    if rng.random() < 0.5:
        call["raw"] = json.dumps({"name": name, "arguments": arguments})
    if rng.random() < 0.8:
        call["native_id"] = f"functions.{name}:{index}"
    return call


def conversation_steps(seed: int) -> list[tuple[list[JSONObject], bool]]:
    """The growth steps of one random conversation: (messages so far, generation prompt)."""
    rng = random.Random(seed)
    messages: list[JSONObject] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": _text(rng, empty=0.1)})
    messages.append({"role": "user", "content": _content(rng)})
    if rng.random() < 0.2:  # a few-shot history before the task
        messages += [
            {"role": "assistant", "content": _text(rng, empty=0)},
            {"role": "user", "content": _text(rng, empty=0)},
        ]
    steps = [(list(messages), True)]
    calls = 0
    for _ in range(rng.randint(1, 12)):
        n = rng.choice([0, 1, 1, 1, 2, 3])
        assistant: JSONObject = {"role": "assistant", "content": _content(rng)}
        if rng.random() < 0.4:
            assistant["reasoning_content"] = "\n" + _text(rng, empty=0) + "\n"
        if n:
            assistant["tool_calls"] = [_call(rng, calls + i) for i in range(n)]
        messages.append(assistant)
        for i in range(n):
            messages.append(
                {"role": "tool", "tool_call_id": f"call_{calls + i}", "content": _content(rng)}
            )
        calls += n
        if n == 0 or rng.random() < 0.15:  # a cut call's notice, or the user speaking again
            messages.append({"role": "user", "content": _text(rng, empty=0)})
        steps.append((list(messages), True))
    messages.append({"role": "assistant", "content": _content(rng)})
    steps.append((list(messages), False))
    return steps


def check_incremental_equals_full(tokenizer: Tokenizer, seeds: range) -> tuple[int, int]:
    """Every growth step: the renderer's text is the full rendering; returns (windowed, full)."""
    windowed = full = 0
    for seed in seeds:
        for tools in (TOOLS, None):
            renderer = ChatRenderer(tokenizer, tools)
            for messages, generation in conversation_steps(seed):
                expected = tokenizer.apply_chat_template(
                    messages, tools, add_generation_prompt=generation
                )
                got = renderer.render(messages, add_generation_prompt=generation)
                assert got == expected, (seed, len(messages), generation)
            stats = renderer.statistics()
            windowed += stats.windowed
            full += stats.full
    return windowed, full


def _source(name: str) -> str:
    return FAMILIES[name].chat_template()


def _hf_family(name: str, variables: dict[str, Any]) -> Tokenizer:
    """A transformers tokenizer with the family's template (a tiny vocabulary: only the
    template matters here), wrapped as the family tokenizer the loop uses."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer as Backend, models
    from transformers import PreTrainedTokenizerFast

    from hermes_async.inference.families import FamilyTokenizer

    backend = Backend(models.WordLevel({"<unk>": 0, "</s>": 1}, unk_token="<unk>"))
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    hf.chat_template = _source(name)
    fam = FAMILIES[name]
    return FamilyTokenizer(
        hf,
        name=name,
        end_of_turn_ids=[1],
        variables={**fam.variables, **variables},
        arguments_as_objects=fam.arguments_as_objects,
        family=name,
        parser=fam.parser,
    )


def _ids(case: tuple[str, dict[str, Any]]) -> str:
    name, variables = case
    return "-".join([name, *(f"{k}={v}" for k, v in variables.items())])


@pytest.mark.parametrize("case", SHIPPED, ids=[_ids(c) for c in SHIPPED])
def test_incremental_equals_full_builtin_environment(case: tuple[str, dict[str, Any]]) -> None:
    name, variables = case
    tokenizer: Tokenizer = QwenTokenizer(chat_template=_source(name))
    if variables:
        from hermes_async.agent._reasoning import TemplateKwargsTokenizer

        tokenizer = TemplateKwargsTokenizer(tokenizer, variables)
    assert window_rule(tokenizer) is not None
    windowed, _ = check_incremental_equals_full(tokenizer, range(25))
    assert (windowed == 0) == (tuple(_ids(case).split("-", 1)) in NEVER_EXTENDS)


@pytest.mark.parametrize("case", SHIPPED, ids=[_ids(c) for c in SHIPPED])
def test_incremental_equals_full_transformers(case: tuple[str, dict[str, Any]]) -> None:
    # A plain HF tokenizer: transformers renders every window and every full conversation.
    from hermes_async.agent._reasoning import TemplateKwargsTokenizer
    from hermes_async.inference.hf import HFTokenizer

    name, variables = case
    family = _hf_family(name, variables)
    hf = HFTokenizer(family.hf_tokenizer, eos_token_id=1)  # type: ignore[attr-defined]
    merged = {**FAMILIES[name].variables, **variables}
    tokenizer: Tokenizer = TemplateKwargsTokenizer(hf, merged) if merged else hf
    assert window_rule(tokenizer) is not None
    windowed, _ = check_incremental_equals_full(tokenizer, range(25))
    assert (windowed == 0) == (tuple(_ids(case).split("-", 1)) in NEVER_EXTENDS)


@pytest.mark.parametrize("name", list(OTHERS))
def test_other_templates_render_in_full(name: str) -> None:
    tokenizer = QwenTokenizer(chat_template=OTHERS[name])
    assert window_rule(tokenizer) is None
    windowed, full = check_incremental_equals_full(tokenizer, range(10))
    assert windowed == 0 and full > 0


def test_every_shipped_template_has_a_window_rule() -> None:
    sources = {default_chat_template()} | {
        f.chat_template() for f in FAMILIES.values() if f.template is not None
    }
    assert set(windowed_templates()) == sources


def test_templates_that_rewrite_history_fall_back_at_every_turn() -> None:
    # DeepSeek-V3.1 thinking: the generation prompt opens <think>, a past turn renders </think>:
    # no window extends the previous text, so every turn is rendered in full (and the template
    # check sees the break where the full rendering has it).
    from hermes_async.agent._reasoning import TemplateKwargsTokenizer

    tokenizer = TemplateKwargsTokenizer(
        QwenTokenizer(chat_template=_source("deepseek_v31")), {"enable_thinking": True}
    )
    renderer = ChatRenderer(tokenizer, TOOLS)
    messages: list[JSONObject] = [{"role": "user", "content": "go"}]
    renderer.render(messages, add_generation_prompt=True)
    for turn in range(3):
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "t", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "ok"},
        ]
        got = renderer.render(messages, add_generation_prompt=True)
        assert got == tokenizer.apply_chat_template(messages, TOOLS, add_generation_prompt=True)
    assert renderer.statistics() == RendererStatistics(windowed=0, full=4, fallbacks=3)


def test_a_conversation_changed_other_than_by_appending_is_rendered_in_full() -> None:
    tokenizer = QwenTokenizer()
    renderer = ChatRenderer(tokenizer, TOOLS)
    steps = conversation_steps(5)
    for messages, generation in steps[:-1]:
        renderer.render(messages, add_generation_prompt=generation)
    messages, generation = steps[-1]
    edited = [dict(m) for m in messages]  # same contents, new objects: identity decides
    edited[1]["content"] = "an edited task"
    before = renderer.statistics()
    got = renderer.render(edited, add_generation_prompt=generation)
    assert got == tokenizer.apply_chat_template(edited, TOOLS, add_generation_prompt=generation)
    assert renderer.statistics().full == before.full + 1


def test_incremental_off_renders_in_full() -> None:
    renderer = ChatRenderer(QwenTokenizer(), TOOLS, incremental=False)
    for messages, generation in conversation_steps(1):
        renderer.render(messages, add_generation_prompt=generation)
    assert renderer.rule is None and renderer.statistics().windowed == 0


def _jinja_builtin(messages: list[JSONObject], tools: Any, generation: bool) -> str:
    """The built-in template rendered by Jinja itself (the definition of its text)."""
    from hermes_async.inference._chat_template import _compile

    return _compile(default_chat_template()).render(
        messages=messages, tools=tools or None, add_generation_prompt=generation
    )


def test_builtin_template_in_python_equals_jinja() -> None:
    from hermes_async.inference._chatml import render_builtin

    for seed in range(60):
        for tools in (TOOLS, None):
            for messages, generation in conversation_steps(seed):
                fast = render_builtin(messages, tools, generation)
                assert fast is not None
                assert fast == _jinja_builtin(messages, tools, generation), seed


ODD_MESSAGES: list[list[Any]] = [
    [{"role": "user", "content": 42}],
    [{"role": "user", "content": ["text part"]}],
    [{"role": "user", "content": [{"type": "text"}]}],
    [{"role": "user", "content": [{"type": "text", "text": None}]}],
    [{"role": "assistant", "content": "x", "reasoning_content": 3}],
    [{"role": "assistant", "content": "x", "tool_calls": [{"function": None}]}],
    [{"role": "assistant", "content": "", "tool_calls": [{"name": "t", "arguments": [1]}]}],
    [{"role": "assistant", "content": "", "tool_calls": [{"name": 5, "arguments": {}}]}],
    [{"role": "assistant", "content": "", "tool_calls": [{"name": "t", "raw": 1}]}],
    [{"role": "assistant", "content": "", "tool_calls": "not a list"}],
    [{"content": "no role"}],
    [{"role": 7, "content": "x"}],
    ["not a message"],
]


@pytest.mark.parametrize("messages", ODD_MESSAGES)
def test_builtin_template_odd_messages_render_as_jinja_does(messages: list[Any]) -> None:
    from hermes_async.inference._chat_template import render_chat_template

    try:
        expected: str | None = _jinja_builtin(messages, TOOLS, True)
    except Exception:
        expected = None
    if expected is None:
        with pytest.raises(ValueError, match="chat template rendering failed"):
            render_chat_template(messages, TOOLS)
    else:
        assert render_chat_template(messages, TOOLS) == expected


@pytest.mark.parametrize("case", SHIPPED, ids=[_ids(c) for c in SHIPPED])
def test_family_templates_render_as_transformers_does(case: tuple[str, dict[str, Any]]) -> None:
    # A family tokenizer renders the shipped templates in the project's Jinja environment:
    # the text must be transformers' own, message for message.
    from hermes_async.inference.families import _objects

    name, variables = case
    tokenizer = _hf_family(name, variables)
    hf = tokenizer.hf_tokenizer  # type: ignore[attr-defined]
    merged = {**FAMILIES[name].variables, **variables}
    for seed in range(25):
        for tools in (TOOLS, None):
            for messages, generation in conversation_steps(seed):
                shown = _objects(messages) if FAMILIES[name].arguments_as_objects else messages
                expected = hf.apply_chat_template(
                    shown,
                    tools=tools,
                    tokenize=False,
                    add_generation_prompt=generation,
                    **merged,
                )
                got = tokenizer.apply_chat_template(
                    messages, tools, add_generation_prompt=generation
                )
                assert got == expected, (seed, len(messages))
