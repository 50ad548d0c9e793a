"""Issue #14 through the environment: each bullet under "Why", as a user hits it.

* ``terminal_timeout`` reaches the model's ``terminal`` calls and ``ctx.terminal`` alike.
* A subclass's ``collect_trajectory`` override is what ``collect_trajectories`` runs.
* ``eval_size`` is a base config field.
* ``thinking_mode`` / ``reasoning_effort`` / ``max_reasoning_tokens`` reach the model;
  ``<think>`` blocks are kept or split by ``preserve_think_blocks`` (default: thinking_mode).
* ``cd`` carries over between the model's commands, and into the reward's ``ctx.terminal``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hermes_async.agent import AgentOptions, HermesAgentLoop
from hermes_async.agent_loop import AgentResult
from hermes_async.envs.base import HermesAgentEnvConfig
from hermes_async.envs.terminal_test import (
    EVAL_TASKS,
    ORACLE_COMMANDS,
    TRAIN_TASKS,
    TerminalTestEnv,
    terminal_test_oracle,
)
from hermes_async.inference._chat_template import default_chat_template
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.tokenizer import QwenTokenizer
from hermes_async.testing import ScriptedModelServer, open_app_endpoint
from hermes_async.testing.scripted_server import PolicyRequest
from hermes_async.tool_context import ToolContext
from tests.envs.helpers import env_config, serve_policy, server_config
from tests.support import RecordingFactory, tool_call

pytestmark = pytest.mark.anyio

GREETING = TRAIN_TASKS[0]


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


# ---------------------------------------------------------------- terminal_timeout


def sleeper(request: PolicyRequest) -> str:
    if not any(m.get("role") == "tool" for m in request.messages):
        return tool_call("terminal", {"command": "sleep 4; echo slept"})
    return "done"


class TimedRewardEnv(TerminalTestEnv):
    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        out = await ctx.terminal("sleep 4; echo slept")  # no timeout: terminal_timeout applies
        return 1.0 if out["exit_code"] == 124 and "slept" not in out["output"] else 0.0


@pytest.mark.parametrize("server_type", ["openai", "vllm"], ids=["chat-server", "token-server"])
async def test_terminal_timeout_reaches_model_calls_and_ctx(
    tmp_path: Path, server_type: str
) -> None:
    async with serve_policy(sleeper) as (url, _):
        env = TimedRewardEnv(
            env_config(tmp_path, group_size=1, terminal_timeout=1),
            [server_config(url, server_type)],
        )
        await env.setup()
        group, _ = await env.collect_trajectories(GREETING)
    assert group is not None and group["scores"] == [1.0]
    (result,) = tool_results(group["messages"][0])
    assert result["exit_code"] == 124 and "slept" not in result["output"]
    assert result["error"] == "Command timed out after 1 seconds"


# ---------------------------------------------------------------- collect_trajectory override


class CustomRolloutEnv(TerminalTestEnv):
    """Customises the single-rollout path, as reference subclasses did."""

    calls = 0

    async def collect_trajectory(self, item: Any) -> tuple[dict[str, Any] | None, list[Any]]:
        type(self).calls += 1
        index = type(self).calls
        scored, backlog = await super().collect_trajectory(item)
        assert scored is not None
        if index == 2:
            return None, ["retry-me"]  # an override may drop a rollout
        scored["scores"] = scored["scores"] - 0.25
        scored["messages"] = [*scored["messages"], {"role": "user", "content": "custom"}]
        return scored, backlog


async def test_collect_trajectories_runs_the_override(tmp_path: Path) -> None:
    from hermes_async.envs.terminal_test import terminal_test_oracle

    factory = RecordingFactory(tmp_path / "sbx")
    async with serve_policy(terminal_test_oracle()) as (url, _):
        env = CustomRolloutEnv(env_config(tmp_path, group_size=3), [server_config(url)])
        env.make_sandbox_factory = lambda: factory  # type: ignore[method-assign]
        await env.setup()
        group, backlog = await env.collect_trajectories(GREETING)
    assert CustomRolloutEnv.calls == 3
    assert group is not None and group["scores"] == [0.75, 0.75]
    assert all(m[-1] == {"role": "user", "content": "custom"} for m in group["messages"])
    assert len(group["tokens"]) == len(group["inference_logprobs"]) == 2
    assert group["generation_params"]["temperature"] == 1.0
    assert backlog == ["retry-me"]
    assert len(factory.created) == 3 and factory.leftovers() == []


# ---------------------------------------------------------------- eval_size


def test_eval_size_is_a_base_config_field() -> None:
    assert HermesAgentEnvConfig().eval_size is None  # None: every item ([:None] slices all)
    assert HermesAgentEnvConfig(eval_size=20).eval_size == 20
    items = [1, 2, 3]
    assert items[: HermesAgentEnvConfig().eval_size] == items


async def test_eval_size_limits_the_eval_items_without_slicing_by_hand(tmp_path: Path) -> None:
    items = [*TRAIN_TASKS, *EVAL_TASKS]  # 4 items; the author passes them all
    async with serve_policy(terminal_test_oracle()) as (url, _):
        for eval_size, expected in ((2, 2), (None, 4), (0, 4)):
            config = env_config(tmp_path / str(eval_size), eval_size=eval_size)
            env = TerminalTestEnv(config, [server_config(url)])
            await env.setup()
            report = await env.run_agent_eval(items, log=False)
            assert [s.label for s in report.rollouts] == [env.item_label(i) for i in items][
                :expected
            ]
    with pytest.raises(ValidationError, match="eval_size"):
        HermesAgentEnvConfig(eval_size=-1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_agent_turns", 0),
        ("agent_temperature", -0.5),
        ("agent_temperature", float("nan")),
        ("eval_temperature", -1.0),  # before: accepted, refused only when an eval started
        ("eval_concurrency", 0),  # before: accepted
        ("server_connect_timeout", 0.0),  # before: accepted
        ("sandbox_release_timeout", -1.0),  # before: accepted (a negative cleanup bound)
        ("terminal_lifetime", 0),  # before: accepted
        ("terminal_timeout", 0),
        ("tool_timeout", 0.0),
        ("rollout_timeout", -5.0),
        ("model_request_limit", 0),
        ("sandbox_exec_limit", -3),
        ("default_result_size_chars", -1),
    ],
)
def test_out_of_range_numbers_are_refused_by_the_config_naming_the_field(
    field: str, value: object
) -> None:
    with pytest.raises(ValidationError) as caught:
        HermesAgentEnvConfig(**{field: value})
    assert caught.value.errors()[0]["loc"] == (field,)


def test_optional_deadlines_may_still_be_none() -> None:
    config = HermesAgentEnvConfig(tool_timeout=None, turn_timeout=None, rollout_timeout=None)
    assert config.build_agent_options().tool_timeout is None


# ---------------------------------------------------------------- reasoning options


def thinker(request: PolicyRequest) -> str:
    return "<think>\nplan the answer\n</think>\n\nThe answer is 42."


async def test_phase1_reasoning_fields_reach_the_request(tmp_path: Path) -> None:
    async with serve_policy(thinker) as (url, server):
        env = TerminalTestEnv(
            env_config(
                tmp_path,
                group_size=1,
                thinking_mode=True,
                reasoning_effort="high",
                extra_body={"provider": {"order": ["x"]}},
            ),
            [server_config(url, "openai")],
        )
        await env.setup()
        await env.collect_trajectories(GREETING)
        budget = TerminalTestEnv(
            env_config(tmp_path, group_size=1, max_reasoning_tokens=2048),
            [server_config(url, "openai")],
        )
        await budget.setup()
        await budget.collect_trajectories(GREETING)
        plain = TerminalTestEnv(env_config(tmp_path, group_size=1), [server_config(url, "openai")])
        await plain.setup()
        await plain.collect_trajectories(GREETING)
    first, second, third = (r.body for r in server.requests)
    assert first["reasoning"] == {"enabled": True, "effort": "high"}
    assert first["provider"] == {"order": ["x"]}  # the user's extra_body is kept
    assert second["reasoning"] == {"enabled": True, "max_tokens": 2048}
    assert "reasoning" not in third


@pytest.mark.parametrize(
    ("settings", "kept"),
    [
        ({}, False),  # the reference's default: preserve_think_blocks = bool(thinking_mode)
        ({"thinking_mode": True}, True),
        ({"thinking_mode": True, "preserve_think_blocks": False}, False),
        ({"preserve_think_blocks": True}, True),
    ],
)
async def test_think_blocks_kept_or_split(
    tmp_path: Path, settings: dict[str, Any], kept: bool
) -> None:
    async with serve_policy(thinker) as (url, _):
        env = TerminalTestEnv(env_config(tmp_path, group_size=1, **settings), [server_config(url)])
        await env.setup()
        group, _ = await env.collect_trajectories(GREETING)
    assert group is not None
    final = group["messages"][0][-1]
    decoded = env.loop_tokenizer.decode(group["tokens"][0])  # type: ignore[union-attr]
    assert "<think>\nplan the answer\n</think>" in decoded  # trained tokens: exact, always
    if kept:
        assert final["content"].startswith("<think>") and "reasoning_content" not in final
    else:
        assert final["content"] == "The answer is 42."
        assert final["reasoning_content"] == "plan the answer"


# The built-in template plus a switch in its generation prompt (as Qwen3's has one).
SWITCH_TEMPLATE = default_chat_template().replace(
    '{{- "<|im_start|>assistant\\n" -}}',
    '{{- "<|im_start|>assistant\\n" -}}'
    "{%- if enable_thinking is defined %}[thinking={{ enable_thinking }}]{%- endif %}",
)


@pytest.mark.parametrize(
    ("options", "marker"),
    [
        ({}, None),
        ({"thinking_mode": True}, "[thinking=True]"),
        ({"reasoning_effort": "none"}, "[thinking=False]"),
    ],
)
async def test_phase2_template_switch(options: dict[str, Any], marker: str | None) -> None:
    assert default_chat_template() != SWITCH_TEMPLATE
    tokenizer = QwenTokenizer(chat_template=SWITCH_TEMPLATE)
    server = ScriptedModelServer(lambda r: "ok", tokenizer=tokenizer)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        loop = HermesAgentLoop(
            client, [], [], tokenizer=tokenizer, options=AgentOptions(max_tokens=16, **options)
        )
        await loop.run([{"role": "user", "content": "hi"}])
    prompt = tokenizer.decode(server.requests[0].prompt_ids)
    if marker is None:
        assert "[thinking=" not in prompt
    else:
        assert prompt.count(marker) == 1


# ---------------------------------------------------------------- cwd carries over


def cd_then_relative(request: PolicyRequest) -> str:
    steps = sum(1 for m in request.messages if m.get("role") == "tool")
    if steps == 0:
        return tool_call("terminal", {"command": "mkdir -p proj && cd proj"})
    if steps == 1:
        return tool_call("terminal", {"command": "echo built > out.txt"})
    return "done"


class RelativeRewardEnv(TerminalTestEnv):
    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        out = await ctx.terminal("cat out.txt && pwd")  # continues in the model's directory
        return 1.0 if out["output"].startswith("built\n") and "/proj" in out["output"] else 0.0


async def test_cwd_carries_over_in_a_rollout(tmp_path: Path) -> None:
    async with serve_policy(cd_then_relative) as (url, _):
        env = RelativeRewardEnv(env_config(tmp_path, group_size=2), [server_config(url)])
        await env.setup()
        group, _ = await env.collect_trajectories(GREETING)
    assert group is not None and group["scores"] == [1.0, 1.0]


# ---------------------------------------------------------------- a user parser (register_parser)


def angle_caller(request: PolicyRequest) -> str:
    if not any(m.get("role") == "tool" for m in request.messages):
        call = {"name": "terminal", "arguments": {"command": ORACLE_COMMANDS["greeting"]}}
        return "Writing it.<call>" + json.dumps(call) + "</call>"
    return "done"


async def test_a_registered_parser_drives_phase2_rollouts(tmp_path: Path) -> None:
    # The reference's extension point: @register_parser("name") on a class, then
    # tool_call_parser="name" in the config. It passes the start-up check and parses the
    # token stream of a Phase 2 rollout (the call runs, the reward sees the file).
    from hermes_async.envs._preflight import check_parser
    from hermes_async.parsers import (
        PARSER_REGISTRY,
        Format,
        JsonCallSpec,
        ToolCallParser,
        register_parser,
    )

    saved = dict(PARSER_REGISTRY)
    try:

        @register_parser("angle_calls")
        class AngleParser(ToolCallParser):
            FORMAT = Format(
                name="angle_calls", call_open=("<call>",), body=JsonCallSpec(close=("</call>",))
            )

        check_parser("angle_calls")
        async with serve_policy(angle_caller) as (url, _):
            env = TerminalTestEnv(
                env_config(tmp_path, group_size=1, tool_call_parser="angle_calls"),
                [server_config(url, "vllm")],
            )
            await env.preflight()
            await env.setup()
            group, _ = await env.collect_trajectories(GREETING)
    finally:
        PARSER_REGISTRY.clear()
        PARSER_REGISTRY.update(saved)
    assert group is not None and group["scores"] == [1.0]
    (result,) = tool_results(group["messages"][0])
    assert result["exit_code"] == 0
