"""Model-server JSON (``inference._wirejson``): orjson's speed, the standard library's results."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import tracemalloc

import pytest
from hypothesis import given, strategies as st

from hermes_async.inference import _wirejson as wirejson
from hermes_async.inference._http import encode_body

# Texts where orjson alone would differ from json.loads: it refuses some, and reads integers
# past 64 bits as floats.
EDGE_TEXTS = [
    "NaN",
    '{"logprob": -Infinity}',
    "1e400",
    '"\\ud800"',
    '{"token_ids": [123456789012345678901234567890]}',
    "-9223372036854775809",
    "18446744073709551616",
    '{"a": 1, "a": 2}',
    '{"logprob": -0.000123456789012345678901}',
    "1e1234567890123456789",
    '  {"x": [1, 2.5, null, true, "\\u00e9"]}  ',
]


@pytest.mark.parametrize("text", EDGE_TEXTS)
def test_loads_gives_what_json_loads_gives(text: str) -> None:
    expected = json.loads(text)
    got = wirejson.loads(text)
    assert repr(got) == repr(expected)  # repr: nan != nan, and 1 == 1.0 would hide a float
    assert type(got) is type(expected)


@pytest.mark.parametrize("text", ["", "[1,]", '"\x01"', "{'a': 1}", "\ufeff{}", "[1] [2]"])
def test_loads_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(ValueError):
        wirejson.loads(text)


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


@given(_json_values)
def test_loads_matches_json_loads_on_any_text_json_dumps_writes(value: object) -> None:
    text = json.dumps(value)
    assert repr(wirejson.loads(text)) == repr(json.loads(text))


@given(_json_values)
def test_a_body_encodes_to_the_value_the_standard_library_writes(value: object) -> None:
    body = {"token_ids": [1, 2, 3], "extra": value}
    assert repr(json.loads(encode_body(body))) == repr(
        json.loads(json.dumps(body, ensure_ascii=False))
    )


def test_non_finite_floats_keep_their_value_and_none_stays_null() -> None:
    body = {"token_ids": [1], "sampling_params": {"temperature": math.nan, "seed": None}}
    sent = json.loads(encode_body(body))
    assert math.isnan(sent["sampling_params"]["temperature"])  # not orjson's null
    assert sent["sampling_params"]["seed"] is None
    assert json.loads(encode_body({"x": -math.inf})) == {"x": -math.inf}


def test_the_standard_library_decides_keys_surrogates_and_big_integers() -> None:
    assert json.loads(encode_body({"a": {1: "int key"}})) == {"a": {"1": "int key"}}
    assert json.loads(encode_body({"big": 2**70})) == {"big": 2**70}
    assert json.loads(encode_body({"s": "bad \ud800 surrogate"})) == {"s": "bad \ufffd surrogate"}


def test_what_the_standard_library_cannot_encode_is_still_refused() -> None:
    @dataclasses.dataclass
    class Point:
        x: int

    for value in (Point(1), datetime.date(2026, 12, 5), {1, 2}):
        with pytest.raises(TypeError):
            encode_body({"v": value})


def test_a_common_body_is_compact_utf8() -> None:
    body = {"token_ids": [9707, 11], "sampling_params": {"temperature": 0.7}, "text": "é"}
    assert (
        encode_body(body)
        == '{"token_ids":[9707,11],"sampling_params":{"temperature":0.7},"text":"é"}'.encode()
    )


def test_an_encoded_body_holds_its_own_size() -> None:
    # A body waits with its request for a model-request slot (thousands at once); orjson's own
    # result would keep the buffer it grew (~2 MB for these 70 KB).
    body = {"token_ids": list(range(100_000, 110_000)), "stream": True}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        encoded = encode_body(body)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert json.loads(encoded) == body
    assert held < 1.2 * len(encoded), (held, len(encoded))


def test_a_body_with_nulls_and_finite_floats_keeps_the_fast_encoding() -> None:
    # A chat body's "content": null beside tool calls is no reason for the standard library.
    body = {"messages": [{"role": "assistant", "content": None, "x": 0.5}], "seed": None}
    assert (
        encode_body(body)
        == b'{"messages":[{"role":"assistant","content":null,"x":0.5}],"seed":null}'
    )
    nested = {"messages": [{"content": None, "extra": [1, {"t": math.inf}]}]}
    assert json.loads(encode_body(nested)) == {
        "messages": [{"content": None, "extra": [1, {"t": math.inf}]}]
    }


@pytest.mark.parametrize("depth", [1_100, 100_000])
def test_json_too_deep_for_the_standard_library_is_a_value_error(depth: int) -> None:
    # orjson refuses past 1,024 levels; json.loads then recursed into RecursionError, which
    # the stream readers did not catch (only ValueError): the rollout crashed instead of
    # failing as the server's protocol error.
    with pytest.raises(ValueError, match="nested too deeply"):
        wirejson.loads("[" * depth + "]" * depth)
    with pytest.raises(ValueError, match="nested too deeply"):
        wirejson.loads('{"n": ' + "1" * 25 + ', "x": ' + "[" * depth)  # the long-integer path


def _line_loads(line: bytes) -> object:
    """What the stream does with a raw data line: the bytes path, else the text path."""
    value = wirejson.loads_data_line(line)
    if value is wirejson.UNDECIDED:
        return wirejson.loads(line.decode("utf-8", errors="replace").removesuffix("\r")[6:])
    return value


@pytest.mark.parametrize("text", [t.strip() for t in EDGE_TEXTS if t.strip().startswith("{")])
@pytest.mark.parametrize("end", ["", "\r"])
def test_a_data_line_decodes_as_its_text_on_the_edges(text: str, end: str) -> None:
    line = ("data: " + text + end).encode()
    assert repr(_line_loads(line)) == repr(wirejson.loads(text))


@given(_json_values)
def test_a_data_line_decodes_as_its_text(value: object) -> None:
    text = json.dumps({"choices": [value]}, ensure_ascii=False)
    assert repr(_line_loads(("data: " + text).encode())) == repr(json.loads(text))


def test_invalid_utf8_in_a_data_line_goes_the_text_way() -> None:
    line = b'data: {"a": "\xff"}'
    assert wirejson.loads_data_line(line) is wirejson.UNDECIDED
    assert _line_loads(line) == {"a": "\ufffd"}
