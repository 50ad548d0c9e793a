"""Drop-in proof: an environment written exactly in the reference's documented style.

``ReferenceStyleEnv`` follows the published guide for hermes-agent environments (subclass,
config class with ``Field``s, ``config_init``, ``setup`` / ``get_next_item`` /
``format_prompt`` / ``compute_reward`` / ``evaluate`` / ``wandb_log``, an ``evaluate`` that
builds ``HermesAgentLoop(server=self.server, ...)`` and ``ToolContext(task_id)`` itself and
calls ``ctx.cleanup()`` in a ``finally``). The only changes from the reference: the import
paths and ``await`` in front of the ``ctx.terminal(...)`` calls.
"""

from __future__ import annotations

import contextlib
import gc
import json
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from pydantic import Field

from hermes_async.agent_loop import AgentResult, HermesAgentLoop
from hermes_async.envs import base as base_module
from hermes_async.envs.base import HermesAgentBaseEnv, HermesAgentEnvConfig
from hermes_async.gc_tuning import DEFAULT_YOUNG_THRESHOLD
from hermes_async.testing.scripted_server import PolicyRequest
from hermes_async.tool_context import ToolContext
from tests.envs.helpers import serve_policy, with_factory
from tests.support import RecordingFactory, tool_call

pytestmark = pytest.mark.anyio

BUILTIN_SAMPLES = [
    {"question": "Save the word 'alpha' to ~/word.txt", "path": "~/word.txt", "answer": "alpha"},
    {"question": "Save the word 'beta' to ~/word.txt", "path": "~/word.txt", "answer": "beta"},
    {"question": "Save the word 'gamma' to ~/word.txt", "path": "~/word.txt", "answer": "gamma"},
]

SERVER_URL = "http://127.0.0.1:9/v1"  # replaced by the test


class MyEnvConfig(HermesAgentEnvConfig):
    eval_size: int = Field(default=2, description="Number of eval items")


class MyEnv(HermesAgentBaseEnv):
    name = "my-env"
    env_config_cls = MyEnvConfig

    @classmethod
    def config_init(cls):  # type: ignore[no-untyped-def]
        env_config = MyEnvConfig(
            enabled_toolsets=["terminal", "file"],
            max_agent_turns=5,
            agent_temperature=1.0,
            system_prompt="You are a careful assistant with a terminal.",
            group_size=2,
            total_steps=2,
            steps_per_eval=10,
            use_wandb=False,
            ensure_scores_are_not_same=False,
        )
        server_configs = [
            APIServerConfig(
                base_url=SERVER_URL,
                model_name="scripted",
                server_type="openai",
                api_key="x",
                health_check=False,
            )
        ]
        return env_config, server_configs

    async def setup(self):  # type: ignore[no-untyped-def]
        """Called once at startup. Load datasets, initialize state."""
        try:
            raise RuntimeError("no network in tests")  # stands for load_dataset(...)
        except Exception:
            self._items = list(BUILTIN_SAMPLES)
        random.shuffle(self._items)
        self._eval_items = self._items[:2]
        self._items = self._items[2:] + self._items[:2]
        self._index = 0
        self._reward_buffer = []

    async def get_next_item(self):  # type: ignore[no-untyped-def]
        item = self._items[self._index % len(self._items)]
        self._index += 1
        return item

    def format_prompt(self, item):  # type: ignore[no-untyped-def]
        return item["question"]

    async def compute_reward(self, item, result: AgentResult, ctx: ToolContext) -> float:  # type: ignore[no-untyped-def]
        final_response = ""
        tools_used = []
        for msg in reversed(result.messages):
            if msg.get("role") == "assistant" and msg.get("content") and not final_response:
                final_response = msg["content"]
            if msg.get("role") == "assistant" and msg.get("tool_calls"):
                for tc in msg["tool_calls"]:
                    fn = tc.get("function", {}) if isinstance(tc, dict) else {}
                    name = fn.get("name", "")
                    if name:
                        tools_used.append(name)
        out = await ctx.terminal(f"cat {item['path']}")
        if out["exit_code"] != 0:
            reward = 0.0
        else:
            reward = 1.0 if out["output"].strip() == item["answer"] else 0.0
        if "terminal" in tools_used and final_response:
            reward = min(1.0, reward)
        self._reward_buffer.append(reward)
        return reward

    async def evaluate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        start_time = time.time()
        tools, valid_names = self._resolve_tools_for_group()
        samples = []
        for item in self._eval_items[: self.config.eval_size]:
            task_id = str(uuid.uuid4())
            messages = []
            if self.config.system_prompt:
                messages.append({"role": "system", "content": self.config.system_prompt})
            messages.append({"role": "user", "content": self.format_prompt(item)})
            agent = HermesAgentLoop(
                server=self.server,
                tool_schemas=tools,
                valid_tool_names=valid_names,
                max_turns=self.config.max_agent_turns,
                task_id=task_id,
                temperature=0.0,
                max_tokens=self.config.max_token_length,
                extra_body=self.config.extra_body,
            )
            result = await agent.run(messages)
            ctx = ToolContext(task_id)
            try:
                reward = await self.compute_reward(item, result, ctx)
            finally:
                ctx.cleanup()
            samples.append(
                {
                    "prompt": item["question"],
                    "response": result.messages[-1]["content"],
                    "reward": reward,
                }
            )
        eval_metrics = {"eval/mean_reward": sum(s["reward"] for s in samples) / len(samples)}
        self.eval_metrics = eval_metrics
        await self.evaluate_log(
            metrics=eval_metrics, samples=samples, start_time=start_time, end_time=time.time()
        )

    async def wandb_log(self, wandb_metrics=None):  # type: ignore[no-untyped-def]
        if wandb_metrics is None:
            wandb_metrics = {}
        if self._reward_buffer:
            n = len(self._reward_buffer)
            wandb_metrics["train/mean_reward"] = sum(self._reward_buffer) / n
            self._reward_buffer.clear()
        await super().wandb_log(wandb_metrics)


