"""TBLiteEvalEnv: the reference's data and defaults on the Terminal-Bench path (Docker)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from hermes_async.envs.samples import TBLITE_SAMPLE
from hermes_async.envs.tblite import TBLiteEnv, TBLiteEvalConfig, TBLiteEvalEnv
from hermes_async.envs.terminalbench import load_dataset
from hermes_async.errors import ConfigError
from hermes_async.testing.benchmarks import null_policy, tblite_oracle
from tests.envs.helpers import serve_policy, server_config

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]
SAMPLE_TASKS = ["count-error-lines", "fix-backup-script", "sum-csv-column"]

#: The reference's three YAML files (environments/benchmarks/tblite/), with its values.
REFERENCE_YAMLS = {
    "default.yaml": """\
env:
  enabled_toolsets: ["terminal", "file"]
  max_agent_turns: 60
  max_token_length: 32000
  agent_temperature: 0.8
  terminal_backend: "modal"
  dataset_name: "NousResearch/openthoughts-tblite"
  test_timeout: 600
  task_timeout: 1200
  tool_pool_size: 128
  tokenizer_name: "NousResearch/Hermes-3-Llama-3.1-8B"
  use_wandb: true
  wandb_name: "openthoughts-tblite"
  ensure_scores_are_not_same: false
  data_dir_to_save_evals: "environments/benchmarks/evals/openthoughts-tblite"
openai:
  base_url: "https://openrouter.ai/api/v1"
  model_name: "anthropic/claude-sonnet-4"
  server_type: "openai"
  health_check: false
""",
    "local.yaml": """\
env:
  enabled_toolsets: ["terminal", "file"]
  max_agent_turns: 60
  max_token_length: 16000
  agent_temperature: 0.6
  terminal_backend: "docker"
  dataset_name: "NousResearch/openthoughts-tblite"
  test_timeout: 600
  task_timeout: 1200
  tool_pool_size: 16
  eval_concurrency: 8
  use_wandb: false
  data_dir_to_save_evals: "environments/benchmarks/evals/openthoughts-tblite-local"
openai:
  base_url: "https://openrouter.ai/api/v1"
  model_name: "anthropic/claude-sonnet-4"
  server_type: "openai"
  health_check: false
""",
    "local_vllm.yaml": """\
env:
  enabled_toolsets: ["terminal", "file"]
  max_agent_turns: 60
  max_token_length: 16000
  agent_temperature: 0.6
  terminal_backend: "docker"
  dataset_name: "NousResearch/openthoughts-tblite"
  test_timeout: 600
  task_timeout: 1200
  tool_call_parser: "hermes"
  use_wandb: false
  system_prompt: >
    You are an expert terminal agent. You MUST use the provided tools to complete the task.
    Start by exploring the environment.
openai:
  base_url: "http://localhost:9001"
  model_name: "Qwen/Qwen3-4B-Instruct-2507"
  server_type: "vllm"
  health_check: false
