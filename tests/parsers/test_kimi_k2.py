"""kimi_k2: literal example, ids, and the regressions of vLLM #28543 / #38579 / Dynamo #8208."""

from __future__ import annotations

import json

from hermes_async.parsers import ContentDelta, get_parser
from tests.parsers.helpers import assert_invariant, stream

K = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city":"NYC"}<|tool_call_end|><|tool_call_begin|>functions.ping:1<|tool_call_argument_begin|>{}'
    "<|tool_call_end|><|tool_calls_section_end|>"
)


def calls(result: object) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in getattr(result, "tool_calls", None) or []]


def test_reference_example_keeps_native_ids_and_makes_unique_ones() -> None:
    result = assert_invariant("kimi_k2", K, range(0, len(K), 9))
    assert calls(result) == [("get_weather", {"city": "NYC"}), ("ping", {})]
    tool_calls = result.tool_calls or []
    assert [c.native_id for c in tool_calls] == ["functions.get_weather:0", "functions.ping:1"]
    assert all(c.id.startswith("call_") for c in tool_calls)


def test_content_before_and_after_the_section_is_kept_and_no_marker_leaks() -> None:
    text = "Let me look." + K + " Done."
    events, result = stream("kimi_k2", list(text))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert "<|" not in content
    assert result.content == "Let me look.\nDone."


def test_missing_section_end_at_max_tokens_keeps_the_sealed_calls() -> None:
    text = K.replace("<|tool_calls_section_end|>", "")
    assert calls(assert_invariant("kimi_k2", text, [30])) == [
        ("get_weather", {"city": "NYC"}),
        ("ping", {}),
    ]


def test_end_and_begin_bundled_in_one_chunk() -> None:
    # Speculative decoding delivers `<|tool_call_end|><|tool_call_begin|>` in one delta.
    cut = K.index("<|tool_call_end|>")
    _, result = stream("kimi_k2", [K[:cut], K[cut : cut + 60], K[cut + 60 :]])
    assert calls(result) == [("get_weather", {"city": "NYC"}), ("ping", {})]


def test_singular_section_spelling_plain_ids_and_dotted_names() -> None:
    text = (
        "<|tool_call_section_begin|><|tool_call_begin|>ping:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
        '<|tool_call_begin|>functions.mcp.search:1\n<|tool_call_argument_begin|>{"q": 1}<|tool_call_end|>'
        "<|tool_call_section_end|>"
    )
    assert calls(get_parser("kimi_k2").parse(text)) == [("ping", {}), ("mcp.search", {"q": 1})]


def test_large_sections_are_not_capped() -> None:
    payload = "x" * 20_000
    text = K.replace('{"city":"NYC"}', json.dumps({"data": payload}))
    assert calls(get_parser("kimi_k2").parse(text))[0] == ("get_weather", {"data": payload})


def test_malformed_arguments_do_not_drop_the_other_call() -> None:
    text = K.replace('{"city":"NYC"}', '{"city":NYC}')
    result = get_parser("kimi_k2").parse(text)
    assert calls(result) == [("ping", {})]
    assert result.invalid_calls[0].name == "get_weather"
