"""Pure row builders: exact Phase 2 rows, Phase 1 placeholders, the Atropos-shaped group."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hermes_async.agent import AgentResult
from hermes_async.agent.scoring import (
    exact_rows,
    model_answered,
    placeholder_rows,
    rollout_rows,
    scored_data_group,
    scored_data_item,
)

NODE = {
    "tokens": [1, 2, 3, 4],
    "masked_tokens": [-100, -100, 3, 4],
    "logprobs": [1.0, 1.0, -0.5, -0.25],
}


def test_exact_rows_come_from_the_last_node_dict_or_object() -> None:
    rows = exact_rows({"nodes": [{"tokens": [9], "masked_tokens": [9], "logprobs": [0.0]}, NODE]})
    assert rows is not None and rows.trainable
    assert (rows.tokens, rows.masks, rows.logprobs) == (
        [1, 2, 3, 4],
        [-100, -100, 3, 4],
        [1.0, 1.0, -0.5, -0.25],
    )
    as_object = exact_rows({"nodes": [SimpleNamespace(**NODE)]})
    assert as_object == rows
    assert exact_rows(None) is None and exact_rows({"nodes": []}) is None


def test_exact_rows_are_new_lists_of_exact_types() -> None:
    from array import array
    from fractions import Fraction

    node = {
        "tokens": [1, 2, 3],
        "masked_tokens": array("i", [-100, 2, 3]),
        "logprobs": [1.0, Fraction(-1, 2), 0],
    }
    rows = exact_rows({"nodes": [node]})
    assert rows is not None
    # Copies: a trainer editing its rows does not edit the rollout's managed_state.
    assert rows.tokens == [1, 2, 3] and rows.tokens is not node["tokens"]
    rows.tokens.append(9)
    assert node["tokens"] == [1, 2, 3]
    assert rows.masks == [-100, 2, 3] and type(rows.masks) is list
    assert rows.logprobs == [1.0, -0.5, 0.0]
    assert [type(v) for v in rows.logprobs] == [float, float, float]
    bools = exact_rows({"nodes": [{"tokens": [True, 2], "masked_tokens": [], "logprobs": []}]})
    assert bools is not None and [type(v) for v in bools.tokens] == [int, int]


def test_placeholder_rows_are_the_reference_ones() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]},
        {"role": "tool", "content": "out"},
    ]
    seen: list[str] = []

    def encode(text: str) -> list[int]:
        seen.append(text)
        return [10, 11, 12]

    rows = placeholder_rows(messages, encode)
    assert seen == ["sys\nhi\nout"]  # empty contents are skipped
    assert rows.tokens == [10, 11, 12] and rows.masks == [-100, 11, 12]
    assert rows.logprobs == [1.0, 1.0, 1.0] and not rows.trainable
    empty = placeholder_rows([], lambda text: [])
    assert (empty.tokens, empty.masks, empty.logprobs) == ([], [], [])


def test_rollout_rows_prefer_exact_tokens() -> None:
    def never(text: str) -> list[int]:
        raise AssertionError("Phase 2 rows are never re-tokenized")

    result = AgentResult(
        messages=[{"role": "user", "content": "x"}], managed_state={"nodes": [NODE]}
    )
    assert rollout_rows(result, never).trainable
    result.managed_state = None
    assert not rollout_rows(result, lambda text: [5, 6]).trainable


def test_model_answered_needs_a_turn_and_a_model_message() -> None:
    user = {"role": "user", "content": "x"}
    assert not model_answered(AgentResult(messages=[user]))
    assert not model_answered(AgentResult(messages=[user], turns_used=1))  # call failed
    assert model_answered(AgentResult(messages=[user, {"role": "assistant"}], turns_used=1))


def test_group_dict_is_aligned_and_atropos_shaped() -> None:
    rollouts = [
        SimpleNamespace(
            tokens=[1, 2],
            masks=[-100, 2],
            logprobs=[1.0, -0.1],
            reward=1.0,
            messages=["a"],
            failure=None,
        ),
        SimpleNamespace(
            tokens=[3], masks=[3], logprobs=[-0.2], reward=0.0, messages=["b"], failure=None
        ),
    ]
    group = scored_data_group(rollouts, generation_params={"temperature": 0.7})  # type: ignore[arg-type]
    assert group["tokens"] == [[1, 2], [3]] and group["masks"] == [[-100, 2], [3]]
    assert group["inference_logprobs"] == [[1.0, -0.1], [-0.2]] and group["scores"] == [1.0, 0.0]
    assert group["messages"] == [["a"], ["b"]]
    assert group["generation_params"] == {"temperature": 0.7}
    assert (group["advantages"], group["ref_logprobs"], group["overrides"], group["images"]) == (
        None,
    ) * 4
    assert group["group_overrides"] == {}
    assert scored_data_group([])["generation_params"] is None
    item = scored_data_item(rollouts[1])  # type: ignore[arg-type]
    assert item == {
        "tokens": [3],
        "masks": [3],
        "scores": 0.0,
        "inference_logprobs": [-0.2],
        "messages": ["b"],
    }
