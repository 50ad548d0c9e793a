"""CodingEnv: the model's function is rewarded by its tests, run in the rollout's sandbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermes_async.envs.coding import BUILTIN_TASKS, CodingEnv, CodingEnvConfig, coding_oracle
from hermes_async.testing.scripted_server import PolicyRequest
from tests.envs.helpers import serve_policy, server_config

pytestmark = pytest.mark.anyio


def config(tmp_path: Path, **overrides: Any) -> CodingEnvConfig:
    base, _ = CodingEnv.config_init()
    values = base.model_dump()
    values.update(
        use_wandb=False, group_size=2, data_dir_to_save_evals=str(tmp_path / "evals"), seed=1
    )
    values.update(overrides)
    return CodingEnvConfig(**values)


async def test_oracle_solutions_pass_their_tests(tmp_path: Path) -> None:
    async with serve_policy(coding_oracle()) as (url, _):
        env = CodingEnv(config(tmp_path), [server_config(url)])
        await env.setup()
        assert len(env.eval_items) == 1 and len(env.train_items) == 3
        group, _ = await env.collect_trajectories(await env.get_next_item())
        await env.evaluate()
    assert group is not None and group["scores"] == [1.0, 1.0]
    report = env.last_eval_report
    assert report is not None and [s.reward for s in report.rollouts] == [1.0]


def wrong_solution(request: PolicyRequest) -> str:
    if any(m.get("role") == "tool" for m in request.messages):
        return "done"
    call = {
        "name": "write_file",
        "arguments": {"path": "solution.py", "content": "def add(a, b):\n    return a - b\n"},
    }
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


async def test_failing_tests_get_partial_credit_and_missing_file_none(tmp_path: Path) -> None:
    add = next(t for t in BUILTIN_TASKS if t["name"] == "add")
    async with serve_policy(wrong_solution) as (url, _):
        env = CodingEnv(config(tmp_path), [server_config(url)])
        await env.setup()
        group, _ = await env.collect_trajectories(add)
    assert group is not None and group["scores"] == [0.1, 0.1]
    async with serve_policy(lambda request: "I refuse.") as (url, _):
        env = CodingEnv(config(tmp_path), [server_config(url)])
        await env.setup()
        group, _ = await env.collect_trajectories(add)
    assert group is not None and group["scores"] == [0.0, 0.0]
    assert "Tests to pass" in env.format_prompt(add)