def word_oracle(request: PolicyRequest) -> str:
    users = [m for m in request.messages if m.get("role") == "user"]
    question = str(users[-1]["content"]) if users else ""
    word = question.split("'")[1] if "'" in question else "?"
    steps = sum(1 for m in request.messages if m.get("role") == "tool")
    if steps == 0:
        return tool_call("terminal", {"command": f"echo {word} > ~/word.txt"})
    return f"Saved {word}."


@pytest.mark.filterwarnings("ignore:Trainer requested to ignore max length")
@pytest.mark.parametrize("server_type", ["openai", "vllm"], ids=["chat-server", "token-server"])
async def test_reference_style_env_runs_unchanged(
    tmp_path: Path, server_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory = RecordingFactory(tmp_path / "sandboxes")
    tuned_thresholds: list[tuple[int, int, int]] = []
    real_tuning = base_module.gc_tuned_for_rollouts

    @contextlib.contextmanager
    def recording_tuning() -> Iterator[object]:
        with real_tuning() as state:
            tuned_thresholds.append(gc.get_threshold())
            yield state

    monkeypatch.setattr(base_module, "gc_tuned_for_rollouts", recording_tuning)
    thresholds_before = gc.get_threshold()
    async with serve_policy(word_oracle) as (url, _):
        env_config, server_configs = MyEnv.config_init()
        env_config.data_dir_to_save_evals = str(tmp_path / "evals")
        env_config.data_path_to_save_groups = str(tmp_path / "groups.jsonl")
        server_configs[0].base_url = url + "/v1"
        server_configs[0].server_type = server_type
        env = MyEnv(env_config, server_configs)
        with_factory(env, factory)
        # The reference's phase check, which its Terminal-Bench env called itself.
        assert env._use_managed_server() is (server_type == "vllm")
        env.process_mode = True
        env.n_groups_to_process = 2
        env.group_size_to_process = 2
        # `evaluate` mode: the reference-style loop over self.server (atroposlib's manager,
        # chat completions) with ToolContext(task_id) and a bare ctx.cleanup().
        await env._run_evaluate()
        assert env.eval_metrics == {"eval/mean_reward": 1.0}
        # `process` mode: groups through the base class, JSONL and HTML written.
        await env.process_manager()
    groups = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and all(g["scores"] == [1.0, 1.0] for g in groups)
    assert (tmp_path / "groups.html").is_file()
    assert json.loads((tmp_path / "evals" / "metrics.json").read_text())["results"]["all"] == {
        "eval/mean_reward": 1.0
    }
    assert len(factory.created) == 2 + 4 and factory.leftovers() == []
    # Both entry points ran with the collector tuned for rollouts, and restored it afterwards.
    assert [t[0] for t in tuned_thresholds] == [DEFAULT_YOUNG_THRESHOLD] * 2
    assert gc.get_threshold() == thresholds_before
