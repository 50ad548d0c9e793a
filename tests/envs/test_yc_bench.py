"""YCBenchEvalEnv: the scoring on fixed numbers, the fixed survival query, and real runs of the
yc-bench 0.1.0 simulator (its own venv) with the oracle and the null policy."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from hermes_async.envs.yc_bench import (
    YCBenchEnv,
    YCBenchEvalConfig,
    YCBenchEvalEnv,
    composite_score,
    read_final_state,
    run_metrics,
)
from hermes_async.errors import ConfigError
from hermes_async.testing.benchmarks import null_policy, yc_bench_oracle
from tests.envs.helpers import serve_policy, server_config

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]

#: environments/benchmarks/yc_bench/default.yaml of the reference (its documented values).
REFERENCE_YAML = """\
env:
  enabled_toolsets: ["terminal"]
  max_agent_turns: 200
  max_token_length: 32000
  agent_temperature: 0.0
  terminal_backend: "local"
  terminal_timeout: 60
  presets: ["fast_test", "medium", "hard"]
  seeds: [1, 2, 3]
  run_timeout: 3600
  survival_weight: 0.5
  funds_weight: 0.5
  db_dir: "/tmp/yc_bench_dbs"
  company_name: "BenchCo"
  start_date: "01/01/2025"
  tokenizer_name: "NousResearch/Hermes-3-Llama-3.1-8B"
  use_wandb: true
  wandb_name: "yc-bench"
  ensure_scores_are_not_same: false
  data_dir_to_save_evals: "environments/benchmarks/evals/yc-bench"

openai:
  base_url: "https://openrouter.ai/api/v1"
  model_name: "anthropic/claude-sonnet-4.6"
  server_type: "openai"
  health_check: false
"""


def test_the_composite_score_matches_the_references_numbers() -> None:
    assert composite_score(25_000_000, True) == pytest.approx(0.5 + 0.5 * 0.150, abs=1e-3)
    assert composite_score(250_000_000, False) == pytest.approx(0.5 * 0.52, abs=1e-2)
    assert composite_score(2_500_000_000, True) == pytest.approx(1.0)
    assert composite_score(10**12, True) == 1.0  # capped
    assert composite_score(0, True) == 0.5 and composite_score(-5, False) == 0.0
    assert composite_score(25_000_000, True, 0.2, 0.8) == pytest.approx(
        0.2 + 0.8 * math.log1p(1) / math.log1p(100)
    )


def database(funds: int, sim_time: str, events: list[tuple[str, str]]) -> bytes:
    """A database with yc-bench's tables and date format (only the columns read)."""
    conn = sqlite3.connect(":memory:")
    conn.executescript(
        "CREATE TABLE companies (id TEXT, funds_cents INTEGER);"
        "CREATE TABLE sim_state (company_id TEXT, sim_time DATETIME, horizon_end DATETIME);"
        "CREATE TABLE sim_events (event_type TEXT, scheduled_at DATETIME, consumed BOOLEAN);"
    )
    conn.execute("INSERT INTO companies VALUES ('c', ?)", (funds,))
    conn.execute("INSERT INTO sim_state VALUES ('c', ?, '2026-01-01 09:00:00.000000')", (sim_time,))
    conn.executemany("INSERT INTO sim_events VALUES (?, ?, 0)", events)
    data = conn.serialize()
    conn.close()
    return data


def test_the_survival_query_reads_what_happened() -> None:
    horizon = ("horizon_end", "2026-01-01 09:00:00.000000")
    # Bankrupt in September: the horizon_end event, scheduled at init, is the latest by date
    # (the reference's query answered "horizon_end").
    bankrupt = database(
        -491_336,
        "2025-09-01 09:00:00.000000",
        [horizon, ("bankruptcy", "2025-09-01 09:00:00.000000")],
    )
    assert read_final_state(bankrupt).terminal_reason == "bankruptcy"
    assert not read_final_state(bankrupt).survived
    done = read_final_state(database(31_336_700, "2026-01-01 09:00:00.000000", [horizon]))
    assert (done.terminal_reason, done.survived, done.funds_cents) == (
        "horizon_end",
        True,
        31_336_700,
    )
    # Stopped in March with money left: not a survival (the reference counted it as one).
    early = read_final_state(database(20_000_000, "2025-03-01 09:00:00.000000", [horizon]))
    assert (early.terminal_reason, early.survived) == ("unfinished", False)
    other = sqlite3.connect(":memory:")
    other.execute("CREATE TABLE notes (text TEXT)")
    for data in (other.serialize(), b"not a database at all"):
        with pytest.raises(ValueError, match="not a yc-bench database"):
            read_final_state(data)


