"""hermes / qwen / longcat: literal examples and regressions (landscape.md §3.4)."""

from __future__ import annotations

import json

import pytest

from hermes_async.inference.tokenizer import QwenTokenizer
from hermes_async.parsers import ArgumentsDelta, ContentDelta, ToolCallSealed, get_parser
from tests.parsers.helpers import assert_invariant, split_at, stream

H = (
    'I\'ll list the files.<tool_call>{"name": "terminal", "arguments": {"command": "ls -la"}}</tool_call>\n'
    '<tool_call>{"name": "read_file", "arguments": {"path": "test.py"}}</tool_call>'
)
L = '<longcat_tool_call>{"name": "terminal", "arguments": {"command": "pwd"}}</longcat_tool_call>'


def calls(result: object) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in getattr(result, "tool_calls", None) or []]


@pytest.mark.parametrize("name", ["hermes", "qwen"])
def test_reference_example_h(name: str) -> None:
    result = assert_invariant(name, H, range(0, len(H), 7))
    assert result.content == "I'll list the files."
    assert calls(result) == [
        ("terminal", {"command": "ls -la"}),
        ("read_file", {"path": "test.py"}),
    ]


def test_reference_example_longcat() -> None:
    result = assert_invariant("longcat", L, [3, 20, 40])
    assert result.content is None
    assert calls(result) == [("terminal", {"command": "pwd"})]


@pytest.mark.parametrize("interval", [1, 2, 3, 5, 8, 9999])
def test_literal_closing_tag_inside_a_string_does_not_end_the_call(interval: int) -> None:
    # vllm #45167 / PRs #48353, #45310: the streamed and the whole-text parse agree.
    text = (
        'Writing docs.<tool_call>{"name": "write_file", "arguments": {"path": "a.md", '
        '"content": "use </tool_call> to end a call"}}</tool_call>'
    )
    _, result = stream("hermes", split_at(text, range(0, len(text), interval)))
    assert calls(result) == [
        ("write_file", {"path": "a.md", "content": "use </tool_call> to end a call"})
    ]
    assert result.content == "Writing docs."


def test_brace_expansion_in_a_command_is_fine() -> None:
    # vllm #21544: partial_json_parser crashed on `mkdir -p test/{test1,test2`.
    text = '<tool_call>{"name": "terminal", "arguments": {"command": "mkdir -p test/{test1,test2}"}}</tool_call>'
    result = assert_invariant("hermes", text, range(0, len(text), 3))
    assert calls(result) == [("terminal", {"command": "mkdir -p test/{test1,test2}"})]


def test_streamed_arguments_are_never_duplicated_or_corrupted() -> None:
    # vllm #10395: diffing re-serialized JSON duplicated quotes (`""ZSJB39...`).
    args = '{"injection": "ZSJB39", "n": [1, 2, {"k": "v\\"q"}], "s": ""}'
    text = '<tool_call>{"name": "inject", "arguments": ' + args + "}</tool_call>"
    for size in (1, 2, 3, 7):
        events, result = stream("hermes", split_at(text, range(0, len(text), size)))
        streamed = "".join(e.fragment for e in events if isinstance(e, ArgumentsDelta))
        assert streamed == args
        assert json.loads(result.tool_calls[0].arguments) == json.loads(args)  # type: ignore[index]


def test_one_malformed_call_does_not_discard_the_valid_ones() -> None:
    text = (
        'A<tool_call>{"name": "ok1", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "bad", "arguments": {"x": 1}</tool_call>'
        '<tool_call>{"name": "ok2", "arguments": {"y": 2}}</tool_call>B'
    )
    result = assert_invariant("hermes", text, range(0, len(text), 4))
    assert calls(result) == [("ok1", {}), ("ok2", {"y": 2})]
    (bad,) = result.invalid_calls
    assert (bad.index, bad.name) == (1, "bad")
    assert "incomplete" in bad.reason and "could not be parsed" in bad.message
    assert [c.index for c in result.tool_calls or []] == [0, 2]
    assert result.content == "A\nB"


def test_not_json_in_a_tag_is_invalid_and_the_next_call_still_runs() -> None:
    text = '<tool_call>run ls please</tool_call><tool_call>{"name": "ping"}</tool_call>'
    result = assert_invariant("hermes", text, [5, 15, 40])
    assert calls(result) == [("ping", {})]
    assert result.invalid_calls[0].raw == "run ls please"


def test_missing_name_and_bad_arguments_are_invalid() -> None:
    text = (
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "a", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "b", "arguments": "not json"}</tool_call>'
    )
    result = get_parser("hermes").parse(text)
    assert result.tool_calls is None
    reasons = [c.reason for c in result.invalid_calls]
    assert "no string 'name'" in reasons[0]
    assert "must be a JSON object" in reasons[1]
    assert "not valid JSON" in reasons[2]


def test_text_between_and_after_calls_is_kept() -> None:
    text = 'First.<tool_call>{"name": "a", "arguments": {}}</tool_call> Then. <tool_call>{"name": "b", "arguments": {}}</tool_call> Done.'
    assert get_parser("hermes").parse(text).content == "First.\nThen.\nDone."


def test_json_encoded_arguments_string_is_decoded_once() -> None:
    text = '<tool_call>{"name": "terminal", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
    assert calls(get_parser("hermes").parse(text)) == [("terminal", {"command": "ls"})]


