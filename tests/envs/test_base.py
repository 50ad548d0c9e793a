"""HermesAgentBaseEnv: groups, phases, cleanup on failure and cancellation, eval, logging."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio
import pytest
from atroposlib.envs.base import BaseEnv

from hermes_async.agent_loop import AgentResult
from hermes_async.envs._servers import ServerUnreachableError
from hermes_async.envs.base import HermesAgentBaseEnv, HermesAgentEnvConfig
from hermes_async.envs.terminal_test import (
    EVAL_TASKS,
    TRAIN_TASKS,
    TerminalTestEnv,
    terminal_test_oracle,
)
from hermes_async.errors import ConfigError
from hermes_async.testing.scripted_server import PolicyRequest
from hermes_async.tool_context import ToolContext
from hermes_async.tools.sandbox.local import find_sandbox_processes
from tests.envs.helpers import env_config, ready_env, serve_policy, server_config
from tests.support import RecordingFactory, tool_call

pytestmark = pytest.mark.anyio

GREETING = TRAIN_TASKS[0]


def test_config_keeps_reference_fields_and_defaults() -> None:
    config = HermesAgentEnvConfig()
    assert config.enabled_toolsets is None and config.disabled_toolsets is None
    assert config.distribution is None and config.system_prompt is None
    assert config.max_agent_turns == 30 and config.agent_temperature == 1.0
    assert config.terminal_backend == "local"
    assert (config.terminal_timeout, config.terminal_lifetime) == (120, 3600)
    assert (config.dataset_name, config.dataset_split, config.prompt_field) == (
        None,
        "train",
        "prompt",
    )
    assert config.tool_pool_size == 128 and config.tool_call_parser == "hermes"
    assert (config.default_result_size_chars, config.turn_budget_chars) == (100_000, 200_000)
    assert config.preview_size_chars == 1_500 and config.tool_result_overrides is None
    assert config.extra_body is None
    assert config.tokenizer_name == "qwen-offline"  # the offline built-in, not a hub name
    budget = config.build_budget_config()
    assert (budget.default_result_size, budget.turn_budget, budget.preview_size) == (
        100_000,
        200_000,
        1_500,
    )


async def test_phase2_group_carries_aligned_tokens_masks_logprobs(tmp_path: Path) -> None:
    async with serve_policy(terminal_test_oracle()) as (url, server):
        env = TerminalTestEnv(env_config(tmp_path, tool_pool_size=7), [server_config(url)])
        assert env.phase == 2 and env.limits.tool_calls.total == 7
        await env.setup()
        group, backlog = await env.collect_trajectories(GREETING)
    assert backlog == [] and group is not None
    assert group["scores"] == [1.0, 1.0, 1.0]
    assert len(group["messages"]) == 3
    served: dict[tuple[int, ...], list[list[float]]] = {}
    for request in server.requests:
        served.setdefault(tuple(request.completion_ids), []).append(request.logprobs)
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        runs: list[tuple[list[int], list[float]]] = []
        previous_masked = True
        for tok, mask, lp in zip(tokens, masks, logprobs, strict=True):
            if mask == -100:
                assert lp == 1.0
                previous_masked = True
                continue
            assert mask == tok and lp <= 0.0
            if previous_masked:
                runs.append(([], []))
            runs[-1][0].append(tok)
            runs[-1][1].append(lp)
            previous_masked = False
        # One unmasked run per turn, each exactly the ids and logprobs the server sent.
        assert len(runs) == 3
        for ids, lps in runs:
            assert lps in served[tuple(ids)]
    assert group["inference_logprobs"] is not None


async def test_phase1_uses_placeholder_tokens(tmp_path: Path) -> None:
    async with serve_policy(terminal_test_oracle()) as (url, _):
        env = TerminalTestEnv(env_config(tmp_path, group_size=2), [server_config(url, "openai")])
        assert env.phase == 1
        await env.setup()
        group, _ = await env.collect_trajectories(GREETING)
    assert group is not None and group["scores"] == [1.0, 1.0]
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs) > 1
        assert masks[0] == -100 and masks[1:] == tokens[1:]
        assert set(logprobs) == {1.0}


@pytest.mark.parametrize("endpoint", ["atropos", "sglang"])
async def test_token_endpoint_kinds(tmp_path: Path, endpoint: str) -> None:
    async with serve_policy(terminal_test_oracle()) as (url, server):
        env = TerminalTestEnv(
            env_config(tmp_path, group_size=1, token_endpoint=endpoint), [server_config(url)]
        )
        await env.setup()
        group, _ = await env.collect_trajectories(GREETING)
    assert group is not None and group["scores"] == [1.0]
    assert {r.protocol for r in server.requests} == {endpoint}


class RaisingRewardEnv(TerminalTestEnv):
    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        await ctx.terminal("true")  # the sandbox exists when the reward fails
        raise RuntimeError("reward exploded with sk-abcdefghijklmnopqrstuvwx")


async def test_reward_that_raises_scores_zero_and_leaves_no_sandbox(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with serve_policy(terminal_test_oracle()) as (url, _):
        config = env_config(tmp_path, failure_policy="zero")
        env = await ready_env(RaisingRewardEnv, config, url, factory)
        async with env.open_sandboxes() as manager:
            group, _ = await env.collect_trajectories(GREETING)
            # Released by each rollout itself, not only at the manager's exit.
            assert manager.statistics().active == 0
    assert group is not None and group["scores"] == [0.0, 0.0, 0.0]
    assert [o["failure"]["category"] for o in group["overrides"]] == ["verifier"] * 3
    assert len(factory.created) == 3 and factory.leftovers() == []
    errors = [s.error for s in env.rollout_summaries]
    assert all(e is not None and "reward exploded" in e for e in errors)
    assert all("sk-abc" not in str(e) for e in errors)  # redacted
    assert [s.category for s in env.rollout_summaries] == ["verifier"] * 3


async def test_reward_that_always_raises_is_retried_then_its_group_masked(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with serve_policy(terminal_test_oracle()) as (url, _):
        env = await ready_env(
            RaisingRewardEnv, env_config(tmp_path, failure_retry_backoff=0.01), url, factory
        )
        group, _ = await env.collect_trajectories(GREETING)
    assert group is None  # atroposlib's "no group": never a partial one
    assert len(factory.created) == 9 and factory.leftovers() == []  # 3 x 3 fresh sandboxes
    metrics = env.failure_tally.metrics()
    assert metrics["train/failures/verifier"] == 9.0 and metrics["train/groups_masked"] == 1.0
    assert metrics["train/failures/infra"] == 0.0


def sleeper_policy(request: PolicyRequest) -> str:
    if any(m.get("role") == "tool" for m in request.messages):
        return "done"
    return tool_call("terminal", {"command": "sleep 60"})


async def test_group_cancelled_mid_rollout_leaves_no_sandbox(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with serve_policy(sleeper_policy) as (url, _):
        env = await ready_env(TerminalTestEnv, env_config(tmp_path), url, factory)
        async with env.open_sandboxes() as manager:
            with anyio.move_on_after(60) as outer:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(env.collect_trajectories, GREETING)
                    while len(factory.created) < 3 or not all(
                        find_sandbox_processes(s.sandbox_id) for s in factory.created
                    ):
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()
            assert not outer.cancelled_caught
            assert manager.statistics().active == 0
    assert factory.leftovers() == []
    assert all(find_sandbox_processes(s.sandbox_id) == [] for s in factory.created)


class FailingPromptEnv(TerminalTestEnv):
    calls = 0

    def format_prompt(self, item: dict[str, str]) -> str:
        type(self).calls += 1
        if type(self).calls == 2:
            raise ValueError("bad item for group 2")
        return item["prompt"]


async def test_failing_prompt_fails_its_group_and_leaves_no_sandbox(tmp_path: Path) -> None:
    # format_prompt runs once per group (the group's rollouts share one prompt).
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with serve_policy(terminal_test_oracle()) as (url, _):
        env = await ready_env(FailingPromptEnv, env_config(tmp_path), url, factory)
        group, _ = await env.collect_trajectories(GREETING)
        assert group is not None and group["scores"] == [1.0, 1.0, 1.0]
        with pytest.raises(ValueError, match="bad item for group 2"):
            await env.collect_trajectories(GREETING)
    assert len(factory.created) == 3 and factory.leftovers() == []


def first_answers_others_sleep() -> Any:
    served = 0

    def policy(request: PolicyRequest) -> str:
        nonlocal served
        served += 1
        return "done" if served == 1 else sleeper_policy(request)

    return policy


async def test_failing_rollout_cancels_siblings_and_propagates(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with serve_policy(first_answers_others_sleep()) as (url, _):
        env = await ready_env(TerminalTestEnv, env_config(tmp_path), url, factory)

        def explode(summary: Any) -> None:  # runs inside the rollout that just finished
            raise ValueError(f"progress display broke on {summary.label}")

        env.on_rollout = explode
        start = anyio.current_time()
        with pytest.raises(ValueError, match="progress display broke on greeting"):
            await env.collect_trajectories(GREETING)
        assert anyio.current_time() - start < 30  # the sleeping siblings were cancelled
    assert factory.leftovers() == []
    assert all(find_sandbox_processes(s.sandbox_id) == [] for s in factory.created)


async def test_unreachable_server_is_a_clear_error_within_bounded_time(tmp_path: Path) -> None:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    env = TerminalTestEnv(
        env_config(tmp_path, server_connect_timeout=1.0),
        [server_config(f"http://127.0.0.1:{port}")],
    )
    await env.setup()
    start = anyio.current_time()
    with pytest.raises(ServerUnreachableError, match=r"did not answer within 1 s"):
        await env.collect_trajectories(GREETING)
    assert anyio.current_time() - start < 10


class BufferingEnv(TerminalTestEnv):
    """Appends every reward to a buffer, unconditionally (the reference pitfall)."""

    train_buffers = (*TerminalTestEnv.train_buffers, "my_reward_buffer")

    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        reward = await super().compute_reward(item, result, ctx)
        self.my_reward_buffer.append(reward)
        return reward


async def test_eval_helper_runs_agent_loop_bounded_and_keeps_buffers_clean(
    tmp_path: Path,
) -> None:
    items = [*TRAIN_TASKS, *EVAL_TASKS]
    async with serve_policy(terminal_test_oracle(), response_delay_seconds=0.05) as (url, server):
        env = BufferingEnv(env_config(tmp_path), [server_config(url)])
        await env.setup()
        env.my_reward_buffer = [0.25]
        active = peak = 0

        original = env._run_rollout

        async def tracking(*args: Any, **kwargs: Any) -> Any:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            try:
                return await original(*args, **kwargs)
            finally:
                active -= 1

        env._run_rollout = tracking  # type: ignore[method-assign]
        report = await env.run_agent_eval(items, concurrency=2, task_name="t")
    assert peak == 2
    assert [s.reward for s in report.rollouts] == [1.0] * 4
    assert all(s.evaluating and s.turns == 3 for s in report.rollouts)
    assert report.metrics["eval/mean_reward"] == 1.0 and report.metrics["eval/num_samples"] == 4
    assert env.my_reward_buffer == [0.25]  # eval rewards rolled back
    assert env.reward_buffer == []  # TerminalTestEnv checks is_evaluating itself
    # Every generation (token_endpoint="auto" adds one probe that generates nothing).
    generations = [r for r in server.requests if r.completion_ids]
    assert len(generations) == 12 and len(server.requests) <= 13
    assert all(r.body["sampling_params"]["temperature"] == 0.0 for r in generations)
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    assert metrics["results"]["all"]["eval/accuracy"] == 1.0
    samples = (tmp_path / "evals" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 4 and "[TOOL CALL] terminal" in json.loads(samples[0])["trajectory"]


class UnlistedBufferEnv(BufferingEnv):
    train_buffers = TerminalTestEnv.train_buffers  # my_reward_buffer not listed


class TypoBufferEnv(TerminalTestEnv):
    train_buffers = ("reward_bufer",)


async def test_only_listed_train_buffers_are_rolled_back(tmp_path: Path) -> None:
    async with serve_policy(terminal_test_oracle()) as (url, _):
        env = UnlistedBufferEnv(env_config(tmp_path), [server_config(url)])
        await env.setup()
        env.my_reward_buffer = []
        env.results_buffer = ["kept"]  # a list named *_buffer that is no metric: untouched
        await env.run_agent_eval(EVAL_TASKS, log=False)
        assert env.my_reward_buffer == [1.0]  # not listed: kept (no name heuristic)
        assert env.results_buffer == ["kept"]
        typo = TypoBufferEnv(env_config(tmp_path), [server_config(url)])
        await typo.setup()
        with pytest.raises(ConfigError, match=r"train_buffers names 'reward_bufer'.*no such"):
            await typo.run_agent_eval(EVAL_TASKS, log=False)


async def test_terminal_test_evaluate_uses_tools(tmp_path: Path) -> None:
    async with serve_policy(terminal_test_oracle()) as (url, _):
        env = TerminalTestEnv(env_config(tmp_path), [server_config(url)])
        await env._run_evaluate()
    report = env.last_eval_report
    assert report is not None and [s.reward for s in report.rollouts] == [1.0]
    messages = report.samples[0]["trajectory"]
    assert "[TOOL CALL] terminal" in str(messages) and "[TOOL CALL] read_file" in str(messages)


async def test_tools_resolved_once_per_group_with_seeded_distribution(tmp_path: Path) -> None:
    async with serve_policy(terminal_test_oracle()) as (url, _):
        envs = [
            TerminalTestEnv(
                env_config(tmp_path, distribution="default", enabled_toolsets=None, seed=7),
                [server_config(url)],
            )
            for _ in range(2)
        ]
        picks = [[sorted(e._resolve_tools_for_group()[1]) for _ in range(5)] for e in envs]
        assert picks[0] == picks[1]  # same seed, same toolsets
        env = envs[0]
        await env.setup()
        calls = 0
        original = env._resolve_tools_for_group

        def counting() -> Any:
            nonlocal calls
            calls += 1
            return original()

        env._resolve_tools_for_group = counting  # type: ignore[method-assign]
        await env.collect_trajectories(GREETING)
    assert calls == 1


async def test_wandb_metrics_and_rollout_table_are_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-very-secret-123")

    def leaky(request: PolicyRequest) -> str:
        if any(m.get("role") == "tool" for m in request.messages):
            return "done"
        return tool_call(
            "nope", {"key": "tok-very-secret-123", "api_key": "sk-abcdefghijklmnopqrstu"}
        )

    logged: list[dict[str, Any]] = []

    async def capture(self: BaseEnv, wandb_metrics: dict[str, Any] | None = None) -> None:
        logged.append(dict(wandb_metrics or {}))

    monkeypatch.setattr(BaseEnv, "wandb_log", capture)
    async with serve_policy(leaky) as (url, _):
        env = TerminalTestEnv(env_config(tmp_path, group_size=2), [server_config(url)])
        await env.setup()
        group, _ = await env.collect_trajectories(GREETING)
        assert group is not None
        await env.add_rollouts_for_wandb(group)
        await env.wandb_log()
    assert logged[0]["train/tool_errors_count"] == 2
    details = logged[0]["train/tool_error_details"]
    assert "[turn 1] nope(" in details
    table_text = env.rollouts_for_wandb[0][0][0]
    assert "[TOOL CALL] nope(" in table_text
    for text in (details, table_text):
        assert "tok-very-secret-123" not in text and "sk-abcdefghij" not in text
        assert "[REDACTED]" in text
    # The messages (for display: HTML, JSONL readers, wandb) are redacted; the tokens the
    # trainer trains on stay exactly what the model sampled.
    assert "tok-very-secret-123" not in json.dumps(group["messages"])
    assert "tok-very-secret-123" in env.loop_tokenizer.decode(group["tokens"][0])  # type: ignore[union-attr]
    await env.wandb_log()
    assert logged[1]["train/tool_errors_count"] == 0


async def test_wandb_name_defaults_to_env_name(tmp_path: Path) -> None:
    env = TerminalTestEnv(env_config(tmp_path), [server_config("http://127.0.0.1:9")])
    assert env.config.wandb_name == "terminal_test"
    assert math.isclose(env.config.server_connect_timeout, 5.0)


def test_subclass_must_use_hermes_config(tmp_path: Path) -> None:
    from atroposlib.envs.base import BaseEnvConfig

    with pytest.raises(TypeError, match="needs a HermesAgentEnvConfig"):
        TerminalTestEnv(BaseEnvConfig(), [server_config("http://127.0.0.1:9")])
    assert issubclass(TerminalTestEnv, HermesAgentBaseEnv)


async def test_sandbox_pool_size_keeps_the_runs_sandboxes_warm(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with serve_policy(terminal_test_oracle()) as (url, _):
        env = await ready_env(
            TerminalTestEnv, env_config(tmp_path, sandbox_pool_size=3), url, factory
        )
        async with env.open_sandboxes() as manager:
            assert manager.warm_pool is not None and manager.warm_pool.options.size == 3
            with anyio.fail_after(30):
                while (stats := manager.statistics().warm_pool) is None or stats.ready < 3:
                    await anyio.sleep(0.02)
            group, _ = await env.collect_trajectories(GREETING)
            stats = manager.statistics().warm_pool
            assert stats is not None and stats.hits == 3 and stats.misses == 0
    assert group is not None and group["scores"] == [1.0, 1.0, 1.0]
    assert factory.leftovers() == []  # the used ones released, the refilled ones drained


def test_sandbox_pool_size_zero_is_no_pool(tmp_path: Path) -> None:
    assert env_config(tmp_path).build_warm_pool() is None
    options = env_config(tmp_path, sandbox_pool_size=2, sandbox_pool_max_age=60).build_warm_pool()
    assert options is not None and (options.size, options.max_age) == (2, 60)


class SetUpEnv(TerminalTestEnv):
    """Every rollout's sandbox gets a task file before the first turn."""

    setups = 0

    async def setup_sandbox(self, item: Any, sandbox: Any) -> None:
        SetUpEnv.setups += 1
        await sandbox.write_bytes(f"{sandbox.workdir}/task.txt", f"item {item}".encode())

    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        out = await ctx.terminal("cat task.txt")
        return 1.0 if str(out.get("output", "")).strip() == f"item {item}" else 0.0


async def test_setup_sandbox_prepares_every_rollouts_sandbox(tmp_path: Path) -> None:
    # Local sandboxes cannot snapshot: the setup runs in each of the group's sandboxes.
    SetUpEnv.setups = 0
    factory = RecordingFactory(tmp_path / "sandboxes")
    async with serve_policy(terminal_test_oracle()) as (url, _):
        env = await ready_env(SetUpEnv, env_config(tmp_path), url, factory)
        group, _ = await env.collect_trajectories(GREETING)
    assert group is not None and group["scores"] == [1.0, 1.0, 1.0]
    assert SetUpEnv.setups == 3
    assert factory.leftovers() == []


def test_setup_sandbox_default_is_no_setup(tmp_path: Path) -> None:
    env = TerminalTestEnv(env_config(tmp_path), [server_config("http://127.0.0.1:9/v1")])
    task = env.rollout_task(GREETING, token_server=False)
    assert task.setup.sandbox_setup is None
    assert task.messages[-1] == {"role": "user", "content": env.format_prompt(GREETING)}
    assert env_config(tmp_path).group_snapshot is True
