"""WebResearchEnv: the reward's arithmetic, the judge apart from the policy, the fake web, and
the oracle and null policies on the built-in sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from hermes_async.agent import AgentResult
from hermes_async.envs.samples import WEB_RESEARCH_SAMPLE
from hermes_async.envs.web_research import (
    WebResearchEnv,
    WebResearchEnvConfig,
    cited_domains,
    efficiency_score,
    heuristic_score,
    parse_judge_score,
)
from hermes_async.testing.benchmarks import (
    null_policy,
    open_web_research_world,
    web_research_oracle,
)
from hermes_async.testing.scripted_server import FixedScript
from tests.envs.helpers import serve_policy, server_config

pytestmark = pytest.mark.anyio

ROWS = [json.loads(line) for line in WEB_RESEARCH_SAMPLE.read_text().splitlines()]

#: datagen-config-examples/web_research.yaml's environment part and the env's documented
#: defaults, as a config file for the reference env.
REFERENCE_YAML = """\
env:
  enabled_toolsets: ["web", "file"]
  max_agent_turns: 15
  agent_temperature: 1.0
  group_size: 4
  total_steps: 1000
  steps_per_eval: 100
  use_wandb: true
  wandb_name: "web-research"
  correctness_weight: 0.6
  tool_usage_weight: 0.2
  efficiency_weight: 0.2
  diversity_bonus: 0.1
  efficient_max_calls: 5
  heavy_penalty_calls: 10
  eval_size: 20
  eval_split_ratio: 0.1
  dataset_name: "google/frames-benchmark"
  system_prompt: >
    You are a highly capable research agent. When asked a factual question, always use
    web_search to find current, accurate information before answering. Cite at least 2
    sources. Be concise and accurate.
openai:
  base_url: "https://openrouter.ai/api/v1"
  model_name: "anthropic/claude-sonnet-4.5"
  server_type: "openai"
  health_check: false
