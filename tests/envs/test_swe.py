"""HermesSweEnv: the reference's SWE env with its reward made to work, on the built-in sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from hermes_async.envs.samples import SWE_SAMPLE
from hermes_async.envs.swe import HermesSweEnv, HermesSweEnvConfig, reward_program
from hermes_async.errors import ConfigError
from hermes_async.testing.benchmarks import null_policy, swe_oracle
from hermes_async.testing.fake_web import FakeWebProvider
from hermes_async.testing.http import open_loopback_server
from hermes_async.testing.scripted_server import PolicyRequest
from tests.envs.helpers import serve_policy, server_config
from tests.support import tool_call

pytestmark = pytest.mark.anyio

ROWS = [json.loads(line) for line in SWE_SAMPLE.read_text().splitlines()]

#: environments/hermes_swe_env/default.yaml of the reference, as its docs give it.
REFERENCE_YAML = """\
env:
  enabled_toolsets: ["terminal", "file", "web"]
  max_agent_turns: 30
  max_token_length: 4096
  group_size: 4
  terminal_backend: "modal"
  tool_call_parser: "hermes"
  tokenizer_name: "NousResearch/DeepHermes-3-Llama-3-3B-Preview"
  dataset_name: "bigcode/humanevalpack"
  dataset_split: "test"
  prompt_field: "prompt"
  steps_per_eval: 50
  total_steps: 500
  use_wandb: true
  wandb_name: "hermes-swe"
  system_prompt: >
    You are a skilled software engineer. You have access to a terminal,
    file tools, and web search. Use these tools to complete the coding task.
    Write clean, working code and verify it runs correctly before finishing.

openai:
  base_url: "http://localhost:8000/v1"
  model_name: "NousResearch/DeepHermes-3-Llama-3-3B-Preview"
  server_type: "openai"
  api_key: ""
"""


def config(tmp_path: Path, **overrides: Any) -> HermesSweEnvConfig:
    base, _ = HermesSweEnv.config_init()
    values = base.model_dump()
    values.update(
        terminal_backend="local",
        enabled_toolsets=["terminal", "file"],
        use_wandb=False,
        group_size=2,
        dataset_name=None,
        data_dir_to_save_evals=str(tmp_path / "evals"),
        tokenizer_name="qwen-offline",
    )
    values.update(overrides)
    return HermesSweEnvConfig(**values)


async def run(policy: Any, tmp_path: Path, **overrides: Any) -> tuple[HermesSweEnv, list[Any]]:
    """Evaluate the sample, then one training group of each item."""
    async with serve_policy(policy) as (url, _):
        env = HermesSweEnv(config(tmp_path, **overrides), [server_config(url)])
        await env.setup()
        await env.evaluate()
        groups = [(await env.collect_trajectories(item))[0] for item in env.items]
    return env, groups


async def test_the_oracle_passes_every_sample_task_in_both_modes(tmp_path: Path) -> None:
    env, groups = await run(swe_oracle(), tmp_path)
    assert env.data_source == "built-in sample" and len(env.items) == 3
    report = env.last_eval_report
    assert report is not None and [r.reward for r in report.rollouts] == [1.0, 1.0, 1.0]
    assert report.metrics["eval/accuracy"] == 1.0
    assert [g["scores"] for g in groups] == [[1.0, 1.0]] * 3
    assert env.reward_buffer == [1.0] * 6  # training rewards only


async def test_the_null_policy_scores_zero_in_both_modes(tmp_path: Path) -> None:
    env, groups = await run(null_policy, tmp_path)
    report = env.last_eval_report
    assert report is not None and [r.reward for r in report.rollouts] == [0.0, 0.0, 0.0]
    assert [g["scores"] for g in groups] == [[0.0, 0.0]] * 3


def wrong_solution(request: PolicyRequest) -> str:
    # A file that exists but fails the tests: the reference's 0.1, which its missing marker
    # file made unreachable.
    if any(m.get("role") == "tool" for m in request.messages):
        return "done"
    return tool_call(
        "write_file", {"path": "solution.py", "content": "def count_vowels(t):\n  return -1\n"}
    )


async def test_a_failing_solution_earns_the_partial_credit(tmp_path: Path) -> None:
    async with serve_policy(wrong_solution) as (url, _):
        env = HermesSweEnv(config(tmp_path, group_size=1), [server_config(url)])
        await env.setup()
        group, _ = await env.collect_trajectories(ROWS[0])
    assert group is not None and group["scores"] == [0.1]


def solve_then_leave_the_workspace(request: PolicyRequest) -> str:
    """Solves the task, then cds away: the reward still runs in
    /workspace (the reference's tests ran wherever ``cd /workspace`` left them)."""
    done = sum(1 for m in request.messages if m.get("role") == "tool")
    row = ROWS[0]
    if done == 0:
        source = row["prompt"] + row["canonical_solution"]
        return tool_call("write_file", {"path": "solution.py", "content": source})
    if done == 1:
        return tool_call("terminal", {"command": "mkdir -p elsewhere && cd elsewhere"})
    return "done"


async def test_tests_with_quotes_and_dollars_run_from_the_workspace(tmp_path: Path) -> None:
    # The sample's tests hold quotes; a `$` and a backslash too here: the reference spliced
    # them into `python3 -c "..."`.
    row = dict(ROWS[0], test=ROWS[0]["test"].replace("'Hermes'", "'Her$mes\\\\'"))
    row["test"] = row["test"].replace("== 2\n", '== 2 + 0 * len("$HOME")\n', 1)
    async with serve_policy(solve_then_leave_the_workspace) as (url, _):
        env = HermesSweEnv(config(tmp_path, group_size=1), [server_config(url)])
        await env.setup()
        group, _ = await env.collect_trajectories(row)
    assert group is not None and group["scores"] == [1.0]


def test_the_prompt_is_the_references_and_says_where_the_solution_goes(tmp_path: Path) -> None:
    env = HermesSweEnv(config(tmp_path), [server_config("http://127.0.0.1:9")])
    prompt = env.format_prompt(ROWS[1])
    assert prompt.startswith(ROWS[1]["prompt"] + "\n\nTests to pass:\n" + ROWS[1]["test"])
    assert prompt.endswith("Save your solution as solution.py in the working directory.")


def test_reward_program_calls_check_only_when_the_tests_do_not() -> None:
    humanevalpack = reward_program(ROWS[0], "solution.py")
    assert humanevalpack.count("\ncheck(count_vowels)") == 1
    assert "runpy.run_path('solution.py')" in humanevalpack
    openai_style = {
        "test": "def check(candidate):\n    assert candidate(1) == 1\n",
        "entry_point": "f",
    }
    assert reward_program(openai_style, "s.py").rstrip().endswith("check(f)")


async def test_data_comes_from_a_file_or_the_hub_else_the_sample(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROWS[2]) + "\n")
    env = HermesSweEnv(config(tmp_path, dataset_path=str(rows)), [server_config("http://x:1")])
    await env.setup()
    assert env.items == [ROWS[2]] and env.data_source == f"file {rows}"
    # The hub is unreachable here (HF_HUB_OFFLINE): the sample runs, and the run says why.
    hub = config(tmp_path, dataset_name="bigcode/humanevalpack")
    env = HermesSweEnv(hub, [server_config("http://x:1")])
    await env.setup()
    assert len(env.items) == 3
    assert env.data_source.startswith("built-in sample (hub bigcode/humanevalpack (python, test)")
    strict = config(tmp_path, dataset_name="bigcode/humanevalpack", require_dataset=True)
    env = HermesSweEnv(strict, [server_config("http://x:1")])
    with pytest.raises(ConfigError, match=r"cannot load hub bigcode/humanevalpack .*dataset_path"):
        await env.setup()


