"""``object_members``: one pass over a JSON object that agrees with ``loads`` or says None."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from hermes_async._json import MAX_JSON_DEPTH, loads, object_members

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    obj=st.dictionaries(st.text(max_size=6), _values, max_size=4),
    indent=st.sampled_from([None, 0, 2]),
    tail=st.sampled_from(["", " ", "\n</tool_call>", "}"]),
)
def test_members_and_spans_agree_with_loads(
    obj: dict[str, object], indent: int | None, tail: str
) -> None:
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    parsed = object_members("x" + text + tail, 1)
    try:
        expected = loads(text)
    except ValueError:
        assert parsed is None
        return
    if parsed is None:  # only where loads would scrub a surrogate
        assert "\\ud" in text.lower() or any("\ud800" <= c <= "\udfff" for c in text)
        return
    members, end = parsed
    assert end == 1 + len(text)
    assert dict((key, value) for key, value, _, _ in members) == expected
    for _, value, start, stop in members:
        assert loads(("x" + text + tail)[start:stop]) == value


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1',  # unfinished
        '{"a": 1,}',
        '{"a" 1}',
        '{"a": NaN}',
        '{"a": 1e999}',
        '{"a": "\\ud800"}',  # loads scrubs it: not plain
        '{"a": ' + "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH + "}",  # too deep
        "[1]",
        "",
    ],
)
def test_anything_loads_would_refuse_or_change_is_none(text: str) -> None:
    assert object_members(text, 0) is None
