"""TerminalTestEnv: the smallest useful agent environment (copy it to start your own).

The model gets a terminal and file tools and a task like "write 579 to ~/answer.txt"; the
reward ``cat``s that file in the rollout's own sandbox: 1.0 for an exact match, 0.5 if the
text is contained, 0.0 otherwise (the reference's rule). Run it like any atroposlib
environment, or offline with ``hermes-async demo``::

    python -m hermes_async.envs.terminal_test process --env.total_steps 3 \\
        --openai.base_url http://127.0.0.1:8000/v1 --openai.server_type vllm
    python -m hermes_async.envs.terminal_test evaluate --env.data_dir_to_save_evals evals/
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hermes_async.agent import AgentResult, ToolContext
from hermes_async.envs._atropos import APIServerConfig
from hermes_async.envs._examples import CyclingItems, example_configs
from hermes_async.envs.base import HermesAgentBaseEnv
from hermes_async.envs.config import HermesAgentEnvConfig
from hermes_async.envs.results import EvalReport
from hermes_async.testing.scripted_server import hermes_tool_call

__all__ = (
    "EVAL_TASKS",
    "ORACLE_COMMANDS",
    "TRAIN_TASKS",
    "TerminalTestEnv",
    "TerminalTestEnvConfig",
    "terminal_test_oracle",
)

#: Training tasks (the reference's three, with its expected contents).
TRAIN_TASKS: list[dict[str, str]] = [
    {
        "name": "greeting",
        "prompt": "Create a file at ~/greeting.txt containing exactly the text: "
        "Hello from Hermes Agent",
        "verify_path": "~/greeting.txt",
        "expected": "Hello from Hermes Agent",
    },
    {
        "name": "count",
        "prompt": "Create a file at ~/count.txt containing the numbers 1 to 5, one per line.",
        "verify_path": "~/count.txt",
        "expected": "1\n2\n3\n4\n5",
    },
    {
        "name": "answer",
        "prompt": "Compute 123 + 456 and write only the result to ~/answer.txt.",
        "verify_path": "~/answer.txt",
        "expected": "579",
    },
]

#: Evaluation tasks (the reference's one).
EVAL_TASKS: list[dict[str, str]] = [
    {
        "name": "result",
        "prompt": "Compute 6 * 7 and write only the result to ~/result.txt.",
        "verify_path": "~/result.txt",
        "expected": "42",
    },
]

#: What the oracle model runs for each task (it computes with the shell, it does not copy the
#: expected answer).
ORACLE_COMMANDS: dict[str, str] = {
    "greeting": "printf '%s\\n' 'Hello from Hermes Agent' > ~/greeting.txt",
    "count": "seq 1 5 > ~/count.txt",
    "answer": "echo $((123 + 456)) > ~/answer.txt",
    "result": "echo $((6 * 7)) > ~/result.txt",
}

SYSTEM_PROMPT = (
    "You are a helpful assistant with access to a terminal and file tools. Complete the task "
    "using the tools, check your work, then answer briefly."
)


class TerminalTestEnvConfig(HermesAgentEnvConfig):
    """TerminalTestEnv's config: the base's fields (a subclass adds its own here)."""


class TerminalTestEnv(CyclingItems, HermesAgentBaseEnv):
    """File-writing tasks verified in the sandbox; the minimal end-to-end environment."""

    name = "terminal_test"
    env_config_cls = TerminalTestEnvConfig
    # Training rewards for wandb_log; listed here so an evaluation never leaves its own there.
    train_buffers = ("reward_buffer", "partial_buffer")

    @classmethod
    def config_init(cls) -> tuple[TerminalTestEnvConfig, list[APIServerConfig]]:
        """Defaults: terminal + file tools, 10 turns, groups of 3, local sandboxes, local vLLM."""
        return example_configs(
            TerminalTestEnvConfig,
            max_agent_turns=10,
            agent_temperature=1.0,
            system_prompt=SYSTEM_PROMPT,
            group_size=3,
            steps_per_eval=3,
            total_steps=3,
            ensure_scores_are_not_same=False,
            tool_call_parser="hermes",
        )

    async def setup(self) -> None:
        """Load the inline tasks; reset the metric buffers.

        **Cancellation**: nothing to clean up.
        """
        self.train_items = list(TRAIN_TASKS)
        self.eval_items = list(EVAL_TASKS)
        self._index = 0
        self.reward_buffer: list[float] = []
        self.partial_buffer: list[float] = []
        self.last_eval_report: EvalReport | None = getattr(self, "last_eval_report", None)

    def format_prompt(self, item: dict[str, str]) -> str:
        return item["prompt"]

    async def compute_reward(
        self, item: dict[str, str], result: AgentResult, ctx: ToolContext
    ) -> float:
        """``cat`` the task's file in the rollout's sandbox and compare.

        **Cancellation**: the ``cat`` is killed; the sandbox is released by the base class.
        """
        out = await ctx.terminal(f"cat {item['verify_path']}", timeout=30)
        if out.get("exit_code") != 0:
            reward = 0.0
        else:
            text = str(out.get("output", "")).strip()
            expected = item["expected"]
            reward = 1.0 if text == expected else (0.5 if expected in text else 0.0)
        if not self.is_evaluating:
            self.reward_buffer.append(reward)
            self.partial_buffer.append(1.0 if reward == 0.5 else 0.0)
        return reward

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Full agent loop with tools on the eval tasks (the reference ran one bare completion).

        **Cancellation**: every eval rollout is cancelled and its sandbox released.
        """
        self.last_eval_report = await self.run_agent_eval(
            self.eval_items, task_name="terminal_test_eval"
        )

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """Training reward metrics (``train/avg_reward``, ``accuracy``, ...), then the base's.

        **Cancellation**: nothing to clean up.
        """
        metrics = dict(wandb_metrics or {})
        rewards = getattr(self, "reward_buffer", [])
        if rewards:
            n = len(rewards)
            metrics["train/avg_reward"] = sum(rewards) / n
            metrics["train/accuracy"] = sum(1 for r in rewards if r == 1.0) / n
            metrics["train/partial_match_rate"] = sum(self.partial_buffer) / n
            metrics["train/total_rollouts"] = n
            rewards.clear()
            self.partial_buffer.clear()
        await super().wandb_log(metrics)


def terminal_test_oracle() -> Callable[[Any], str]:
    """A scripted policy that solves every TerminalTestEnv task: run, read back, answer.

    It recognizes the task by the user prompt; an unknown prompt gets a plain reply.
    """
    by_prompt = {t["prompt"]: t for t in [*TRAIN_TASKS, *EVAL_TASKS]}

    def policy(request: Any) -> str:
        messages = list(request.messages)
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            return "I have no task."
        prompt = str(messages[users[-1]].get("content") or "").strip()
        task = by_prompt.get(prompt)
        if task is None:
            return "I do not know this task."
        steps = sum(1 for m in messages[users[-1] :] if m.get("role") == "tool")
        if steps == 0:
            return "I'll write the file.\n" + hermes_tool_call(
                "terminal", {"command": ORACLE_COMMANDS[task["name"]]}
            )
        if steps == 1:
            return hermes_tool_call("read_file", {"path": task["verify_path"]})
        return f"Done: {task['verify_path']} is written and checked."

    return policy


if __name__ == "__main__":
    TerminalTestEnv.cli()
