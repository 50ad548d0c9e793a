"""glm45 / glm47: literal examples and regressions."""

from __future__ import annotations

import json

import pytest

from hermes_async.parsers import ToolCallStart, get_parser
from tests.parsers.helpers import assert_invariant, split_at, stream

G45 = (
    "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>NYC</arg_value>\n"
    "<arg_key>days</arg_key><arg_value>3</arg_value>\n</tool_call>"
)
G47 = "<tool_call>get_weather<arg_key>city</arg_key>\n<arg_value>NYC</arg_value></tool_call>"


def calls(result: object) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in getattr(result, "tool_calls", None) or []]


@pytest.mark.parametrize("name", ["glm45", "glm47"])
def test_reference_examples(name: str) -> None:
    assert calls(assert_invariant(name, G45, range(0, len(G45), 6))) == [
        ("get_weather", {"city": "NYC", "days": 3})
    ]
    assert calls(assert_invariant(name, G47, range(0, len(G47), 4))) == [
        ("get_weather", {"city": "NYC"})
    ]


def test_values_typed_from_schema() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"days": {"type": "string"}}},
            },
        }
    ]
    assert calls(get_parser("glm45", tools=tools).parse(G45)) == [
        ("get_weather", {"city": "NYC", "days": "3"})
    ]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 16])
def test_multi_token_chunks_stream_whole_names(chunk: int) -> None:
    # vllm #39253 (MTP / stream_interval) and #46040 (name streamed as `run_in`).
    text = "<tool_call>run_in_terminal\n<arg_key>command</arg_key><arg_value>ls</arg_value>\n</tool_call>"
    events, result = stream("glm47", split_at(text, range(0, len(text), chunk)))
    assert [e.name for e in events if isinstance(e, ToolCallStart)] == ["run_in_terminal"]
    assert calls(result) == [("run_in_terminal", {"command": "ls"})]


def test_tool_call_right_after_reasoning_is_found() -> None:
    # vllm #42400: the reasoning parser swallowed the <tool_call> after </think>.
    text = "<think>I should check.</think><tool_call>ping</tool_call>"
    result = assert_invariant("glm45", text, [25, 31])
    assert calls(result) == [("ping", {})]


def test_zero_argument_calls_are_kept() -> None:
    # vllm #44326: zero-argument calls were dropped.
    text = "<tool_call>ping\n</tool_call><tool_call>pong</tool_call>"
    assert calls(assert_invariant("glm45", text, [7, 20])) == [("ping", {}), ("pong", {})]


def test_unclosed_call_is_truncated() -> None:
    result = get_parser("glm47").parse("<tool_call>get_weather<arg_key>city</arg_key><arg_value>NY")
    assert result.tool_calls is None and result.truncated_calls[0].name == "get_weather"


def test_unclosed_value_before_the_end_tag_is_invalid_and_the_next_call_runs() -> None:
    text = "<tool_call>a<arg_key>k</arg_key><arg_value>v</tool_call><tool_call>b</tool_call>"
    result = assert_invariant("glm47", text, [10, 50])
    assert calls(result) == [("b", {})]
    assert result.invalid_calls[0].name == "a"