""",
}


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # atroposlib and aiodocker are asyncio-only.
    return ("asyncio", {"debug": True})


def make_env(tmp_path: Path, url: str = "http://127.0.0.1:9", **overrides: Any) -> TBLiteEvalEnv:
    config, _ = TBLiteEvalEnv.config_init()
    values = config.model_dump()
    values.update(
        use_wandb=False,
        tokenizer_name="qwen-offline",
        data_dir_to_save_evals=str(tmp_path / "evals"),
        rows_cache_dir=str(tmp_path / "rows"),
        server_connect_timeout=5.0,
        max_concurrent_tasks=3,
    )
    values.update(overrides)
    return TBLiteEvalEnv(TBLiteEvalConfig(**values), [server_config(url)])


def test_the_sample_rows_are_made_from_the_task_folders() -> None:
    sys.path.insert(0, str(REPO / "scripts" / "tblite"))
    try:
        from make_sample import sample_rows  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(REPO / "scripts" / "tblite"))
    committed = [json.loads(line) for line in TBLITE_SAMPLE.read_text().splitlines()]
    assert committed == sample_rows()  # run scripts/tblite/make_sample.py after a change
    assert [r["task_name"] for r in committed] == SAMPLE_TASKS
    assert all(r["docker_image"] is None and r["environment_tar"] for r in committed)


@pytest.mark.parametrize("name", sorted(REFERENCE_YAMLS))
def test_the_reference_yaml_files_load(name: str) -> None:
    values = yaml.safe_load(REFERENCE_YAMLS[name])
    config = TBLiteEvalConfig(**values["env"])
    assert (config.task_timeout, config.test_timeout) == (1200, 600)
    assert config.dataset_name == "NousResearch/openthoughts-tblite"
    assert TBLiteEnv is TBLiteEvalEnv


async def test_the_tasks_come_from_the_hub_else_the_sample(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    await env.setup()  # the hub is unreachable here (HF_HUB_OFFLINE)
    assert env.data_source.startswith(
        "built-in sample (hub NousResearch/openthoughts-tblite (train) unavailable"
    )
    assert [t.name for t in env.tasks] == SAMPLE_TASKS
    # The reference's task_timeout is each task's agent deadline; test_timeout, when given,
    # every verifier's (rows carry none: Harbor's default 600 s; the reference's fixed 180 s).
    assert {(t.agent_timeout_sec, t.verifier_timeout_sec) for t in env.tasks} == {(1200.0, 600.0)}
    env = make_env(tmp_path, test_timeout=180, task_timeout=None, task_filter="sum-csv-column")
    await env.setup()
    assert [(t.agent_timeout_sec, t.verifier_timeout_sec) for t in env.tasks] == [(None, 180.0)]
    rows = tmp_path / "one.jsonl"
    rows.write_text(TBLITE_SAMPLE.read_text().splitlines()[2] + "\n")
    env = make_env(tmp_path, dataset_path=str(rows))
    await env.setup()
    assert [t.name for t in env.tasks] == ["sum-csv-column"]
    with pytest.raises(ConfigError, match=r"cannot load hub NousResearch/openthoughts-tblite"):
        await make_env(tmp_path, require_dataset=True).setup()


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("r.jsonl", b"{nope\n", r"r.jsonl: line 1 is not JSON \(Expecting property name"),
        ("r.jsonl", b"[" * 100_000, r"r.jsonl: line 1 is not JSON \(nested too deeply"),
        ("r.json", b'{"a": ' + b"9" * 5000 + b"}", r"r.json: the file is not JSON \(Exceeds"),
        ("r.jsonl", b'{"a": "\xff"}\n', r"r.jsonl' is not UTF-8 text"),
        ("r.csv", b'a\n"' + b"x" * 200_000 + b'"\n', r"r.csv' is not valid CSV: field larger"),
    ],
)
def test_a_damaged_dataset_path_is_a_config_error(
    tmp_path: Path, name: str, content: bytes, match: str
) -> None:
    # --env.dataset_path: each raised JSONDecodeError, RecursionError, ValueError,
    # UnicodeDecodeError or csv.Error with a traceback.
    from hermes_async.envs._datasets import read_rows_file

    (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        read_rows_file(tmp_path / name)


def test_force_build_never_uses_the_image(tmp_path: Path) -> None:
    row_task = load_dataset(TBLITE_SAMPLE, cache_dir=tmp_path / "rows").tasks[0]
    with_image = dataclasses.replace(
        row_task,
        environment=dataclasses.replace(row_task.environment, docker_image="nousresearch/x"),
    )
    spec = make_env(tmp_path, force_build=True).sandbox_spec(with_image)
    assert spec is not None and spec.image is None and spec.build_context is not None
    spec = make_env(tmp_path).sandbox_spec(with_image)
    assert spec is not None and spec.image == "nousresearch/x"


@pytest.mark.docker
@pytest.mark.usefixtures("base_image")
@pytest.mark.timeout(900)
async def test_the_sample_scores_one_with_the_oracle_and_zero_without_in_both_modes(
    tmp_path: Path,
) -> None:
    # The task's own oracle (solve.sh, no model) and the testing kit's model-side oracle.
    env = make_env(tmp_path / "harness", agent="oracle")
    await env.setup()
    trials = await env.run_tasks()
    assert [(t.task, t.reward) for t in trials] == [(n, 1.0) for n in SAMPLE_TASKS]
    async with serve_policy(tblite_oracle()) as (url, _):
        env = make_env(tmp_path / "oracle", url)
        await env.setup()
        await env.evaluate()
        group, _ = await env.collect_trajectories(env.tasks[2])
    assert sorted((t.task, t.reward) for t in env.last_trials) == [(n, 1.0) for n in SAMPLE_TASKS]
    metrics = json.loads((tmp_path / "oracle" / "evals" / "metrics.json").read_text())
    assert metrics["results"]["all"]["eval/pass_rate"] == 1.0
    assert group is not None and group["scores"] == [1.0]
    async with serve_policy(null_policy) as (url, _):
        env = make_env(tmp_path / "null", url)
        await env.setup()
        await env.evaluate()
        group, _ = await env.collect_trajectories(env.tasks[0])
    assert sorted((t.task, t.reward) for t in env.last_trials) == [(n, 0.0) for n in SAMPLE_TASKS]
    assert group is not None and group["scores"] == [0.0]


@pytest.mark.docker
@pytest.mark.usefixtures("base_image")
@pytest.mark.timeout(600)
async def test_the_reference_command_line_runs_with_only_the_model_flags_changed(
    tmp_path: Path,
) -> None:
    # README: `tblite_env.py evaluate --config default.yaml --env.task_filter ...
    # --openai.model_name ...`. Offline: the built-in sample for the hub (the run says so) and
    # Docker for Modal (the sample's images are built from their environment_tar).
    config_file = tmp_path / "default.yaml"
    evals = tmp_path / "evals"
    config_file.write_text(
        REFERENCE_YAMLS["default.yaml"].replace(
            "environments/benchmarks/evals/openthoughts-tblite", str(evals)
        )
    )
    async with serve_policy(tblite_oracle()) as (url, _):
        with anyio.fail_after(500):
            done = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "hermes_async.envs.tblite",
                    "evaluate",
                    "--config",
                    str(config_file),
                    "--env.task_filter",
                    "count-error-lines,sum-csv-column",
                    "--env.terminal_backend",
                    "docker",
                    "--env.use_wandb",
                    "false",
                    "--env.tokenizer_name",
                    "qwen-offline",
                    "--openai.base_url",
                    url + "/v1",
                    "--openai.model_name",
                    "scripted",
                    "--openai.server_type",
                    "vllm",
                ],
                check=False,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={**os.environ, "HERMES_ASYNC_CACHE": str(tmp_path / "cache")},
            )
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr[-3000:]
    assert "running the built-in sample of tblite_sample.jsonl instead" in stderr
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/pass_rate"] == 1.0 and metrics["eval/num_tasks"] == 2.0
