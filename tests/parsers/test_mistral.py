"""mistral: pre-v11 and v11+ shapes, ids, and regressions."""

from __future__ import annotations

import json

from hermes_async.parsers import get_parser
from tests.parsers.helpers import assert_invariant

M1 = 'content before[TOOL_CALLS] [{"name":"a","arguments":{"x":1}}, {"name":"b","arguments":{"y":2}}]'
M2 = 'pre[TOOL_CALLS]get_weather{"city":"NYC"}[TOOL_CALLS]ping{}'


def calls(result: object) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in getattr(result, "tool_calls", None) or []]


def test_reference_example_pre_v11() -> None:
    result = assert_invariant("mistral", M1, range(0, len(M1), 5))
    assert result.content == "content before"
    assert calls(result) == [("a", {"x": 1}), ("b", {"y": 2})]


def test_reference_example_v11() -> None:
    result = assert_invariant("mistral", M2, range(0, len(M2), 4))
    assert result.content == "pre"
    assert calls(result) == [("get_weather", {"city": "NYC"}), ("ping", {})]


def test_args_and_call_id_markers() -> None:
    text = '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "NYC", "days": 3} and text'
    result = assert_invariant("mistral", text, [13, 25, 40])
    assert calls(result) == [("get_weather", {"city": "NYC", "days": 3})]
    assert result.tool_calls[0].native_id == "a1b2c3d4e"  # type: ignore[index]
    assert result.content == "and text"


def test_integer_arguments_survive() -> None:
    # vllm #13622: integer arguments were mangled.
    text = '[TOOL_CALLS][{"name": "set", "arguments": {"n": 42, "f": 1.5, "neg": -3}}]'
    assert calls(assert_invariant("mistral", text, [15, 30])) == [
        ("set", {"n": 42, "f": 1.5, "neg": -3})
    ]


def test_malformed_element_does_not_drop_the_others_and_nested_args_work() -> None:
    text = '[TOOL_CALLS][{"name": "a", "arguments": {"x": {"deep": [1]}}}, {"arguments": {}}, {"name": "c", "arguments": {}}]'
    result = get_parser("mistral").parse(text)
    assert calls(result) == [("a", {"x": {"deep": [1]}}), ("c", {})]
    assert len(result.invalid_calls) == 1


def test_single_object_and_v11_invalid_args() -> None:
    result = get_parser("mistral").parse(
        '[TOOL_CALLS]{"name": "a", "arguments": {}}[TOOL_CALLS]b{"x": nope}'
    )
    assert calls(result) == [("a", {})]
    assert result.invalid_calls[0].name == "b"


def test_v11_arguments_stream_as_written() -> None:
    # vllm #41730 / #33916: streamed_args_for_tool was not maintained.
    from hermes_async.parsers import ArgumentsDelta
    from tests.parsers.helpers import stream

    args = '{"city": "NYC", "days": [1, 2]}'
    events, result = stream("mistral", list("[TOOL_CALLS]get_weather[ARGS]" + args))
    assert "".join(e.fragment for e in events if isinstance(e, ArgumentsDelta)) == args
    assert calls(result) == [("get_weather", json.loads(args))]
