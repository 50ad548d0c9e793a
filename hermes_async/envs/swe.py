"""HermesSweEnv: the reference's SWE-style training environment (HumanEval-shaped tasks).

The model gets a coding task and terminal, file and web tools in a sandbox working in
``/workspace``. The reward runs the item's tests on the model's ``solution_file``: 1.0 if they
pass, 0.1 for any new Python file, else 0.0. Usage and the reference's bugs fixed:
docs/environments.md.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from hermes_async.agent import AgentResult, ToolContext
from hermes_async.envs._atropos import APIServerConfig
from hermes_async.envs._datasets import DatasetOptions, load_rows
from hermes_async.envs._examples import CyclingItems
from hermes_async.envs.base import HermesAgentBaseEnv
from hermes_async.envs.config import HermesAgentEnvConfig
from hermes_async.envs.results import EvalReport
from hermes_async.envs.samples import SWE_SAMPLE
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = ("WORKSPACE", "HermesSweEnv", "HermesSweEnvConfig", "reward_program")

#: Where the model works (the sandbox's working directory).
WORKSPACE = "/workspace"
#: Made before the model's first turn; the Python files newer than it earn partial credit.
START_MARKER = '"${TMPDIR:-/tmp}/.hermes_swe_start"'
#: The tests as the reward writes them, in the workspace.
TEST_FILE = ".hermes_swe_test.py"
#: Test text fields, in the reference's order of preference.
TEST_FIELDS = ("test", "test_code", "tests")

SYSTEM_PROMPT = (
    "You are a skilled software engineer. You have access to a terminal, file tools, and web "
    "search. Use these tools to complete the coding task. Write clean, working code and "
    "verify it runs correctly before finishing."
)


class HermesSweEnvConfig(HermesAgentEnvConfig, DatasetOptions):
    """HermesSweEnv's options: the reference's (it added none) and these."""

    dataset_config: str | None = Field(
        default=None,
        description="HF dataset configuration (bigcode/humanevalpack: 'python' when unset).",
    )
    solution_file: str = Field(
        default="solution.py", description="Where the model saves its solution (in /workspace)."
    )
    test_timeout: int = Field(default=60, gt=0, description="Seconds the tests may run.")


def _tests(item: dict[str, Any]) -> str:
    return next((str(item[k]) for k in TEST_FIELDS if item.get(k)), "")


def reward_program(item: dict[str, Any], solution_file: str) -> str:
    """The test file the reward runs: the model's solution loaded, then the item's tests.

    The solution's names are visible to the tests, as in HumanEval's harness; its
    ``__main__`` block stays off. ``check(entry_point)`` is appended when the tests only
    define ``check`` (openai_humaneval's rows).
    """
    test = _tests(item)
    entry = str(item.get("entry_point") or "")
    lines = [
        str(item.get("import") or ""),
        "import runpy",
        f"globals().update(runpy.run_path({solution_file!r}))",
        str(item.get("test_setup") or ""),
        test,
    ]
    if entry and re.search(r"^def check\(", test, re.M) and not re.search(r"^check\(", test, re.M):
        lines.append(f"check({entry})")
    return "\n".join(line for line in lines if line) + "\n"


class HermesSweEnv(CyclingItems, HermesAgentBaseEnv):
    """Coding tasks rewarded by their tests, run on the model's files in its sandbox.

    Subclass it per dataset and override :meth:`format_prompt` / :meth:`compute_reward`.
    """

    name = "hermes-swe"
    env_config_cls = HermesSweEnvConfig
    train_buffers = ("reward_buffer",)

    @classmethod
    def config_init(cls) -> tuple[HermesSweEnvConfig, list[APIServerConfig]]:
        """The reference's defaults (Modal sandboxes, humanevalpack, groups of 4)."""
        config = HermesSweEnvConfig(
            enabled_toolsets=["terminal", "file", "web"],
            max_agent_turns=30,
            max_token_length=4096,
            agent_temperature=1.0,
            system_prompt=SYSTEM_PROMPT,
            terminal_backend="modal",
            dataset_name="bigcode/humanevalpack",
            dataset_split="test",
            prompt_field="prompt",
            group_size=4,
            tool_call_parser="hermes",
            steps_per_eval=50,
            total_steps=500,
            use_wandb=True,
            wandb_name="hermes-swe",
        )
        server = APIServerConfig(
            base_url="http://localhost:8000/v1",
            model_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
            server_type="openai",  # Phase 1; vllm for Phase 2
            api_key="x",
            health_check=False,
        )
        return config, [server]

    @property
    def swe_config(self) -> HermesSweEnvConfig:
        config = self.config
        if not isinstance(config, HermesSweEnvConfig):
            raise ConfigError(
                f"HermesSweEnv needs a HermesSweEnvConfig, got {type(config).__name__}"
            )
        return config

    async def setup(self) -> None:
        """Load ``dataset_path``, the hub dataset, or the built-in sample (in order).

        **Cancellation**: a load already in its thread finishes there, unused.
        """
        cfg = self.swe_config
        name_config = cfg.dataset_config
        if name_config is None and cfg.dataset_name == "bigcode/humanevalpack":
            name_config = "python"  # the reference passed none, which this dataset refuses
        loaded = await load_rows(
            path=cfg.dataset_path,
            name=cfg.dataset_name,
            split=cfg.dataset_split,
            config=name_config,
            sample=SWE_SAMPLE,
            require=cfg.require_dataset,
            timeout=cfg.dataset_load_timeout,
        )
        if not loaded.rows:
            raise ConfigError(f"no rows in {loaded.source}")
        self.items: list[dict[str, Any]] = loaded.rows
        self.train_items = self.items
        self.data_source = loaded.source
        self._index = 0
        self.reward_buffer: list[float] = []
        self.last_eval_report: EvalReport | None = None

    def format_prompt(self, item: dict[str, Any]) -> str:
        """The reference's prompt (the item's prompt, then its tests), and where to write."""
        cfg = self.swe_config
        prompt = str(item.get(cfg.prompt_field, ""))
        tests = _tests(item)
        if tests:
            prompt += f"\n\nTests to pass:\n{tests}"
        return prompt + f"\n\nSave your solution as {cfg.solution_file} in the working directory."

    def sandbox_spec(self, item: Any) -> SandboxSpec:
        """Every rollout works in ``/workspace`` (created; the reference never made it)."""
        return SandboxSpec(workdir=WORKSPACE)

    async def setup_sandbox(self, item: Any, sandbox: Sandbox) -> None:
        """Make the start marker the partial credit compares against.

        **Cancellation**: the command is killed; the sandbox is released by the rollout core.
        """
        result = await sandbox.exec(f"touch {START_MARKER}", timeout=30)
        if result.exit_code != 0:
            raise SandboxError(f"cannot create the start marker: {result.output.strip()[:300]}")

    async def compute_reward(
        self, item: dict[str, Any], result: AgentResult, ctx: ToolContext
    ) -> float:
        """1.0 if the item's tests pass in ``/workspace``, else 0.1 for any new Python file.

        **Cancellation**: the test process is killed; the sandbox is released by the caller.
        """
        cfg = self.swe_config
        sandbox = await ctx.manager.get(ctx.task_id)
        written = await sandbox.exec(
            f"find . -name '*.py' -newer {START_MARKER} 2>/dev/null | head -5", timeout=30
        )
        reward = 0.1 if written.exit_code == 0 and written.stdout.strip() else 0.0
        if _tests(item):
            await sandbox.write_bytes(TEST_FILE, reward_program(item, cfg.solution_file).encode())
            run = await sandbox.exec(f"python3 {TEST_FILE}", timeout=cfg.test_timeout)
            if run.exit_code == 0:
                reward = 1.0
        if not self.is_evaluating:
            self.reward_buffer.append(reward)
        return reward

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """The agent loop on the first ``eval_size`` items; :meth:`run_agent_eval`'s metrics.

        **Cancellation**: every eval rollout is cancelled and its sandbox released.
        """
        size = self.config.eval_size
        items = self.items[:size] if size else self.items
        self.last_eval_report = await self.run_agent_eval(items, task_name="hermes_swe_eval")

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """``train/avg_reward`` and ``train/pass_rate`` (share of 1.0), then the base's.

        **Cancellation**: nothing to clean up.
        """
        metrics = dict(wandb_metrics or {})
        rewards = getattr(self, "reward_buffer", [])
        if rewards:
            metrics["train/avg_reward"] = sum(rewards) / len(rewards)
            metrics["train/pass_rate"] = sum(1 for r in rewards if r == 1.0) / len(rewards)
            rewards.clear()
        await super().wandb_log(metrics)


if __name__ == "__main__":
    HermesSweEnv.cli()
