"""qwen3_coder: literal example, schema typing, tolerated omissions, regressions."""

from __future__ import annotations

import json

from hermes_async.jsontypes import JSONObject
from hermes_async.parsers import ArgumentsDelta, ContentDelta, ToolCallStart, get_parser
from tests.parsers.helpers import assert_invariant, stream

Q3 = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>NYC</parameter>\n"
    "<parameter=days>3</parameter>\n</function>\n</tool_call>"
)
TOOLS: list[JSONObject] = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "mode": {"type": "integer"},
                    "force": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "ratio": {"type": ["number", "null"]},
                },
            },
        },
    }
]


def calls(result: object) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in getattr(result, "tool_calls", None) or []]


def test_reference_example() -> None:
    result = assert_invariant("qwen3_coder", Q3, range(0, len(Q3), 5))
    assert calls(result) == [("get_weather", {"city": "NYC", "days": 3})]
    assert result.content is None


def test_values_are_typed_from_the_schema() -> None:
    text = (
        "<tool_call>\n<function=write_file>\n<parameter=path>\n123\n</parameter>\n"
        "<parameter=content>\nnull\n</parameter>\n<parameter=mode>\n420\n</parameter>\n"
        '<parameter=force>\nTrue\n</parameter>\n<parameter=tags>\n["a", "b"]\n</parameter>\n'
        "<parameter=ratio>\n0.5\n</parameter>\n</function>\n</tool_call>"
    )
    typed = assert_invariant("qwen3_coder", text, [9, 40, 90], tools=TOOLS)
    assert calls(typed) == [
        (
            "write_file",
            {
                "path": "123",
                "content": "null",
                "mode": 420,
                "force": True,
                "tags": ["a", "b"],
                "ratio": 0.5,
            },
        )
    ]
    # Without a schema: the reference's guess (JSON, then a Python literal, then the string).
    untyped = get_parser("qwen3_coder").parse(text)
    assert json.loads(untyped.tool_calls[0].arguments)["path"] == 123  # type: ignore[index]
    assert json.loads(untyped.tool_calls[0].arguments)["content"] is None  # type: ignore[index]


def test_missing_closing_tags_are_tolerated() -> None:
    text = "<tool_call><function=f><parameter=a>1<parameter=b>two</tool_call>"
    assert calls(assert_invariant("qwen3_coder", text, [12, 30])) == [("f", {"a": 1, "b": "two"})]
    bare = "Sure. <function=f><parameter=a>x</parameter></function> done"
    result = assert_invariant("qwen3_coder", bare, [3, 20])
    assert calls(result) == [("f", {"a": "x"})] and result.content == "Sure.\ndone"


def test_literal_parameter_close_inside_a_value_is_kept() -> None:
    xml = "<a>\n</parameter>\n</a>"
    text = f"<tool_call>\n<function=write_file>\n<parameter=content>\n{xml}\n</parameter>\n</function>\n</tool_call>"
    result = assert_invariant("qwen3_coder", text, range(0, len(text), 3), tools=TOOLS)
    assert calls(result) == [("write_file", {"content": xml})]


def test_arguments_stream_per_parameter() -> None:
    # vllm #30439 / #22975: arguments were not streamed at all.
    events, result = stream("qwen3_coder", list(Q3))
    fragments = [e.fragment for e in events if isinstance(e, ArgumentsDelta)]
    assert fragments == ['{"city": "NYC"', ', "days": 3', "}"]
    assert "".join(fragments) == result.tool_calls[0].arguments  # type: ignore[index]


def test_call_is_not_left_in_content() -> None:
    # vllm #39056 / #40861: the call text leaked into content.
    events, result = stream("qwen3_coder", ["Checking.\n", Q3[:30], Q3[30:]])
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert "function" not in content and "parameter" not in content
    assert result.content == "Checking."


def test_call_inside_think_is_not_executed_and_the_next_one_is_found() -> None:
    # club-3090 #145: a call emitted inside <think> was lost; ours is never run, by design.
    text = f"<think>plan: {Q3}</think>\n{Q3}"
    result = assert_invariant("qwen3_coder", text, [20, 80, 150])
    assert calls(result) == [("get_weather", {"city": "NYC", "days": 3})]
    assert result.content is not None and result.content.startswith("<think>plan: <tool_call>")


def test_open_function_at_end_of_stream_is_truncated() -> None:
    text = "<tool_call>\n<function=write_file>\n<parameter=path>a.txt</parameter>\n<parameter=content>\nhel"
    events, result = stream("qwen3_coder", [text])
    assert result.tool_calls is None
    assert result.truncated_calls[0].name == "write_file"
    assert [e.name for e in events if isinstance(e, ToolCallStart)] == ["write_file"]


def test_function_without_closing_angle_is_invalid() -> None:
    text = "<function=oops <parameter=a>1</parameter></function><function=ok></function>"
    result = get_parser("qwen3_coder").parse(text)
    assert calls(result) == [("ok", {})]
    assert len(result.invalid_calls) == 1
