"""Hostile model text never raises (issue 16): the reproductions, as plain regression tests.

Each of these raised out of the parser before the fix: ~1,000 levels of JSON nesting in a call
(``RecursionError`` from 12 of 15 names), nine ``{`` in a row for ``llama3_json`` /
``llama4_json`` (``RuntimeError("parser made no progress")``), and a ``"\\ud800"`` escape in
the arguments (a sealed call whose arguments no UTF-8 encoder accepts, so the next request
body failed).
"""

from __future__ import annotations

import json

import pytest

from hermes_async.parsers import ParseResult, get_parser
from tests.parsers.helpers import ALL_NAMES, RENDER, FakeTokenizer, stream

XML_NAMES = {"qwen3_coder", "glm45", "glm47"}
DEPTH = 1_000


def _with_value(name: str, value_text: str) -> str:
    """A call to ``f`` whose one argument ``x`` is ``value_text`` as written (JSON or XML)."""
    text = RENDER[name]("f", {"x": "@@"})
    return text.replace("@@", value_text) if name in XML_NAMES else text.replace('"@@"', value_text)


def _encodable(result: ParseResult) -> None:
    """Everything a result holds can be written as UTF-8 JSON (request bodies, JSONL)."""
    payload = {
        "content": result.content,
        "calls": [c.to_dict() for c in result.tool_calls or []],
        "invalid": [(c.name, c.raw, c.reason, c.message) for c in result.invalid_calls],
        "truncated": [(c.name, c.raw, c.message) for c in result.truncated_calls],
    }
    json.dumps(payload, ensure_ascii=False).encode("utf-8")
    for call in result.tool_calls or []:
        json.loads(call.arguments).items()  # a JSON object


@pytest.mark.parametrize("name", ALL_NAMES)
def test_deeply_nested_arguments_are_a_model_visible_error(name: str) -> None:
    text = "before " + _with_value(name, "[" * DEPTH + "]" * DEPTH) + " after"
    result = get_parser(name).parse(text)
    _encodable(result)
    if name in XML_NAMES:
        # XML values are text: the brackets stay a string, nothing is decoded that deep.
        assert result.tool_calls is not None
        assert json.loads(result.tool_calls[0].arguments) == {"x": "[" * DEPTH + "]" * DEPTH}
    else:
        assert result.tool_calls is None
        (bad,) = result.invalid_calls
        assert "nested deeper than 64 levels" in bad.reason
        assert "could not be parsed" in bad.message
    # Streamed one character at a time: the same.
    _, streamed = stream(name, list(text))
    assert [(c.reason, c.raw) for c in streamed.invalid_calls] == [
        (c.reason, c.raw) for c in result.invalid_calls
    ]
    assert [c.arguments for c in streamed.tool_calls or []] == [
        c.arguments for c in result.tool_calls or []
    ]


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize(
    "noise",
    ["[" * 5_000, "{" * 5_000, '{"a":' * 2_000, '{"name": "f", "arguments": ' * 1_000],
    ids=["brackets", "braces", "objects", "calls"],
)
def test_deep_unclosed_nesting_anywhere_never_raises(name: str, noise: str) -> None:
    for text in (noise, RENDER[name]("f", {}) + noise, _with_value(name, noise)):
        result = get_parser(name).parse(text)
        _encodable(result)


@pytest.mark.parametrize("name", ["llama3_json", "llama4_json"])
@pytest.mark.parametrize("count", [9, 17, 1_000])
def test_a_run_of_braces_is_content(name: str, count: int) -> None:
    text = "{" * count
    assert get_parser(name).parse(text) == ParseResult(text, None)
    _, streamed = stream(name, list(text))
    assert streamed == ParseResult(text, None)
    # Followed by a real call, the call is still found.
    result = get_parser(name).parse(text + ' {"name": "ping", "arguments": {}}')
    assert [c.name for c in result.tool_calls or []] == ["ping"]


@pytest.mark.parametrize("name", sorted(set(ALL_NAMES) - XML_NAMES))
@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\udc00\\ud800", "a\\ud83d"])
def test_lone_surrogate_escapes_are_replaced_in_arguments(name: str, escape: str) -> None:
    text = _with_value(name, f'"{escape}"')
    result = get_parser(name).parse(text)
    _encodable(result)
    assert result.tool_calls is not None
    value = json.loads(result.tool_calls[0].arguments)["x"]
    assert "\ud800" not in value and "\ufffd" in value
    # A surrogate *pair* is one character, kept as it is.
    pair = get_parser(name).parse(_with_value(name, '"\\ud83d\\ude00"'))
    assert pair.tool_calls is not None
    assert json.loads(pair.tool_calls[0].arguments) == {"x": "😀"}


@pytest.mark.parametrize("name", ALL_NAMES)
def test_surrogates_in_names_text_and_literals_are_replaced(name: str) -> None:
    texts = [
        "plain \ud800 text",
        RENDER[name]("f\ud800", {"x": "a\udfffb"}) + "tail \udc00",
        _with_value(name, "'\\ud800'"),  # a Python literal (the XML formats' fallback)
    ]
    if name not in XML_NAMES:
        texts.append(RENDER[name]("f", {}).replace('"f"', '"f\\ud800"'))
    for text in texts:
        result = get_parser(name).parse(text)
        _encodable(result)
        _, streamed = stream(name, list(text))
        _encodable(streamed)
        assert streamed.content == result.content


@pytest.mark.parametrize("name", ALL_NAMES)
def test_infinite_numbers_are_not_sealed_as_json(name: str) -> None:
    result = get_parser(name).parse(_with_value(name, "1e999"))
    _encodable(result)
    for call in result.tool_calls or []:
        assert "Infinity" not in call.arguments


def test_a_tokenizer_that_refuses_ids_does_not_break_the_parser() -> None:
    class Refusing(FakeTokenizer):
        def decode(self, ids: object) -> str:
            raise OverflowError("out of range integral type conversion attempted")

    tokenizer = Refusing(["<tool_call>", "</tool_call>"])
    chunks = [("x", [-5, 1, 10**12]), ('{"name": "a", "arguments": {}}', [2**40, 7]), ("", [2])]
    _, result = stream("hermes", chunks, tokenizer=tokenizer)
    # The ids cannot be aligned with the text, so the text is trusted; a lone marker id is
    # put back without decoding anything.
    assert result == ParseResult('x{"name": "a", "arguments": {}}</tool_call>', None)
