"""Registry, result shapes and the engine's public contract."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hermes_async.parsers import (
    ContentDelta,
    ParseResult,
    ToolCall,
    ToolCallParser,
    ToolCallSealed,
    get_parser,
    list_parsers,
)
from tests.parsers.helpers import ALL_NAMES, RENDER, FakeTokenizer, stream

EXPECTED_NAMES = [
    "deepseek_dsml",
    "deepseek_v3",
    "deepseek_v31",
    "deepseek_v3_1",
    "deepseek_v4",
    "glm45",
    "glm47",
    "hermes",
    "kimi_k2",
    "llama3_json",
    "llama4_json",
    "longcat",
    "mistral",
    "qwen",
    "qwen3_coder",
]


def test_registered_names_are_the_reference_ones_plus_deepseek_v4() -> None:
    assert list_parsers() == EXPECTED_NAMES


def test_unknown_name_lists_the_available_ones() -> None:
    with pytest.raises(
        KeyError,
        match=r"unknown tool-call parser 'hermez'; available: deepseek_dsml, .*qwen3_coder",
    ):
        get_parser("hermez")


def test_each_call_returns_a_fresh_parser() -> None:
    first, second = get_parser("hermes"), get_parser("hermes")
    assert first is not second
    first.feed("<tool_call>")
    assert second.parse("plain") == ParseResult("plain", None)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_plain_text_is_returned_unchanged_with_no_calls(name: str) -> None:
    text = "Just an answer.\n  With spacing and <b>tags</b>.  "
    content, calls = get_parser(name).parse(text)
    assert (content, calls) == (text, None)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_calls_are_openai_shaped_with_unique_ids(name: str) -> None:
    text = "Sure." + RENDER[name]("terminal", {"command": "ls"}) + RENDER[name]("ping", {})
    result = get_parser(name).parse(text)
    assert result.content == "Sure."
    assert result.tool_calls is not None
    assert [
        (c.type, c.function.name, json.loads(c.function.arguments)) for c in result.tool_calls
    ] == [
        ("function", "terminal", {"command": "ls"}),
        ("function", "ping", {}),
    ]
    ids = [c.id for c in result.tool_calls]
    assert len(set(ids)) == 2
    other = get_parser(name).parse(text).tool_calls
    assert other is not None and not set(ids) & {c.id for c in other}
    assert result.tool_calls[0].to_dict() == {
        "id": ids[0],
        "type": "function",
        "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
    }


def test_ids_have_the_documented_shapes() -> None:
    (call,) = get_parser("hermes").parse(RENDER["hermes"]("ping", {})).tool_calls or []
    assert call.id.startswith("call_") and len(call.id) == 5 + 24
    (call,) = get_parser("mistral").parse(RENDER["mistral"]("ping", {})).tool_calls or []
    assert len(call.id) == 9 and call.id.isalnum()


def test_feed_after_finish_is_a_programming_error() -> None:
    parser = get_parser("hermes")
    parser.feed("hello")
    result = parser.finish()
    assert parser.finish() is result
    with pytest.raises(ValueError, match=r"feed\(\) after finish\(\) on a 'hermes' parser"):
        parser.feed("more")


def test_events_and_results_are_frozen_and_slotted() -> None:
    event = ContentDelta("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.text = "y"  # type: ignore[misc]
    assert not hasattr(event, "__dict__")
    call = ToolCallSealed(0, "call_x", "ping", "{}")
    assert isinstance(call.call, ToolCall) and call.call.name == "ping"
    assert not hasattr(ParseResult(None, None), "__dict__")


def test_sealed_event_carries_everything_needed_to_dispatch() -> None:
    parser = get_parser("hermes")
    events = parser.feed('<tool_call>{"name": "terminal", "arguments": {"command": "ls"}}')
    sealed = [e for e in events if isinstance(e, ToolCallSealed)]
    assert [(e.index, e.name, e.arguments) for e in sealed] == [
        (0, "terminal", '{"command": "ls"}')
    ]
    assert sealed[0].id.startswith("call_")
    final = parser.finish()
    assert final.tool_calls is not None and final.tool_calls[0].id == sealed[0].id


def test_parse_does_not_touch_the_streaming_state() -> None:
    parser = get_parser("hermes")
    parser.feed("<tool_call>{")
    assert parser.parse("x").content == "x"
    parser.feed('"name": "a", "arguments": {}}</tool_call>')
    assert [c.name for c in parser.finish().tool_calls or []] == ["a"]


def test_held_back_text_stays_shorter_than_a_marker() -> None:
    # Linear work: each feed scans its chunk plus at most a marker's length of old text.
    parser = get_parser("kimi_k2")
    text = "x" * 50 + RENDER["kimi_k2"]("ping", {"data": "y" * 5000}) + "z" * 50
    longest = len("<|tool_calls_section_begin|>")
    for ch in text:
        parser.feed(ch)
        assert len(parser._held) < longest
    assert parser.finish().tool_calls is not None


def test_special_id_with_empty_text_is_recognized() -> None:
    tokenizer = FakeTokenizer(["<tool_call>", "</tool_call>"])
    chunks = [("Hi", [10_000 + ord("H"), 10_000 + ord("i")]), ("", [1])]
    chunks += [(c, [10_000 + ord(c)]) for c in '{"name": "ping", "arguments": {}}']
    chunks += [("", [2]), ("!", [10_000 + ord("!")])]
    events, result = stream("hermes", chunks, tokenizer=tokenizer)
    assert [c.name for c in result.tool_calls or []] == ["ping"]
    assert result.content == "Hi\n!"
    assert all("tool_call" not in e.text for e in events if isinstance(e, ContentDelta))


def test_parser_type_is_public() -> None:
    assert isinstance(get_parser("glm47"), ToolCallParser)
    assert get_parser("qwen").name == "hermes"
