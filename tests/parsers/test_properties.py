"""Chunk invariance, as hypothesis properties, for every registered parser name.

The main property runs ``EXAMPLES`` (200) examples per name (15 names), the others
``SECONDARY_EXAMPLES`` (50): random outputs mixing text, well-formed
calls, marker fragments, reasoning blocks and truncation, cut at random places, one character
at a time, and token by token with markers as special ids (spelled out or skipped by the
decoder).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hermes_async.inference.tokenizer import QwenTokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers import get_parser
from tests.parsers.helpers import (
    ALL_NAMES,
    ATOMS,
    RENDER,
    FakeTokenizer,
    assert_invariant,
    call_key,
    stream,
)

#: Examples per registered name for the main property (any split == whole text).
EXAMPLES = 200
#: Examples per name for the secondary properties (special ids, round trip, real tokens).
SECONDARY_EXAMPLES = 50
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
PROFILE = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=_HEALTH)
SECONDARY = settings(max_examples=SECONDARY_EXAMPLES, deadline=None, suppress_health_check=_HEALTH)

_TEXT_CHARS = [*list('ab \n.:;=|/"\\{}[]<>`é😀'), "\t"]
_SAFE_CHARS = list("ab \n.:=éλ,!?")
_TOOL_NAMES = ["terminal", "read_file", "get_weather", "ping", "a.b"]

_strings = st.one_of(
    st.text(alphabet=st.sampled_from(_TEXT_CHARS), max_size=10),
    st.sampled_from(["</tool_call>", "<|tool_call_end|>", "```", "\\n", '{"x": 1}', "</think>"]),
)
_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), _strings),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_strings, inner, max_size=3),
    max_leaves=6,
)
_keys = st.text(alphabet=st.sampled_from(list("abcxyz_")), min_size=1, max_size=5)
_args = st.dictionaries(_keys, _json_values, max_size=4)
_string_args = st.dictionaries(
    _keys, st.text(alphabet=st.sampled_from(_SAFE_CHARS), min_size=1, max_size=12), max_size=3
)


@st.composite
def outputs(draw: st.DrawFn, name: str) -> str:
    """A random model output for ``name``: text, calls, marker fragments, reasoning, cuts."""
    pieces: list[str] = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["text", "call", "call", "atom", "think"]))
        if kind == "text":
            pieces.append(draw(st.text(alphabet=st.sampled_from(_TEXT_CHARS), max_size=12)))
        elif kind == "call":
            pieces.append(RENDER[name](draw(st.sampled_from(_TOOL_NAMES)), draw(_args)))
        elif kind == "atom":
            atom = draw(st.sampled_from(ATOMS[name]))
            pieces.append(atom[: draw(st.integers(1, len(atom)))])
        else:
            inner = RENDER[name]("ping", {}) if draw(st.booleans()) else "hmm"
            pieces.append("<think>" + inner + "</think>")
    text = "".join(pieces)
    if text and draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text


@pytest.mark.parametrize("name", ALL_NAMES)
@PROFILE
@given(data=st.data())
def test_any_split_gives_the_whole_text_result(name: str, data: st.DataObject) -> None:
    text = data.draw(outputs(name))
    cuts = data.draw(st.lists(st.integers(0, max(len(text), 1)), max_size=8))
    assert_invariant(name, text, cuts)


@pytest.mark.parametrize("name", ALL_NAMES)
@SECONDARY
@given(data=st.data())
def test_special_ids_spelled_or_skipped_give_the_same_result(
    name: str, data: st.DataObject
) -> None:
    text = data.draw(outputs(name))
    tokenizer = FakeTokenizer([a for a in ATOMS[name] if len(a) > 1 and a[0] in "<["])
    tokens = tokenizer.tokens(text)
    chunks: list[tuple[str, list[int]]] = []
    i = 0
    while i < len(tokens):
        size = data.draw(st.integers(1, 8))
        group = tokens[i : i + size]
        i += size
        parts = []
        for piece, ids in group:
            skipped = ids[0] < 10_000 and data.draw(st.booleans())
            parts.append("" if skipped else piece)
        chunks.append(("".join(parts), [t for _, ids in group for t in ids]))
    expected = get_parser(name).parse(text)
    _, result = stream(name, chunks, tokenizer=tokenizer)
    assert call_key(result) == call_key(expected)


_QWEN = QwenTokenizer()
_QWEN_MARKERS = {
    _QWEN.special_tokens[s] for s in ("<tool_call>", "</tool_call>", "<think>", "</think>")
}


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder"])
@SECONDARY
@given(data=st.data())
def test_real_qwen_token_streams(name: str, data: st.DataObject) -> None:
    text = data.draw(outputs(name))
    ids = _QWEN.encode(text)
    decoder = _QWEN.incremental_decoder()
    chunks: list[tuple[str, list[int]]] = []
    i = 0
    while i < len(ids):
        group = ids[i : i + data.draw(st.integers(1, 8))]
        i += len(group)
        piece = "".join(
            "" if t in _QWEN_MARKERS and data.draw(st.booleans()) else decoder.decode([t])
            for t in group
        )
        chunks.append((piece, group))
    chunks.append((decoder.flush(), []))
    expected = get_parser(name).parse(text)
    _, result = stream(name, chunks, tokenizer=_QWEN)
    assert call_key(result) == call_key(expected)


@pytest.mark.parametrize("name", ALL_NAMES)
@SECONDARY
@given(data=st.data())
def test_well_formed_calls_round_trip(name: str, data: st.DataObject) -> None:
    xml = name in ("qwen3_coder", "glm45", "glm47")
    calls = data.draw(
        st.lists(
            st.tuples(st.sampled_from(_TOOL_NAMES), _string_args if xml else _args), max_size=3
        )
    )
    tools: list[JSONObject] = [
        {
            "type": "function",
            "function": {
                "name": tool,
                "parameters": {
                    "type": "object",
                    "properties": {k: {"type": "string"} for _, a in calls for k in a},
                },
            },
        }
        for tool in _TOOL_NAMES
    ]
    prose = st.text(alphabet=st.sampled_from(_SAFE_CHARS), max_size=10)
    text = data.draw(prose) + "".join(RENDER[name](n, a) + data.draw(prose) for n, a in calls)
    result = assert_invariant(name, text, data.draw(st.lists(st.integers(0, len(text)))), tools)
    got = [(c.name, get_args(c.arguments)) for c in result.tool_calls or []]
    assert got == [(n, a) for n, a in calls]
    assert not result.invalid_calls and not result.truncated_calls


def get_args(arguments: str) -> JSONObject:
    import json

    value = json.loads(arguments)
    assert isinstance(value, dict)
    return value