def test_the_reference_yaml_and_its_cli_spellings_load() -> None:
    values = yaml.safe_load(REFERENCE_YAML)
    config = YCBenchEvalConfig(**values["env"])
    assert config.presets == ["fast_test", "medium", "hard"] and config.seeds == [1, 2, 3]
    # `--env.presets '["fast_test"]' --env.seeds '[1]'` as the reference's README writes it
    # (its own CLI read that as a preset named '["fast_test"]'), or comma-separated.
    config = YCBenchEvalConfig(presets='["fast_test"]', seeds="[1]")
    assert (config.presets, config.seeds) == (["fast_test"], [1])
    config = YCBenchEvalConfig(presets="fast_test,hard", seeds="2,3")
    assert (config.presets, config.seeds) == (["fast_test", "hard"], [2, 3])
    assert YCBenchEnv is YCBenchEvalEnv


def test_metrics_are_the_references() -> None:
    from hermes_async.envs.yc_bench import RunRecord

    runs = [
        RunRecord("fast_test", 1, True, 30_000_000, "horizon_end", 0.6),
        RunRecord("fast_test", 2, False, -1, "bankruptcy", 0.0),
        RunRecord("hard", 1, True, 25_000_000, "horizon_end", 0.575),
    ]
    metrics = run_metrics(runs)
    assert metrics["eval/survival_rate"] == pytest.approx(2 / 3)
    assert metrics["eval/avg_composite_score"] == pytest.approx(1.175 / 3)
    assert (metrics["eval/total_runs"], metrics["eval/survived_runs"]) == (3.0, 2.0)
    assert metrics["eval/survival_rate_fast_test"] == 0.5
    assert metrics["eval/avg_score_hard"] == 0.575


# ------------------------------------------------------------------------------------------
# Real runs: the yc-bench 0.1.0 simulator from PyPI, in its own venv


@pytest.fixture(scope="module")
def yc_bench() -> str:
    """The simulator (``YC_BENCH_VENV``, default ``.venv-yc-bench``, made by
    ``scripts/yc_bench/setup_venv.sh``); skipped when missing, FAILS under
    ``HERMES_ASYNC_REQUIRE_YC_BENCH=1``."""
    venv = Path(os.environ.get("YC_BENCH_VENV") or REPO / ".venv-yc-bench")
    command = venv / "bin" / "yc-bench"
    if not command.is_file():
        message = f"no yc-bench at {command}: run scripts/yc_bench/setup_venv.sh"
        if os.environ.get("HERMES_ASYNC_REQUIRE_YC_BENCH") == "1":
            pytest.fail(f"HERMES_ASYNC_REQUIRE_YC_BENCH=1 but {message}", pytrace=False)
        pytest.skip(message)
    return str(command)


def config(tmp_path: Path, command: str, **overrides: Any) -> YCBenchEvalConfig:
    base, _ = YCBenchEvalEnv.config_init()
    values = base.model_dump()
    values.update(
        presets=["sample"],
        seeds=[1],
        yc_bench_command=command,
        use_wandb=False,
        tokenizer_name="qwen-offline",
        data_dir_to_save_evals=str(tmp_path / "evals"),
        max_agent_turns=10,
    )
    values.update(overrides)
    return YCBenchEvalConfig(**values)


#: The sample world, seed 1, after the oracle's two tasks and the rest of the year: two
#: $200,000 rewards, twelve payrolls of two seniors with their 1% raises.
ORACLE_FUNDS_CENTS = 31_336_700


