"""The shapes every adapter reads off a scored rollout: turns, flat rows, status."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_async.agent import AgentOptions, FailurePolicy, RolloutSetup, RolloutTask, run_rollout
from hermes_async.errors import ConfigError
from hermes_async.integrations._rollouts import (
    flatten,
    make_task,
    rollout_status,
    turn_tokens,
    with_sampling,
)
from hermes_async.testing import Fault
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import TOKENIZER, RecordingFactory, tool_call

from .helpers import (
    TOOLS,
    assert_flat_matches_wire,
    assert_turns_match_wire,
    make_tasks,
    scripted,
    vllm_client,
)

pytestmark = pytest.mark.anyio


async def test_turns_and_flat_rows_are_the_wire_ids(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sb")
    async with scripted() as (server, url, transport), SandboxManager(factory) as manager:
        task = await make_task(make_tasks(manager), {})
        async with vllm_client(transport, url) as client:
            scored = await run_rollout(
                client, task.messages, task.tools, setup=task.setup, options=task.options
            )
    assert scored.reward == 1.0 and len(scored.result.tool_errors) == 0
    turns = turn_tokens(scored)
    assert len(turns) == 3 == len(server.requests)
    assert_turns_match_wire(
        [(t.prompt_ids, t.completion_ids, t.logprobs) for t in turns], server.requests
    )
    flat = flatten(scored)
    assert flat.prompt_ids == server.requests[0].prompt_ids
    runs = assert_flat_matches_wire(
        flat.prompt_ids,
        flat.response_ids,
        flat.response_mask,
        flat.response_logprobs,
        server.requests,
    )
    assert runs == 3 and sum(flat.response_mask) == sum(
        len(r.completion_ids) for r in server.requests
    )
    assert rollout_status(scored, max_turns=6) == "completed"
    assert factory.leftovers() == []


async def test_status_of_each_ending(tmp_path: Path) -> None:
    async def statuses(policy: object, options: AgentOptions, **kw: object) -> str:
        async with (
            scripted(policy, **kw) as (_, url, transport),
            SandboxManager(RecordingFactory(tmp_path / "sb")) as manager,
            vllm_client(transport, url) as client,
        ):
            # No retry: the failure itself is what is looked at.
            setup = RolloutSetup(
                tokenizer=TOKENIZER,
                sandboxes=manager,
                failure_policy=FailurePolicy(on_failure="zero"),
            )
            scored = await run_rollout(
                client, [{"role": "user", "content": "go"}], TOOLS, setup=setup, options=options
            )
        return rollout_status(scored, max_turns=options.max_turns)

    loop = tool_call("terminal", {"command": "true"})
    assert await statuses(lambda r: loop, AgentOptions(max_turns=2)) == "truncated"
    assert await statuses(lambda r: "word " * 50, AgentOptions(max_tokens=8)) == "truncated"
    assert await statuses(lambda r: "fine", AgentOptions()) == "completed"
    died = {2: Fault.disconnect(after_tokens=2)}
    assert (
        await statuses(
            lambda r: loop if r.request_number == 1 else "x y z", AgentOptions(), faults=died
        )
        == "failed"
    )


def test_flatten_cuts_at_the_budget_and_refuses_placeholders() -> None:
    from hermes_async.agent import AgentResult, ScoredRollout

    result = AgentResult(messages=[{"role": "user", "content": "x"}])
    rows = ScoredRollout(
        "t",
        result,
        0.0,
        [1, 2, 3, 4, 5],
        [-100, -100, 3, -100, 5],
        [1.0, 1.0, -0.5, 1.0, -0.1],
        True,
        0.0,
        None,
        None,
    )
    whole = flatten(rows, max_response_tokens=3)
    assert (whole.prompt_ids, whole.response_ids, whole.response_mask) == (
        [1, 2],
        [3, 4, 5],
        [1, 0, 1],
    )
    assert whole.response_logprobs == [-0.5, 0.0, -0.1] and not whole.truncated
    cut = flatten(rows, max_response_tokens=2)
    assert (cut.response_ids, cut.response_mask, cut.response_logprobs) == (
        [3, 4],
        [1, 0],
        [-0.5, 0.0],
    )
    assert cut.truncated
    placeholder = ScoredRollout("t", result, 0.0, [1], [-100], [1.0], False, 0.0, None, None)
    with pytest.raises(ConfigError, match="placeholder tokens"):
        flatten(placeholder)


async def test_make_task_needs_a_tokenizer_and_a_task() -> None:
    def no_tokenizer(item: object) -> RolloutTask:
        return RolloutTask(
            [{"role": "user", "content": "x"}], TOOLS, RolloutSetup(), AgentOptions()
        )

    with pytest.raises(ConfigError, match="no tokenizer"):
        await make_task(no_tokenizer, {})
    with pytest.raises(ConfigError, match="not a RolloutTask"):
        await make_task(lambda item: "nope", {})


def test_with_sampling_the_trainer_wins_and_bad_values_are_config_errors() -> None:
    options = with_sampling(AgentOptions(temperature=0.5, max_tokens=64), {"top_p": 0.9})
    assert options.sampling is not None
    assert (options.sampling.temperature, options.sampling.max_tokens, options.sampling.top_p) == (
        0.5,
        64,
        0.9,
    )
    assert options.temperature is None and options.max_tokens is None
    assert (
        with_sampling(AgentOptions(temperature=0.5), {"temperature": 1.0}).sampling.temperature
        == 1.0
    )  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="cannot be honoured"):
        with_sampling(AgentOptions(), {"temperature": -1})
