"""llama3_json / llama4_json: literal examples; non-call JSON stays content."""

from __future__ import annotations

import json

import pytest

from hermes_async.parsers import get_parser
from tests.parsers.helpers import assert_invariant

J1 = '<|python_tag|>{"name": "search", "parameters": {"q": "x"}}'
J2 = 'preamble {"name":"a","arguments":{"x":1}} {"name":"b","arguments":{"y":2}}'


def calls(result: object) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in getattr(result, "tool_calls", None) or []]


@pytest.mark.parametrize("name", ["llama3_json", "llama4_json"])
def test_reference_examples(name: str) -> None:
    first = assert_invariant(name, J1, range(0, len(J1), 3))
    assert (first.content, calls(first)) == (None, [("search", {"q": "x"})])
    second = assert_invariant(name, J2, range(0, len(J2), 5))
    assert (second.content, calls(second)) == ("preamble", [("a", {"x": 1}), ("b", {"y": 2})])


def test_braces_and_non_call_json_stay_content() -> None:
    text = 'Use {braces} and {"k": 1} here; then {"name": "a", "parameters": {}}; bye {'
    result = assert_invariant("llama3_json", text, range(0, len(text), 4))
    assert calls(result) == [("a", {})]
    assert result.content == 'Use {braces} and {"k": 1} here; then\nbye {'


def test_semicolon_separated_calls() -> None:
    text = '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"n": 2}}'
    result = get_parser("llama3_json").parse(text)
    assert (result.content, calls(result)) == (None, [("a", {}), ("b", {"n": 2})])


def test_call_with_bad_arguments_is_invalid_and_truncated_call_is_not_run() -> None:
    result = get_parser("llama3_json").parse(
        '{"name": "a", "parameters": 5} {"name": "b", "parameters": {"x": '
    )
    assert result.tool_calls is None
    assert result.invalid_calls[0].name == "a"
    assert result.truncated_calls[0].name == "b"
