"""Containment: every failure is the rollout's categorized failure; a group applies its policy
(retry on a fresh sandbox, mask, zero) as a whole; one deadline covers the whole rollout."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from hermes_async.agent import (
    AgentOptions,
    AgentResult,
    FailurePolicy,
    RolloutSetup,
    ScoredRollout,
    ToolContext,
    run_group,
    run_rollout,
)
from hermes_async.agent.failures import RolloutFailure, classify_exception, worst_failure
from hermes_async.agent.rollout import _outcome
from hermes_async.errors import InferenceError, SandboxError
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.testing import (
    FakeSandbox,
    FakeSandboxFactory,
    Fault,
    PolicyRequest,
    ScriptedModelServer,
    open_app_endpoint,
)
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox.base import ExecResult, Sandbox
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import FAST, TOKENIZER, tool_call

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

TOOLS = get_tool_definitions(["terminal"])
PROMPT = [{"role": "user", "content": "Run the check."}]
QUICK = FailurePolicy(backoff_seconds=0.01, max_backoff_seconds=0.02)
ONCE = FailurePolicy(max_attempts=1)


def runs(command: str = "check") -> Any:
    """Run ``command`` in the terminal, then answer."""

    def policy(request: PolicyRequest) -> str:
        if any(m.get("role") == "tool" for m in request.messages):
            return "Done."
        return tool_call("terminal", {"command": command})

    return policy


async def one(result: AgentResult, ctx: ToolContext) -> float:
    return 1.0


@asynccontextmanager
async def world(
    policy: Any, factory: Any = None, **server: Any
) -> AsyncIterator[tuple[VLLMGenerateClient, SandboxManager, ScriptedModelServer]]:
    scripted = ScriptedModelServer(policy, tokenizer=TOKENIZER, **server)
    factory = factory or FakeSandboxFactory(exec_script={"*": ExecResult("ok\n", "", 0)})
    async with (
        open_app_endpoint(scripted, loopback=False) as (url, transport),
        VLLMGenerateClient(url, transport=transport, options=FAST) as client,
        SandboxManager(factory, close_timeout=0.5, create_timeout=0.5) as manager,
    ):
        yield client, manager, scripted


async def single(policy: Any, factory: Any = None, **kw: Any) -> ScoredRollout:
    server = kw.pop("server", {})
    async with world(policy, factory, **server) as (client, manager, _):
        setup = RolloutSetup(
            tokenizer=TOKENIZER,
            sandboxes=manager,
            failure_policy=kw.pop("failure_policy", ONCE),
            reward=kw.pop("reward", None),
        )
        scored = await run_rollout(client, PROMPT, TOOLS, setup=setup, **kw)
        assert manager.task_ids() == []  # released, whatever happened
    return scored


# ------------------------------------------------------------------ the taxonomy, per fault


@pytest.mark.parametrize(
    ("fault", "exception"),
    [
        (Fault.http_error(500), "ServerStatusError"),
        (Fault.rate_limited(0.01), "ServerStatusError"),
        (Fault.disconnect(2), "StreamInterruptedError"),
        (Fault.malformed(2), "ServerProtocolError"),
    ],
    ids=["500", "429", "disconnect", "malformed"],
)
async def test_model_server_failures_after_retries_are_infra(fault: Fault, exception: str) -> None:
    scored = await single(runs(), reward=one, server={"fault_plan": lambda number, body: fault})
    failure = scored.failure
    assert failure is not None and failure.category == "infra" and failure.retryable
    assert failure.detail["source"] == "model_server" and failure.detail["exception"] == exception
    assert scored.reward == 0.0 and scored.error == failure.message  # no reward on infra


async def test_a_stalled_server_ends_the_turn_as_agent_timeout() -> None:
    scored = await single(
        runs(),
        reward=one,
        options=AgentOptions(turn_timeout=0.3),
        server={"faults": {1: Fault.stall(2)}},
    )
    assert scored.category == "agent_timeout" and scored.failure is not None
    assert scored.failure.detail == {"source": "deadline", "deadline": "turn_timeout"}


async def test_context_length_is_the_model_and_still_rewarded() -> None:
    too_long = Fault.http_error(
        400, "This model's maximum context length is 4096 tokens. However, you requested 5000"
    )
    scored = await single(runs(), reward=one, server={"faults": {2: too_long}})
    assert scored.category == "model" and "context length exceeded" in scored.failure.message  # type: ignore[union-attr]
    assert scored.reward == 1.0  # the model answered once: its trajectory is judged


async def test_a_sandbox_that_cannot_be_created_aborts_the_rollout_as_infra() -> None:
    factory = FakeSandboxFactory(fail_create=RuntimeError("no capacity in zone b"))
    scored = await single(runs(), factory, reward=one)
    assert scored.category == "infra" and scored.failure is not None
    assert scored.failure.detail["source"] == "sandbox"
    assert "no capacity in zone b" in scored.failure.message
    assert scored.result.turns_used == 1  # aborted at once: the model did not go on blind
    assert scored.reward == 0.0


async def test_a_sandbox_that_dies_mid_rollout_is_infra() -> None:
    def twice(request: PolicyRequest) -> str:
        done = sum(1 for m in request.messages if m.get("role") == "tool")
        return tool_call("terminal", {"command": f"step {done}"}) if done < 3 else "Done."

    factory = FakeSandboxFactory(dies_after_execs=1, exec_script={"*": "ok"})
    scored = await single(twice, factory, reward=one)
    assert scored.category == "infra" and "the sandbox died" in str(scored.failure)
    # Aborted at the failed command (the next turn may have started, never finished).
    assert scored.result.turns_used in (2, 3) and not scored.result.finished_naturally


async def test_a_hung_command_is_a_tool_failure_and_the_rollout_goes_on() -> None:
    factory = FakeSandboxFactory(exec_hangs=True)
    scored = await single(runs(), factory, reward=one, options=AgentOptions(tool_timeout=0.2))
    assert scored.category == "tool" and scored.reward == 1.0 and scored.error is None
    assert scored.result.tool_errors[0].category == "tool"
    assert "timed out" in scored.result.tool_errors[0].error


async def test_malformed_and_unknown_calls_are_the_model() -> None:
    def sloppy(request: PolicyRequest) -> str:
        done = sum(1 for m in request.messages if m.get("role") == "tool")
        if done == 0:
            return '<tool_call>\n{"name": "terminal", "arguments": {"command": \n</tool_call>'
        if done == 1:
            return tool_call("teleport", {"where": "home"})
        return "Done."

    scored = await single(sloppy, reward=one)
    assert scored.category == "model" and scored.reward == 1.0 and scored.error is None
    assert [e.category for e in scored.result.tool_errors] == ["model", "model"]
    assert scored.failure is not None and scored.failure.detail["count"] == 2


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("raise", "reward failed: KeyError: 'expected'"),
        ("none", "reward failed: it returned None, not a finite number"),
        ("nan", "reward failed: it returned nan, not a finite number"),
        ("sleep", "reward failed: it did not finish before the rollout deadline"),
    ],
)
async def test_a_reward_that_fails_is_the_verifier(body: str, match: str) -> None:
    async def reward(result: AgentResult, ctx: ToolContext) -> Any:
        if body == "raise":
            raise KeyError("expected")
        if body == "sleep":
            await anyio.sleep_forever()
        return None if body == "none" else math.nan

    options = AgentOptions(rollout_timeout=1.0)
    start = anyio.current_time()
    scored = await single(runs(), reward=reward, options=options)
    assert anyio.current_time() - start < 1.0 + 0.5 + 1.0  # T + close_timeout + slack
    assert scored.category == "verifier" and scored.reward == 0.0
    assert scored.reward_error is not None and match in scored.reward_error


async def test_the_rollout_deadline_stops_the_loop_and_skips_the_reward() -> None:
    calls: list[str] = []

    async def reward(result: AgentResult, ctx: ToolContext) -> float:
        calls.append(ctx.task_id)
        return 1.0

    factory = FakeSandboxFactory(latency=lambda command: 60.0)
    options = AgentOptions(rollout_timeout=0.5)
    scored = await single(runs(), factory, reward=reward, options=options)
    assert scored.category == "agent_timeout" and "rollout deadline of 0.5 s" in str(scored.error)
    assert calls == [] and scored.reward == 0.0


async def test_every_rollout_ends_within_its_deadline_plus_the_close_bound() -> None:
    # Creation is slow, the command hangs, the close hangs: T=0.6 s, close_timeout=0.5 s.
    factory = FakeSandboxFactory(create_latency=0.2, exec_hangs=True, close_latency=math.inf)
    start = anyio.current_time()
    scored = await single(runs(), factory, reward=one, options=AgentOptions(rollout_timeout=0.6))
    elapsed = anyio.current_time() - start
    assert scored.category == "agent_timeout"
    # Unbounded, the hanging close would never return; the slack over T + close_timeout is
    # generous for a loaded 2-core CI machine.
    assert scored.seconds <= 0.6 + 0.5 + 1.0 and elapsed <= 0.6 + 0.5 + 2.0


async def test_a_harness_bug_is_contained_as_infra() -> None:
    class Exploding:
        """A tokenizer whose template rendering breaks on the second turn."""

        def __init__(self) -> None:
            self.renders = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(TOKENIZER, name)

        def __len__(self) -> int:
            return len(TOKENIZER)

        def apply_chat_template(self, *args: Any, **kwargs: Any) -> str:
            self.renders += 1
            if self.renders > 1:
                raise LookupError("template variable 'tools' undefined")
            return TOKENIZER.apply_chat_template(*args, **kwargs)

    async with world(runs()) as (client, manager, _):
        scored = await run_rollout(
            client,
            PROMPT,
            TOOLS,
            setup=RolloutSetup(
                tokenizer=Exploding(), sandboxes=manager, reward=one, failure_policy=ONCE
            ),
        )
        assert manager.task_ids() == []
    assert scored.category == "infra" and scored.failure is not None
    assert scored.failure.detail["exception"] == "LookupError"
    assert scored.reward == 0.0


# ------------------------------------------------------------------ groups and policies


def reward_failing_for(*task_ids: str) -> Any:
    async def reward(result: AgentResult, ctx: ToolContext) -> float:
        await ctx.terminal("true")
        if ctx.task_id in task_ids:
            raise RuntimeError(f"verifier crashed on {ctx.task_id}")
        return 1.0

    return reward


async def test_a_failing_rollout_never_touches_its_siblings() -> None:
    async with world(runs()) as (client, manager, _):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=4,
            task_ids=["r0", "r1", "r2", "r3"],
            setup=RolloutSetup(
                reward=reward_failing_for("r1"),
                tokenizer=TOKENIZER,
                sandboxes=manager,
                failure_policy=FailurePolicy(on_failure="zero"),
            ),
        )
    assert group.outcome == "zeroed" and group.rewards == [1.0, 0.0, 1.0, 1.0]
    assert [r.category for r in group.rollouts] == [None, "verifier", None, None]
    batch = group.to_scored_data_group()
    assert batch["overrides"][0] == {} and batch["overrides"][1]["failure"]["category"] == (
        "verifier"
    )
    assert "verifier crashed on r1" in batch["overrides"][1]["failure"]["message"]


async def test_retry_runs_a_failed_rollout_again_on_a_fresh_sandbox() -> None:
    factory = FakeSandboxFactory(exec_script={"*": "ok"})
    async with world(runs(), factory) as (client, manager, _):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=3,
            task_ids=["r0", "r1", "r2"],
            setup=RolloutSetup(
                reward=reward_failing_for("r2"),  # only the first attempt's task id fails
                tokenizer=TOKENIZER,
                sandboxes=manager,
                failure_policy=QUICK,
            ),
        )
        assert manager.task_ids() == []
    assert group.outcome == "retried" and group.rewards == [1.0, 1.0, 1.0]
    assert [r.task_id for r in group.rollouts] == ["r0", "r1", "r2-attempt2"]
    assert group.rollouts[2].attempt == 2 and group.rollouts[2].failure is None
    assert [(r.task_id, r.category) for r in group.retried] == [("r2", "verifier")]
    assert group.failure_counts() == {"verifier": 1}
    created = [s.task_id for s in factory.created]
    assert sorted(created) == ["r0", "r1", "r2", "r2-attempt2"]  # a new sandbox for the retry
    assert all(s.closed for s in factory.created)


async def test_a_retry_starts_as_soon_as_its_failure_is_seen() -> None:
    # r1's reward waits for r0's retry to be scored: if retries waited for the group, it would
    # wait forever (bounded here) and the group would not come out clean.
    retry_scored = anyio.Event()

    async def reward(result: AgentResult, ctx: ToolContext) -> float:
        if ctx.task_id == "r0":
            raise RuntimeError("verifier crashed on r0")
        if ctx.task_id == "r0-attempt2":
            retry_scored.set()
        if ctx.task_id == "r1":
            with anyio.fail_after(30):
                await retry_scored.wait()
        return 1.0

    async with world(runs()) as (client, manager, _):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=2,
            task_ids=["r0", "r1"],
            setup=RolloutSetup(
                reward=reward, tokenizer=TOKENIZER, sandboxes=manager, failure_policy=QUICK
            ),
        )
    assert group.outcome == "retried" and group.rewards == [1.0, 1.0]
    assert [r.task_id for r in group.rollouts] == ["r0-attempt2", "r1"]


async def test_retries_that_run_out_mask_the_whole_group() -> None:
    async with world(runs()) as (client, manager, _):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=3,
            task_ids=["r0", "r1", "r2"],
            setup=RolloutSetup(
                reward=reward_failing_for("r0", "r0-attempt2", "r0-attempt3"),
                tokenizer=TOKENIZER,
                sandboxes=manager,
                failure_policy=QUICK,
            ),
        )
    assert group.masked and group.rollouts[0].attempt == 3
    assert group.failure_counts() == {"verifier": 3}
    with pytest.raises(ValueError, match="a masked group has no training data"):
        group.to_scored_data_group()


async def test_mask_drops_the_group_without_retrying() -> None:
    factory = FakeSandboxFactory(exec_script={"*": "ok"})
    async with world(runs(), factory) as (client, manager, _):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=2,
            task_ids=["r0", "r1"],
            setup=RolloutSetup(
                reward=reward_failing_for("r1"),
                tokenizer=TOKENIZER,
                sandboxes=manager,
                failure_policy=FailurePolicy(on_failure="mask"),
            ),
        )
    assert group.outcome == "masked" and group.retried == ()
    assert len(factory.created) == 2


async def test_timeouts_are_kept_at_zero_or_masked_on_request() -> None:
    def slow_for_one(command: str) -> float:
        return 60.0 if "slow" in command else 0.0  # (the terminal wraps the command)

    openers: list[int] = []  # the rollouts' first requests, in arrival order

    def policy(request: PolicyRequest) -> str:
        if any(m.get("role") == "tool" for m in request.messages):
            return "Done."
        openers.append(request.request_number)
        return tool_call("terminal", {"command": "slow" if len(openers) == 1 else "fast"})

    # "zero": a timeout is the policy's own outcome (kept, reward 0), so the group is "ok".
    for on_timeout, outcome in (("zero", "ok"), ("mask", "masked")):
        openers.clear()
        factory = FakeSandboxFactory(latency=slow_for_one, exec_script={"*": "ok"})
        async with world(policy, factory) as (client, manager, _):
            group = await run_group(
                client,
                PROMPT,
                TOOLS,
                size=2,
                options=AgentOptions(rollout_timeout=0.5),
                setup=RolloutSetup(
                    reward=one,
                    tokenizer=TOKENIZER,
                    sandboxes=manager,
                    failure_policy=FailurePolicy(on_timeout=on_timeout),
                ),
            )
        assert sorted(r.category or "" for r in group.rollouts) == ["", "agent_timeout"]
        assert group.outcome == outcome and group.retried == ()  # timeouts are not retried
        assert sorted(group.rewards) == [0.0, 1.0]


async def test_a_dead_server_is_raised_after_the_retries() -> None:
    async with world(runs(), fault_plan=lambda n, b: Fault.http_error(503)) as (
        client,
        manager,
        scripted,
    ):
        with pytest.raises(InferenceError, match="every rollout of the group failed before"):
            await run_group(
                client,
                PROMPT,
                TOOLS,
                size=2,
                setup=RolloutSetup(tokenizer=TOKENIZER, sandboxes=manager, failure_policy=QUICK),
            )
    assert {r.number for r in scripted.requests} >= set(range(1, 7))  # 2 rollouts x 3 attempts


async def test_cancellation_propagates_and_starts_no_retry() -> None:
    factory = FakeSandboxFactory(exec_hangs=True)
    async with world(runs(), factory) as (client, manager, _):
        with anyio.move_on_after(0.5) as scope:
            await run_group(
                client,
                PROMPT,
                TOOLS,
                size=3,
                setup=RolloutSetup(tokenizer=TOKENIZER, sandboxes=manager, failure_policy=QUICK),
            )
        assert scope.cancelled_caught and manager.task_ids() == []
    assert len(factory.created) == 3 and all(s.closed for s in factory.created)


# ------------------------------------------------------------------ pure parts


def test_severity_and_classification() -> None:
    tool = RolloutFailure.of("tool", "a tool failed")
    infra = classify_exception(SandboxError("gone", task_id="t"), source="reward")
    assert infra.category == "infra" and infra.detail["source"] == "sandbox"
    assert worst_failure([tool, None, infra]) is infra and worst_failure([None]) is None
    verifier = classify_exception(ValueError("x"), source="reward")
    assert verifier.category == "verifier" and verifier.retryable and not tool.retryable
    secret = RolloutFailure.of("infra", "key sk-abcdefghijklmnopqrstuvwx", url="http://u:pw@h/")
    assert "sk-abc" not in secret.message and secret.detail["url"] == "http://[REDACTED]@h/"


def test_group_outcome_is_never_mixed() -> None:
    def rollout(category: str | None) -> ScoredRollout:
        failure = RolloutFailure.of(category, "x") if category else None  # type: ignore[arg-type]
        return ScoredRollout("t", AgentResult([]), 0.0, [], [], [], True, 0.0, None, None, failure)

    ok, tool, infra, slow = (
        rollout(None),
        rollout("tool"),
        rollout("infra"),
        rollout("agent_timeout"),
    )
    retry, zero, mask = FailurePolicy(), FailurePolicy(on_failure="zero"), FailurePolicy("mask")
    assert _outcome([ok, tool], [], retry) == "ok"
    assert _outcome([ok, tool], [infra], retry) == "retried"
    assert _outcome([ok, infra], [infra], retry) == "masked"  # retries ran out
    assert _outcome([ok, infra], [], mask) == "masked"
    assert _outcome([ok, infra], [], zero) == "zeroed"
    assert _outcome([ok, slow], [], zero) == "ok"  # a kept timeout is the policy's outcome
    assert _outcome([ok, slow], [], FailurePolicy(on_timeout="mask")) == "masked"
    with pytest.raises(ValueError, match="max_attempts must be >= 1, got 0"):
        FailurePolicy(max_attempts=0)
    with pytest.raises(ValueError, match="on_failure must be 'retry', 'mask' or 'zero'"):
        FailurePolicy(on_failure="skip")  # type: ignore[arg-type]


async def test_fake_sandbox_faults() -> None:
    dying = FakeSandbox(dies_after_execs=1, exec_script={"*": "ok"})
    assert (await dying.exec("a")).stdout == "ok"
    with pytest.raises(SandboxError, match="the sandbox died"):
        await dying.exec("b")
    slow: Sandbox = FakeSandbox(close_latency=math.inf)
    with anyio.move_on_after(0.05):
        await slow.aclose()
    assert slow.closed  # type: ignore[attr-defined]
