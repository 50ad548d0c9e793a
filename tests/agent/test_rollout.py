"""run_group / run_rollout: loop -> reward on the rollout's own sandbox -> release -> rows."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
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
from hermes_async.errors import ConfigError, InferenceError, UnknownParserError
from hermes_async.inference.chat import ChatClient
from hermes_async.inference.generate import SamplingParams, VLLMGenerateClient
from hermes_async.inference.trajectory import MASK_ID
from hermes_async.testing import Fault, PolicyRequest, ScriptedModelServer, open_app_endpoint
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox import local as local_module
from hermes_async.tools.sandbox.local import ISOLATION_ENV, find_sandbox_processes, local_factory
from hermes_async.tools.sandbox.manager import SandboxManager, current_sandbox_manager
from tests.support import TOKENIZER, RecordingFactory, tool_call

pytestmark = pytest.mark.anyio

TOOLS = get_tool_definitions(["terminal", "file"])
PROMPT = [{"role": "user", "content": "Put 42 in ~/answer.txt"}]


def writer(request: PolicyRequest) -> str:
    """Write the answer with a tool, then say so."""
    if any(m.get("role") == "tool" for m in request.messages):
        return "Done: the answer is in ~/answer.txt."
    return tool_call("write_file", {"path": "~/answer.txt", "content": "42\n"})


async def check_answer(result: AgentResult, ctx: ToolContext) -> float:
    out = await ctx.terminal("cat ~/answer.txt")
    return 1.0 if str(out.get("output", "")).strip() == "42" else 0.0


@asynccontextmanager
async def token_client(policy: Any, **kw: Any) -> AsyncIterator[VLLMGenerateClient]:
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER, **kw)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        client.scripted = server  # type: ignore[attr-defined]
        yield client


def assert_aligned(rollout: ScoredRollout) -> None:
    assert len(rollout.tokens) == len(rollout.masks) == len(rollout.logprobs) > 0
    for token, mask, logprob in zip(rollout.tokens, rollout.masks, rollout.logprobs, strict=True):
        if mask == MASK_ID:
            assert logprob == 1.0
        else:
            assert mask == token and logprob <= 0.0


async def test_group_on_local_sandboxes_rewarded_through_tool_context(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with (
        token_client(writer) as client,
        SandboxManager(factory) as manager,
    ):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=4,
            options=AgentOptions(max_tokens=256),
            task_ids=[f"r{i}" for i in range(4)],
            setup=RolloutSetup(reward=check_answer, tokenizer=TOKENIZER, sandboxes=manager),
        )
        assert manager.task_ids() == []  # each rollout released its own sandbox
    assert group.rewards == [1.0] * 4 and group.trainable
    assert [r.task_id for r in group.rollouts] == ["r0", "r1", "r2", "r3"]
    assert len(factory.created) == 4 and factory.leftovers() == []
    served = {tuple(r.completion_ids): r.logprobs for r in client.scripted.requests}  # type: ignore[attr-defined]
    for rollout in group.rollouts:
        assert_aligned(rollout)
        assert rollout.error is None and rollout.reward_error is None and rollout.seconds > 0
        assert rollout.messages is rollout.result.messages and len(rollout.messages) == 4
        # Every trained run of ids is exactly what the server sampled, with its logprobs.
        runs: list[list[int]] = []
        for previous, mask in zip([MASK_ID, *rollout.masks], rollout.masks, strict=False):
            if mask != MASK_ID:
                if previous == MASK_ID:
                    runs.append([])
                runs[-1].append(mask)
        assert len(runs) == 2 and all(tuple(run) in served for run in runs)
    assert PROMPT == [{"role": "user", "content": "Put 42 in ~/answer.txt"}]  # copied
    batch = group.to_scored_data_group({"temperature": 1.0})
    assert batch["scores"] == [1.0] * 4 and batch["generation_params"] == {"temperature": 1.0}
    for key in ("tokens", "masks", "inference_logprobs", "messages"):
        assert len(batch[key]) == 4
    for tokens, masks, logprobs in zip(
        batch["tokens"], batch["masks"], batch["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)


async def test_without_a_manager_a_private_local_one_lives_for_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the private manager's sandboxes go
    seen: list[object] = []

    async def reward(result: AgentResult, ctx: ToolContext) -> float:
        seen.append(current_sandbox_manager())  # made current, for reference-style code
        assert ctx.manager is seen[-1]
        return await check_answer(result, ctx)

    assert current_sandbox_manager() is None
    async with token_client(writer) as client:
        group = await run_group(
            client, PROMPT, TOOLS, size=2, setup=RolloutSetup(reward=reward, tokenizer=TOKENIZER)
        )
        single = await run_rollout(
            client, PROMPT, TOOLS, setup=RolloutSetup(reward=reward, tokenizer=TOKENIZER)
        )
    assert group.rewards == [1.0, 1.0] and single.reward == 1.0
    assert seen[0] is seen[1] and seen[2] is not seen[0]  # one per call, shared by the group
    assert all(isinstance(m, SandboxManager) and m.task_ids() == [] for m in seen)
    assert current_sandbox_manager() is None
    assert not [p for p in tmp_path.rglob("*") if p.is_dir() and "answer.txt" in os.listdir(p)]


async def test_without_namespaces_the_default_is_a_clear_error_before_any_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.setattr(local_module, "namespace_support", lambda: "bwrap not found on PATH")
    server = ScriptedModelServer(writer, tokenizer=TOKENIZER)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        for run in (
            lambda: run_group(
                client, PROMPT, TOOLS, size=2, setup=RolloutSetup(tokenizer=TOKENIZER)
            ),
            lambda: run_rollout(client, PROMPT, TOOLS, setup=RolloutSetup(tokenizer=TOKENIZER)),
        ):
            with pytest.raises(ConfigError, match=r"cannot be isolated.*isolation='process'"):
                await run()
    assert server.requests == []  # refused before the first model request


async def test_phase1_placeholder_rows_are_marked_untrainable(tmp_path: Path) -> None:
    server = ScriptedModelServer(writer)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url, transport=transport) as client,
        SandboxManager(local_factory(str(tmp_path))) as manager,
    ):
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=2,
            setup=RolloutSetup(reward=check_answer, sandboxes=manager),
        )
        encoded = await run_rollout(
            client,
            PROMPT,
            TOOLS,
            setup=RolloutSetup(
                sandboxes=manager, placeholder_encode=lambda text: [len(text), 7, 8]
            ),
        )
    assert group.rewards == [1.0, 1.0] and not group.trainable
    for rollout in group.rollouts:
        assert rollout.result.managed_state is None and not rollout.trainable
        text = "\n".join(m["content"] for m in rollout.messages if m.get("content"))
        assert rollout.tokens == TOKENIZER.encode(text)  # the joined contents, re-tokenized
        assert rollout.masks == [MASK_ID, *rollout.tokens[1:]]
        assert set(rollout.logprobs) == {1.0}
    assert encoded.reward == 0.0  # no reward given
    assert encoded.tokens[1:] == [7, 8] and encoded.masks == [MASK_ID, 7, 8]


async def test_failing_reward_scores_zero_with_a_redacted_error(tmp_path: Path) -> None:
    async def broken(result: AgentResult, ctx: ToolContext) -> float:
        await ctx.terminal("true")
        raise RuntimeError("verifier crashed, key sk-abcdefghijklmnopqrstuvwx")

    async with token_client(writer) as client, SandboxManager(local_factory(str(tmp_path))) as m:
        group = await run_group(
            client,
            PROMPT,
            TOOLS,
            size=2,
            setup=RolloutSetup(
                reward=broken,
                tokenizer=TOKENIZER,
                sandboxes=m,
                failure_policy=FailurePolicy(on_failure="zero"),
            ),
        )
        assert m.task_ids() == []
    assert group.outcome == "zeroed"
    for rollout in group.rollouts:
        assert rollout.category == "verifier"
        assert rollout.reward == 0.0 and rollout.error == rollout.reward_error
        assert rollout.reward_error is not None
        assert rollout.reward_error.startswith("reward failed: RuntimeError: verifier crashed")
        assert "sk-abc" not in rollout.reward_error and "[REDACTED]" in rollout.reward_error
        assert_aligned(rollout)  # the rows are still built


async def test_seeded_group_gives_each_rollout_its_own_seed() -> None:
    async with token_client(lambda r: "hello") as client:
        options = AgentOptions(sampling=SamplingParams(seed=100), max_tokens=8)
        await run_group(
            client, PROMPT, TOOLS, size=3, options=options, setup=RolloutSetup(tokenizer=TOKENIZER)
        )
        seeds = sorted(
            r.body["sampling_params"]["seed"]
            for r in client.scripted.requests  # type: ignore[attr-defined]
        )
    assert seeds == [100, 101, 102]


async def test_dead_server_fails_the_group_but_not_a_single_rollout(tmp_path: Path) -> None:
    async with (
        token_client(writer, faults={n: Fault.http_error(400) for n in range(1, 10)}) as client,
        SandboxManager(local_factory(str(tmp_path))) as manager,
    ):
        with pytest.raises(InferenceError, match="every rollout of the group failed before"):
            await run_group(
                client,
                PROMPT,
                TOOLS,
                size=2,
                setup=RolloutSetup(tokenizer=TOKENIZER, sandboxes=manager),
            )
        single = await run_rollout(
            client, PROMPT, TOOLS, setup=RolloutSetup(tokenizer=TOKENIZER, sandboxes=manager)
        )
    assert single.error is not None and single.error.startswith("model call failed")
    assert single.reward == 0.0 and single.tokens  # the prompt, masked
    assert set(single.masks) == {MASK_ID}


def answer_first_sleep_others() -> Any:
    def policy(request: PolicyRequest) -> str:
        if request.request_number == 1:
            return "done"
        if any(m.get("role") == "tool" for m in request.messages):
            return "done"
        return tool_call("terminal", {"command": "sleep 60"})

    return policy


async def test_a_raising_rollout_cancels_its_siblings_and_surfaces_unwrapped(
    tmp_path: Path,
) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    finished: list[str] = []

    async def wait_for_siblings(result: AgentResult, ctx: ToolContext) -> float:
        # The rollout that answered at once finishes only when both siblings run their tool.
        while len(factory.created) < 2 or not all(
            find_sandbox_processes(s.sandbox_id) for s in factory.created
        ):
            await anyio.sleep(0.02)
        return 1.0

    def explode(rollout: ScoredRollout) -> None:
        finished.append(rollout.task_id)
        raise LookupError(f"bookkeeping failed for {rollout.task_id}")

    async with (
        token_client(answer_first_sleep_others()) as client,
        SandboxManager(factory) as manager,
    ):
        start = anyio.current_time()
        with pytest.raises(LookupError, match="bookkeeping failed for"):
            await run_group(
                client,
                PROMPT,
                TOOLS,
                size=3,
                on_rollout=explode,
                setup=RolloutSetup(
                    reward=wait_for_siblings, tokenizer=TOKENIZER, sandboxes=manager
                ),
            )
        assert anyio.current_time() - start < 30  # the sleeping siblings were cancelled
        assert manager.task_ids() == []
    assert len(finished) == 1 and len(factory.created) == 2
    assert factory.leftovers() == []
    assert all(find_sandbox_processes(s.sandbox_id) == [] for s in factory.created)


async def test_cancelling_a_group_releases_every_sandbox(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with (
        token_client(lambda r: tool_call("terminal", {"command": "sleep 60"})) as client,
        SandboxManager(factory) as manager,
    ):
        with anyio.move_on_after(60) as outer:
            async with anyio.create_task_group() as tg:

                async def group() -> None:
                    await run_group(
                        client,
                        PROMPT,
                        TOOLS,
                        size=3,
                        setup=RolloutSetup(tokenizer=TOKENIZER, sandboxes=manager),
                    )

                tg.start_soon(group)
                while len(factory.created) < 3 or not all(
                    find_sandbox_processes(s.sandbox_id) for s in factory.created
                ):
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel(reason="test: stop the group")
        assert not outer.cancelled_caught
        assert manager.task_ids() == []
    assert factory.leftovers() == []


async def test_bad_arguments_are_reported_before_anything_runs() -> None:
    async with token_client(writer) as client:
        with pytest.raises(ValueError, match="size must be >= 1, got 0"):
            await run_group(client, PROMPT, TOOLS, size=0, setup=RolloutSetup(tokenizer=TOKENIZER))
        with pytest.raises(ValueError, match="got 1 task_ids for size=2"):
            await run_group(
                client,
                PROMPT,
                TOOLS,
                size=2,
                task_ids=["a"],
                setup=RolloutSetup(tokenizer=TOKENIZER),
            )
        with pytest.raises(ValueError, match="needs a tokenizer"):
            await run_rollout(client, PROMPT, TOOLS)
        with pytest.raises(TypeError, match="tools must be a ToolDefinitions"):
            await run_rollout(client, PROMPT, "terminal", setup=RolloutSetup(tokenizer=TOKENIZER))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        AgentOptions(max_turns=0)
    with pytest.raises(TypeError, match=r"max_turns must be an int, got 2\.5"):
        AgentOptions(max_turns=2.5)  # type: ignore[arg-type]  # before: accepted
    with pytest.raises(TypeError, match="max_resumes must be an int, got True"):
        AgentOptions(max_resumes=True)


async def test_mistakes_every_rollout_would_make_are_refused_before_any_runs() -> None:
    # Before: each of these started the batch; every rollout failed alone (an infra or
    # verifier failure), was retried, and the group was masked.
    def reward_sync(result: object, ctx: object) -> float:
        return 1.0

    async with token_client(writer) as client:
        for bad, error, match in [
            ({"size": True}, TypeError, "size must be an int >= 1, got True"),
            ({"size": 2.0}, TypeError, "size must be an int >= 1, got 2.0"),
            ({"messages": "Write it."}, TypeError, "messages must be a list of chat messages"),
            ({"messages": []}, ValueError, "messages is empty"),
            ({"messages": [{"content": "x"}]}, ValueError, r"messages\[0\] has no 'role'"),
            ({"messages": ["hi"]}, TypeError, r"messages\[0\] must be a mapping"),
            ({"task_ids": ["a", "a"]}, ValueError, r"task_ids must be distinct; repeated: \['a'\]"),
            ({"options": {"max_turns": 2}}, TypeError, "options must be an AgentOptions, got dict"),
            (
                {"options": AgentOptions(tool_call_parser="nope")},
                UnknownParserError,
                "unknown tool-call parser 'nope'",
            ),
        ]:
            arguments: dict[str, Any] = {"messages": PROMPT, "size": 2, **bad}
            with pytest.raises(error, match=match):
                await run_group(
                    client,
                    arguments.pop("messages"),
                    TOOLS,
                    setup=RolloutSetup(tokenizer=TOKENIZER),
                    **arguments,
                )
        with pytest.raises(ValueError, match="messages is empty"):
            await run_rollout(client, [], TOOLS, setup=RolloutSetup(tokenizer=TOKENIZER))
        with pytest.raises(TypeError, match="setup must be a RolloutSetup, got dict"):
            await run_rollout(client, PROMPT, TOOLS, setup={"tokenizer": TOKENIZER})  # type: ignore[arg-type]
        for reward in (3, "high"):
            with pytest.raises(TypeError, match="reward must be an async function"):
                RolloutSetup(reward=reward)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="failure_policy must be a FailurePolicy, got str"):
            RolloutSetup(failure_policy="retry")  # type: ignore[arg-type]
        # A sync reward cannot be told apart from a wrapper until it is called: the rollout
        # reports it in words (before: "object float can't be used in 'await' expression").
        scored = await run_rollout(
            client, PROMPT, TOOLS, setup=RolloutSetup(tokenizer=TOKENIZER, reward=reward_sync)
        )  # type: ignore[arg-type]
        assert scored.failure is not None and scored.failure.category == "verifier"
        assert "returned float, not an awaitable" in scored.failure.message
    with pytest.raises(ValueError, match="rollout_timeout must be > 0 seconds or None"):
        AgentOptions(rollout_timeout=0)
