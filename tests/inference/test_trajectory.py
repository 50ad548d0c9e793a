from __future__ import annotations

from array import array

import pytest

from hermes_async.inference.trajectory import MASK_ID, Trajectory, TrajectoryError


def test_segments_align_tokens_masks_logprobs() -> None:
    t = Trajectory([1, 2, 3])
    t.add_completion([10, 11], [-0.5, -0.25])
    t.add_suffix([4, 5])
    t.add_suffix([])
    t.add_completion([12], [-1.0])
    assert t.tokens == [1, 2, 3, 10, 11, 4, 5, 12]
    assert t.masks == [MASK_ID, MASK_ID, MASK_ID, 10, 11, MASK_ID, MASK_ID, 12]
    assert t.logprobs == [1.0, 1.0, 1.0, -0.5, -0.25, 1.0, 1.0, -1.0]
    assert len(t) == len(t.tokens) == len(t.masks) == len(t.logprobs)
    assert t.completion_token_count == 3
    assert [s.kind for s in t.segments] == ["prompt", "completion", "suffix", "completion"]
    node = t.managed_state()["nodes"][0]
    assert node == {"tokens": t.tokens, "masked_tokens": t.masks, "logprobs": t.logprobs}


def test_misaligned_logprobs_rejected() -> None:
    t = Trajectory([1])
    with pytest.raises(TrajectoryError, match="2 token ids but 1 logprobs"):
        t.add_completion([5, 6], [-0.1])
    assert t.tokens == [1]


def test_the_prompt_ids_are_kept_once_as_a_compact_array() -> None:
    # Thousands of parked rollouts each hold their prompt: not also as the tokenizer's list of
    # Python ints (~40 bytes per token; issue #23).
    given = [5, 6, 7]
    traj = Trajectory(given)
    assert traj.prompt_ids is traj.segments[0].token_ids
    assert list(traj.prompt_ids) == given and traj.tokens == given
    assert all(type(i) is int for i in traj.tokens)


def test_an_id_array_is_kept_as_given_and_never_changed() -> None:
    # A group's rollouts share their prompt's ids (the prompt cache's array).
    shared = array("i", [5, 6, 7])
    one, two = Trajectory(shared), Trajectory(shared)
    for traj in (one, two):
        traj.add_completion([8], [-0.5])
        traj.add_suffix([9])
        assert traj.segments[0].token_ids is shared and traj.tokens == [5, 6, 7, 8, 9]
    assert list(shared) == [5, 6, 7]
    other = array("q", [5, 6, 7])  # another item size: copied into the 4-byte kind
    assert Trajectory(other).segments[0].token_ids.typecode == "i"
