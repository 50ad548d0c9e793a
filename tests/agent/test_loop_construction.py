"""Building a loop from the reference's arguments: options derived once, never changed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hermes_async.agent import AgentOptions, HermesAgentLoop, loop as loop_module


class Chat:
    async def chat_completion(self, **kwargs: Any) -> Any:
        raise AssertionError("not called")


def build(**kwargs: Any) -> HermesAgentLoop:
    return HermesAgentLoop(Chat(), [], [], **kwargs)


def test_loops_built_from_the_same_arguments_share_their_options() -> None:
    first, second = build(max_tokens=128, max_turns=5), build(max_turns=5, max_tokens=128)
    assert first.options is second.options
    assert first.options == dataclasses.replace(AgentOptions(), max_tokens=128, max_turns=5)


def test_a_loop_without_reference_arguments_keeps_the_given_options() -> None:
    options = AgentOptions(max_turns=3)
    assert build(options=options).options is options
    assert build().options == AgentOptions()


def test_an_int_and_a_float_of_equal_value_stay_apart() -> None:
    as_int, as_float = build(temperature=1), build(temperature=1.0)
    # A request body would carry 1 or 1.0 as given.
    assert repr(as_int.options.temperature) == "1"
    assert repr(as_float.options.temperature) == "1.0"


def test_the_callers_own_options_are_not_kept() -> None:
    options = AgentOptions(max_turns=4)
    first, second = build(options=options, max_tokens=64), build(options=options, max_tokens=64)
    assert first.options == second.options
    assert first.options is not second.options  # derived per loop: nothing holds `options`
    assert all(value is not first.options for value in loop_module._DERIVED.values())


def test_equal_bases_that_are_different_objects_each_derive_their_own() -> None:
    a = AgentOptions(max_turns=4)
    b = AgentOptions(max_turns=4, tool_timeout=9.0)
    assert build(options=a, max_tokens=64).options.tool_timeout == a.tool_timeout
    assert build(options=b, max_tokens=64).options.tool_timeout == 9.0
    assert build(options=b, max_tokens=64).options.max_turns == 4


def test_unhashable_arguments_are_derived_per_loop() -> None:
    first = build(extra_body={"top_k": 5})
    second = build(extra_body={"top_k": 7})
    assert first.options.extra_body == {"top_k": 5}
    assert second.options.extra_body == {"top_k": 7}


def test_bad_arguments_are_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match="max_turns"):
            build(max_turns=0)


def test_the_table_of_derived_options_stays_bounded() -> None:
    for tokens in range(1, 3 * loop_module._DERIVED_MAX):
        assert build(max_tokens=tokens).options.max_tokens == tokens
    assert len(loop_module._DERIVED) <= loop_module._DERIVED_MAX