"""


def config(tmp_path: Path, **overrides: Any) -> WebResearchEnvConfig:
    base, _ = WebResearchEnv.config_init()
    values = base.model_dump()
    values.update(
        use_wandb=False,
        group_size=2,
        dataset_name=None,
        tokenizer_name="qwen-offline",
        data_dir_to_save_evals=str(tmp_path / "evals"),
        terminal_backend="local",
    )
    values.update(overrides)
    return WebResearchEnvConfig(**values)


@pytest.fixture
async def world(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """The fake web (the web tools' provider) and the scripted judge; yields the judge's URL."""
    async with open_web_research_world() as (web_url, judge_url):
        monkeypatch.setenv("TAVILY_API_KEY", "fake")
        monkeypatch.setenv("TAVILY_BASE_URL", web_url)
        yield judge_url


def test_the_parts_follow_the_references_rules() -> None:
    assert [efficiency_score(n, 5, 10) for n in (0, 5, 6, 10)] == pytest.approx(
        [1.0, 1.0, 0.92, 0.6]
    )
    assert efficiency_score(11, 5, 10) == pytest.approx(0.28)
    assert efficiency_score(20, 5, 10) == 0.0
    # removeprefix, not lstrip("www."): web.dev keeps its w; the port is not part of it.
    text = "See https://www.web.dev/a, https://web.dev/b and (http://wiki.org:8080/x)."
    assert cited_domains(text) == {"web.dev", "wiki.org"}
    assert parse_judge_score('```json\n{"score": 0.7, "reason": "ok"}\n```') == 0.7
    assert parse_judge_score('Sure! {"score": 0.4, "reason": "partly"} done') == 0.4
    assert parse_judge_score('{"score": 3}') is None and parse_judge_score("no") is None
    assert heuristic_score("Salzburg", "It was in Salzburg, Austria.") == pytest.approx(0.8)
    assert heuristic_score("the a", "anything") == 0.5


def answer(text: str, calls: list[str]) -> AgentResult:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    for i, name in enumerate(calls):
        call = {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "{}"},
        ]
    messages.append({"role": "assistant", "content": text})
    return AgentResult(messages=messages, turns_used=len(calls) + 1)


class _Ctx:
    task_id = "t"


async def test_the_reward_is_the_references_sum_with_a_judge_of_its_own(tmp_path: Path) -> None:
    judge = FixedScript(['{"score": 0.7, "reason": "mostly"}', "not json at all"], repeat=True)
    item = {"question": ROWS[0]["Prompt"], "answer": "Salzburg"}
    async with serve_policy(judge) as (judge_url, judge_server):
        env = WebResearchEnv(
            config(tmp_path, judge_base_url=judge_url + "/v1"), [server_config("http://x:9")]
        )
        await env.setup()
        # The reference's worked example: 0.7 judged, web used, 4 tool calls, 2 domains.
        cited = (
            "Salzburg, per https://en.wikipedia.org/wiki/Mozart and https://www.britannica.com/x"
        )
        result = answer(cited, ["web_search", "web_extract", "web_search", "read_file"])
        reward = await env.compute_reward(item, result, _Ctx())  # type: ignore[arg-type]
        assert reward == pytest.approx(0.42 + 0.2 + 0.2 + 0.1)
        assert env.parts["t"].judged and env.parts["t"].tool_calls == 4
        # Efficiency counts tool calls: 7 in 2 turns (the reference counted the 2 turns).
        result = answer("Salzburg", ["web_search"] * 7)
        result.turns_used = 2
        reward = await env.compute_reward(item, result, _Ctx())  # type: ignore[arg-type]
        # An unreadable judge reply: the heuristic (0.6 x recall + 0.4 x Jaccard = 1.0).
        assert not env.parts["t"].judged and env.judge_failures == 1
        assert reward == pytest.approx(0.6 * 1.0 + 0.2 + 0.2 * 0.84)
    prompts = [r.body["messages"][0]["content"] for r in judge_server.requests]
    assert len(prompts) == 2 and "Reference answer: Salzburg" in prompts[0]
    # No web tool: no efficiency credit either (the reference paid 0.2 for a refusal).
    result = answer("I will not look it up.", [])
    reward = await env.compute_reward(item, result, _Ctx())  # type: ignore[arg-type]
    assert env.parts["t"].efficiency == 1.0 and reward == pytest.approx(0.0)


async def test_the_oracle_scores_one_and_the_null_policy_zero_in_both_modes(
    tmp_path: Path, world: str
) -> None:
    for policy, expected in ((web_research_oracle(), 1.0), (null_policy, 0.0)):
        async with serve_policy(policy) as (url, policy_server):
            env = WebResearchEnv(
                config(tmp_path, judge_base_url=world, data_dir_to_save_evals=None),
                [server_config(url)],
            )
            await env.setup()
            await env.evaluate()
            groups = [(await env.collect_trajectories(item))[0] for item in env.train_items]
        report = env.last_eval_report
        assert report is not None and [r.reward for r in report.rollouts] == [expected] * 2
        assert [g["scores"] for g in groups] == [[expected] * 2] * 4
        assert all("judge" not in str(r.body) for r in policy_server.requests)
        if expected:  # one search; the answer cites Wikipedia and Britannica
            parts = list(env.parts.values())
            assert {(p.correctness, p.tool_calls, p.diversity, p.judged) for p in parts} == {
                (1.0, 1, 0.1, True)
            }


async def test_the_split_is_seeded_and_frames_rows_become_items(tmp_path: Path) -> None:
    env = WebResearchEnv(config(tmp_path), [server_config("http://x:9")])
    await env.setup()
    again = WebResearchEnv(config(tmp_path), [server_config("http://x:9")])
    await again.setup()
    assert env.eval_items == again.eval_items and len(env.eval_items) == 2
    assert len(env.train_items) == 4 and env.data_source == "built-in sample"
    assert env.eval_items[0].keys() == {"question", "answer", "difficulty", "hops"}
    big = tmp_path / "frames.jsonl"
    big.write_text("".join(json.dumps({**ROWS[0], "Prompt": f"q{i}"}) + "\n" for i in range(300)))
    env = WebResearchEnv(config(tmp_path, dataset_path=str(big)), [server_config("http://x:9")])
    await env.setup()
    assert (len(env.eval_items), len(env.train_items)) == (30, 270)  # max(20, 10% of 300)


def test_the_reference_yaml_loads() -> None:
    values = yaml.safe_load(REFERENCE_YAML)
    config = WebResearchEnvConfig(**values["env"])
    assert (config.correctness_weight, config.eval_size) == (0.6, 20)


async def test_the_reference_command_line_runs_with_only_the_model_flags_changed(
    tmp_path: Path,
) -> None:
    # The docstring's `evaluate --openai.base_url ... --openai.model_name ...`, plus the judge
    # (a model of its own now). Offline: the built-in sample for FRAMES (the run says so), the
    # testing kit's fake search provider for the web tools' key and the scripted judge.
    evals = tmp_path / "evals"
    async with (
        open_web_research_world() as (web_url, judge_url),
        serve_policy(web_research_oracle()) as (url, _),
    ):
        with anyio.fail_after(120):
            done = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "hermes_async.envs.web_research",
                    "evaluate",
                    "--openai.base_url",
                    url + "/v1",
                    "--openai.model_name",
                    "scripted",
                    "--openai.server_type",
                    "vllm",
                    "--env.judge_base_url",
                    judge_url,
                    "--env.tokenizer_name",
                    "qwen-offline",
                    "--env.use_wandb",
                    "false",
                    "--env.data_dir_to_save_evals",
                    str(evals),
                ],
                check=False,
                stderr=subprocess.PIPE,
                env={**os.environ, "TAVILY_API_KEY": "fake", "TAVILY_BASE_URL": web_url},
            )
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr[-3000:]
    assert "running the built-in sample of web_research_sample.jsonl instead" in stderr
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/mean_correctness"] == 1.0 and metrics["eval/mean_reward"] == 1.0
    assert metrics["eval/tool_usage_rate"] == 1.0 and metrics["eval/n_items"] == 2.0
