"""``cli()``: atroposlib's ``process`` / ``evaluate`` subcommands, flags and config priority.

The environment module is run as a program, as users run it, against the scripted oracle
hosted by the test on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from hermes_async.envs.config import resolve_tokenizer
from hermes_async.envs.terminal_test import terminal_test_oracle
from hermes_async.inference.hf import qwen_offline_hf_dir
from tests.envs.helpers import serve_policy

pytestmark = pytest.mark.anyio


async def run_env(*args: str) -> subprocess.CompletedProcess[bytes]:
    with anyio.fail_after(60):
        return await anyio.run_process(
            [sys.executable, "-m", "hermes_async.envs.terminal_test", *args], check=False
        )


async def test_process_mode_priority_cli_over_yaml_over_config_init(tmp_path: Path) -> None:
    yaml_path = tmp_path / "cfg.yaml"
    yaml_path.write_text("env:\n  total_steps: 5\n  group_size: 2\n")
    groups_path = tmp_path / "out" / "groups.jsonl"
    async with serve_policy(terminal_test_oracle()) as (url, _):
        done = await run_env(
            "process",
            "--config",
            str(yaml_path),
            "--env.total_steps",
            "1",
            "--env.use_wandb",
            "false",
            "--env.data_path_to_save_groups",
            str(groups_path),
            "--openai.base_url",
            url + "/v1",
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    groups = [json.loads(line) for line in groups_path.read_text().splitlines()]
    # CLI total_steps=1 beats YAML's 5; YAML group_size=2 beats config_init's 3.
    assert len(groups) == 1 and groups[0]["scores"] == [1.0, 1.0]
    assert groups_path.with_suffix(".html").is_file()


async def test_evaluate_mode_runs_the_agent_loop(tmp_path: Path) -> None:
    evals = tmp_path / "evals"
    async with serve_policy(terminal_test_oracle()) as (url, _):
        done = await run_env(
            "evaluate",
            "--env.data_dir_to_save_evals",
            str(evals),
            "--openai.base_url",
            url + "/v1",
            "--openai.server_type",
            "openai",
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/mean_reward"] == 1.0 and metrics["eval/mean_turns"] == 3.0
    sample = json.loads((evals / "samples.jsonl").read_text().splitlines()[0])
    assert "[TOOL CALL] terminal" in sample["trajectory"]


def test_tokenizer_names_resolve_to_local_directories(tmp_path: Path) -> None:
    built = qwen_offline_hf_dir()
    assert resolve_tokenizer("qwen-offline") == (str(built), True)
    assert resolve_tokenizer(str(built)) == (str(built), True)
    assert resolve_tokenizer(str(tmp_path)) == (str(tmp_path), False)