def test_missing_arguments_and_parameters_key() -> None:
    text = '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b", "parameters": {"q": 1}}</tool_call>'
    assert calls(get_parser("hermes").parse(text)) == [("a", {}), ("b", {"q": 1})]


def test_empty_tag_is_skipped() -> None:
    result = get_parser("hermes").parse("x<tool_call> </tool_call>y")
    assert (result.tool_calls, result.invalid_calls) == (None, ())


def test_open_call_at_end_of_stream_is_truncated_not_executed() -> None:
    text = 'Run it.<tool_call>{"name": "terminal", "arguments": {"command": "rm -rf bu'
    result = assert_invariant("hermes", text, [10, 30])
    assert result.tool_calls is None
    (cut,) = result.truncated_calls
    assert cut.name == "terminal" and cut.raw.endswith("rm -rf bu")
    assert "cut off" in cut.message
    assert result.content == "Run it."


def test_complete_call_without_closing_tag_is_sealed() -> None:
    # A server stopping on `</tool_call>` leaves it out; the JSON itself is complete.
    parser = get_parser("hermes")
    events = parser.feed('<tool_call>{"name": "a", "arguments": {}}')
    assert [e.name for e in events if isinstance(e, ToolCallSealed)] == ["a"]
    result = parser.finish()
    assert calls(result) == [("a", {})] and not result.truncated_calls


def test_calls_inside_think_are_reasoning_not_calls() -> None:
    text = '<think>maybe <tool_call>{"name": "no", "arguments": {}}</tool_call>?</think>ok<tool_call>{"name": "yes", "arguments": {}}</tool_call>'
    events, result = stream("hermes", list(text))
    assert calls(result) == [("yes", {})]
    reasoning = "".join(e.text for e in events if isinstance(e, ContentDelta) and e.reasoning)
    assert (
        reasoning == '<think>maybe <tool_call>{"name": "no", "arguments": {}}</tool_call>?</think>'
    )


def test_two_objects_in_one_tag_are_two_calls() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {}}</tool_call>'
    assert calls(get_parser("hermes").parse(text)) == [("a", {}), ("b", {})]


def test_real_qwen_special_ids_one_token_at_a_time() -> None:
    tokenizer = QwenTokenizer()
    text = 'Hi.<tool_call>\n{"name": "terminal", "arguments": {"command": "echo é"}}\n</tool_call><|im_end|>'
    ids = tokenizer.encode(text)
    assert tokenizer.special_tokens["<tool_call>"] in ids
    decoder = tokenizer.incremental_decoder()
    # Decoder output with the specials spelled, and with them dropped: same calls.
    for drop in (False, True):
        chunks = []
        for token in ids:
            piece = decoder.decode([token])
            if drop and token in tokenizer.special_tokens.values():
                piece = ""
            chunks.append((piece, [token]))
        _, result = stream("hermes", chunks, tokenizer=tokenizer)
        assert calls(result) == [("terminal", {"command": "echo é"})]


def test_reasoning_flags_and_unclosed_think_is_never_scanned() -> None:
    text = '<think>call <tool_call>{"name": "x", "arguments": {}}</tool_call>'
    events, result = stream("hermes", list(text))
    assert result.tool_calls is None and not result.truncated_calls
    assert all(e.reasoning for e in events if isinstance(e, ContentDelta))
    assert result.content == text


def test_nan_is_not_json() -> None:
    result = get_parser("hermes").parse(
        '<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>'
    )
    assert result.tool_calls is None
    assert "NaN is not valid JSON" in result.invalid_calls[0].reason


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "a", "arguments": {"x": 1}}',
        '{"arguments": {"x": [1, {"y": "}"}]}, "name": "a"}',  # arguments before the name
        '{"name": "a", "parameters": {"x": 1}}',
        '{"name": "a", "arguments": {"x": 1}, "parameters": {"y": 2}}',  # both keys
        '{"name": "a", "name": "b", "arguments": {}}',  # a repeated key
        '{"name": "a", "arguments": "{\\"x\\": 1}"}',  # arguments as a JSON string
        '{"name": "a", "arguments": null}',
        '{"name": "a", "arguments": 3}',
        '{"name": "a", "arguments": {"x": 1}, "extra": [true, false, null]}',
        '{"name": "a b", "arguments": {}}',  # not a tool name
        '{"name": 7, "arguments": {}}',
        '{"name": "a"}',
        '{ "name" : "é\\u00e9" , "arguments" : { "s" : "😀 <tool_call> \\ud83d\\ude00" } }',
        '{"name": "a", "arguments": {"s": "\\ud800"}}',  # a lone surrogate escape: scrubbed
        '{"name": "a", "arguments": {"x": 1e999}}',
        '{"name": "a", "arguments": {"x": 12345678901234567890123}}',
        '{"name": "a", "arguments": {"x": 1},}',
        '{"name": "a", "arguments": {"x": 1}} trailing',
        '{"name": "a", "arguments": ' + "[" * 70 + "]" * 70 + "}",  # too deep
    ],
)
def test_a_call_whole_in_one_chunk_gives_what_the_scanner_gives(body: str) -> None:
    # Whole in one chunk takes the one-pass decode; one character at a time, the scanner.
    for text in (f"Hi.\n<tool_call>\n{body}\n</tool_call>", f"<tool_call>{body}</tool_call>x"):
        assert_invariant("hermes", text, cuts=[len(text) // 2])