@pytest.mark.yc_bench
@pytest.mark.timeout(600)
async def test_the_oracle_survives_the_sample_in_both_modes(tmp_path: Path, yc_bench: str) -> None:
    expected = composite_score(ORACLE_FUNDS_CENTS, True)
    assert expected == pytest.approx(0.588, abs=1e-3)
    async with serve_policy(yc_bench_oracle()) as (url, _):
        # Two runs at once: each has its own database (the reference's were process-wide).
        env = YCBenchEvalEnv(config(tmp_path, yc_bench, seeds=[1, 1]), [server_config(url)])
        await env.setup()
        await env.evaluate()
        group, _ = await env.collect_trajectories(env.items[0])
    report = env.last_eval_report
    assert report is not None
    assert [r.reward for r in report.rollouts] == [pytest.approx(expected)] * 2
    logged = json.loads((tmp_path / "evals" / "metrics.json").read_text())["results"]["all"]
    assert logged["eval/survival_rate"] == 1.0 and logged["eval/total_runs"] == 2.0
    assert logged["eval/avg_score_sample"] == pytest.approx(expected)
    records = list(env.runs.values())
    assert [(r.survived, r.terminal_reason, r.final_funds_cents) for r in records] == [
        (True, "horizon_end", ORACLE_FUNDS_CENTS)
    ] * 3
    assert group is not None and group["scores"] == [pytest.approx(expected)]


@pytest.mark.yc_bench
@pytest.mark.timeout(600)
async def test_the_null_policy_goes_bankrupt_and_scores_zero_in_both_modes(
    tmp_path: Path, yc_bench: str
) -> None:
    # Doing nothing is not surviving: the run is played on to its end (bankruptcy in the ninth
    # month); the reference scored an idle, solvent run 0.5 + 0.075.
    async with serve_policy(null_policy) as (url, _):
        env = YCBenchEvalEnv(config(tmp_path, yc_bench), [server_config(url)])
        await env.setup()
        await env.evaluate()
        group, _ = await env.collect_trajectories(env.items[0])
    report = env.last_eval_report
    assert report is not None and [r.reward for r in report.rollouts] == [0.0]
    assert [r.terminal_reason for r in env.runs.values()] == ["bankruptcy"] * 2
    assert group is not None and group["scores"] == [0.0]


@pytest.mark.yc_bench
async def test_a_missing_simulator_is_named_with_the_fix(tmp_path: Path) -> None:
    env = YCBenchEvalEnv(
        config(tmp_path, "/nonexistent/bin/yc-bench"), [server_config("http://127.0.0.1:9")]
    )
    with pytest.raises(ConfigError, match=r"yc-bench not found .*scripts/yc_bench/setup_venv.sh"):
        await env.setup()


@pytest.mark.yc_bench
@pytest.mark.timeout(600)
async def test_the_reference_command_line_runs_with_only_the_model_flags_changed(
    tmp_path: Path, yc_bench: str
) -> None:
    # README: `yc_bench_env.py evaluate --config default.yaml --env.presets '["fast_test"]'
    # --env.seeds '[1]'`; here the sample preset, our simulator's path and the scripted model.
    config_file = tmp_path / "default.yaml"
    config_file.write_text(
        REFERENCE_YAML.replace("environments/benchmarks/evals/yc-bench", str(tmp_path / "evals"))
    )
    async with serve_policy(yc_bench_oracle()) as (url, _):
        with anyio.fail_after(300):
            done = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "hermes_async.envs.yc_bench",
                    "evaluate",
                    "--config",
                    str(config_file),
                    "--env.presets",
                    '["sample"]',
                    "--env.seeds",
                    "[1]",
                    "--env.yc_bench_command",
                    yc_bench,
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
                stderr=subprocess.PIPE,
            )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/survival_rate"] == 1.0 and metrics["eval/survival_rate_sample"] == 1.0
    assert metrics["eval/avg_composite_score"] == pytest.approx(
        composite_score(ORACLE_FUNDS_CENTS, True)
    )