def test_the_reference_default_yaml_loads(tmp_path: Path) -> None:
    values = yaml.safe_load(REFERENCE_YAML)
    config = HermesSweEnvConfig(**values["env"])
    assert (config.max_token_length, config.terminal_backend) == (4096, "modal")
    assert config.system_prompt is not None and config.system_prompt.startswith("You are a")


async def test_the_reference_command_line_runs_with_only_the_model_flags_changed(
    tmp_path: Path,
) -> None:
    # The docstring's process command with the reference's default.yaml, the model flags
    # pointed at the scripted oracle. Offline substitutes: the built-in sample for the hub (the
    # run says so), local sandboxes for Modal, the testing kit's fake search provider for the
    # web toolset's key.
    config_file = tmp_path / "default.yaml"
    config_file.write_text(REFERENCE_YAML)
    groups = tmp_path / "groups.jsonl"
    async with (
        serve_policy(swe_oracle()) as (url, _),
        open_loopback_server(FakeWebProvider("tavily")) as web,
    ):
        with anyio.fail_after(120):
            done = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "hermes_async.envs.swe",
                    "process",
                    "--config",
                    str(config_file),
                    "--env.dataset_name",
                    "bigcode/humanevalpack",
                    "--env.terminal_backend",
                    "local",
                    "--env.max_agent_turns",
                    "30",
                    "--env.total_steps",
                    "2",
                    "--env.group_size",
                    "2",
                    "--env.use_wandb",
                    "false",
                    "--env.tokenizer_name",
                    "qwen-offline",
                    "--env.data_path_to_save_groups",
                    str(groups),
                    "--openai.base_url",
                    url + "/v1",
                    "--openai.model_name",
                    "scripted",
                    "--openai.server_type",
                    "vllm",
                ],
                check=False,
                stderr=subprocess.PIPE,
                env={**os.environ, "TAVILY_API_KEY": "fake", "TAVILY_BASE_URL": web},
            )
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr[-3000:]
    assert "running the built-in sample of swe_sample.jsonl instead" in stderr
    scored = [json.loads(line)["scores"] for line in groups.read_text().splitlines()]
    assert scored == [[1.0, 1.0], [1.0, 1.0]]
