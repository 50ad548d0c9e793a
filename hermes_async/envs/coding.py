"""CodingEnv: write a function, get rewarded by its tests run in the sandbox (HermesSweEnv-like).

The reward writes the item's tests next to the model's ``solution.py`` and runs them in the
rollout's own sandbox: 1.0 if they pass, 0.1 if ``solution.py`` exists but fails, 0.0
otherwise (the reference's partial credit, made to work). Data: a small built-in set, or a
HumanEval-shaped HF dataset (``--env.dataset_name openai/openai_humaneval``).
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable
from typing import Any

from pydantic import Field

from hermes_async.agent import AgentResult, ToolContext
from hermes_async.envs._atropos import APIServerConfig
from hermes_async.envs._examples import CyclingItems, example_configs
from hermes_async.envs.base import HermesAgentBaseEnv
from hermes_async.envs.config import HermesAgentEnvConfig
from hermes_async.envs.results import EvalReport
from hermes_async.errors import ConfigError
from hermes_async.testing.scripted_server import hermes_tool_call

__all__ = ("BUILTIN_TASKS", "CodingEnv", "CodingEnvConfig", "coding_oracle")

#: The built-in tasks: prompt, tests (plain asserts), and a reference solution for the oracle.
BUILTIN_TASKS: list[dict[str, str]] = [
    {
        "name": "add",
        "prompt": "Write a Python function `add(a, b)` that returns the sum of a and b.",
        "test": "from solution import add\nassert add(2, 3) == 5\nassert add(-1, 1) == 0\n",
        "solution": "def add(a, b):\n    return a + b\n",
    },
    {
        "name": "is_palindrome",
        "prompt": "Write a Python function `is_palindrome(s)` that returns True if the string "
        "s reads the same forwards and backwards, ignoring case.",
        "test": "from solution import is_palindrome\nassert is_palindrome('Level')\n"
        "assert not is_palindrome('hermes')\nassert is_palindrome('')\n",
        "solution": "def is_palindrome(s):\n    s = s.lower()\n    return s == s[::-1]\n",
    },
    {
        "name": "fizzbuzz",
        "prompt": "Write a Python function `fizzbuzz(n)` that returns a list of strings for "
        "1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for both, "
        "else the number.",
        "test": "from solution import fizzbuzz\nassert fizzbuzz(5) == ['1', '2', 'Fizz', '4', "
        "'Buzz']\nassert fizzbuzz(15)[-1] == 'FizzBuzz'\n",
        "solution": "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
        "        word = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')\n"
        "        out.append(word or str(i))\n    return out\n",
    },
    {
        "name": "word_count",
        "prompt": "Write a Python function `word_count(text)` that returns a dict mapping each "
        "whitespace-separated word to how often it occurs.",
        "test": "from solution import word_count\nassert word_count('a b a') == {'a': 2, 'b': 1}"
        "\nassert word_count('') == {}\n",
        "solution": "def word_count(text):\n    counts = {}\n    for word in text.split():\n"
        "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
    },
]

SYSTEM_PROMPT = (
    "You are a software engineer with a terminal and file tools. Write the requested code to "
    "solution.py in the current directory, run the tests yourself, then answer briefly."
)


class CodingEnvConfig(HermesAgentEnvConfig):
    """CodingEnv's config."""

    test_timeout: int = Field(default=60, description="Seconds the tests may run.")
    eval_fraction: float = Field(default=0.25, description="Share of items held out for eval.")


class CodingEnv(CyclingItems, HermesAgentBaseEnv):
    """Function-writing tasks, rewarded by running their tests in the sandbox."""

    name = "coding"
    env_config_cls = CodingEnvConfig

    @classmethod
    def config_init(cls) -> tuple[CodingEnvConfig, list[APIServerConfig]]:
        """Defaults: terminal + file tools, 15 turns, groups of 4, local sandboxes."""
        return example_configs(
            CodingEnvConfig,
            max_agent_turns=15,
            system_prompt=SYSTEM_PROMPT,
            group_size=4,
            steps_per_eval=50,
            total_steps=8,
        )

    async def setup(self) -> None:
        """Load the built-in tasks or the HF dataset; hold out an eval split.

        **Cancellation**: nothing to clean up (the HF load is synchronous).
        """
        config = self.config
        assert isinstance(config, CodingEnvConfig)
        items = list(BUILTIN_TASKS) if not config.dataset_name else self._load_dataset()
        rng = random.Random(config.seed if config.seed is not None else 0)
        rng.shuffle(items)
        held_out = max(1, int(len(items) * config.eval_fraction))
        self.eval_items = items[:held_out]
        self.train_items = items[held_out:] or items
        self._index = 0
        self.last_eval_report: EvalReport | None = getattr(self, "last_eval_report", None)

    def _load_dataset(self) -> list[dict[str, str]]:
        config = self.config
        try:
            datasets = importlib.import_module("datasets")
        except ImportError as exc:
            raise ConfigError(
                f"dataset_name={config.dataset_name!r} needs the 'datasets' package: "
                "pip install datasets"
            ) from exc
        rows = datasets.load_dataset(config.dataset_name, split=config.dataset_split)
        items: list[dict[str, str]] = []
        for index, row in enumerate(rows):
            entry = row.get("entry_point")
            test = str(row.get("test") or "")
            if entry:
                test = f"from solution import *\n{test}\ncheck({entry})\n"
            items.append(
                {
                    "name": str(row.get("task_id") or f"item-{index}"),
                    "prompt": str(row[config.prompt_field]),
                    "test": test,
                }
            )
        return items

    def format_prompt(self, item: dict[str, str]) -> str:
        prompt = item["prompt"] + "\nPut it in solution.py in the current directory."
        if item.get("test"):
            prompt += f"\n\nTests to pass (saved as test_solution.py):\n{item['test']}"
        return prompt

    async def compute_reward(
        self, item: dict[str, str], result: AgentResult, ctx: ToolContext
    ) -> float:
        """Run the item's tests against the model's ``solution.py`` in its sandbox.

        **Cancellation**: the test process is killed; the base class releases the sandbox.
        """
        config = self.config
        timeout = config.test_timeout if isinstance(config, CodingEnvConfig) else 60
        await ctx.write_file("test_solution.py", item.get("test", ""))
        run = await ctx.terminal("python3 test_solution.py", timeout=timeout)
        if run.get("exit_code") == 0:
            return 1.0
        exists = await ctx.terminal("test -f solution.py", timeout=10)
        return 0.1 if exists.get("exit_code") == 0 else 0.0

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Full agent loop on the held-out items; results through ``evaluate_log``.

        **Cancellation**: every eval rollout is cancelled and its sandbox released.
        """
        self.last_eval_report = await self.run_agent_eval(self.eval_items, task_name="coding_eval")


def coding_oracle() -> Callable[[Any], str]:
    """A scripted policy that solves the built-in tasks: write, test, answer."""
    by_name = {t["name"]: t for t in BUILTIN_TASKS}

    def policy(request: Any) -> str:
        messages = list(request.messages)
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        prompt = str(messages[users[-1]].get("content") or "") if users else ""
        task = next((t for n, t in by_name.items() if f"`{n}(" in prompt), None)
        if task is None:
            return "I cannot solve this one."
        steps = sum(1 for m in messages[users[-1] :] if m.get("role") == "tool")
        if steps == 0:
            return hermes_tool_call(
                "write_file", {"path": "solution.py", "content": task["solution"]}
            )
        if steps == 1:
            command = "python3 -c " + json.dumps(task["test"])
            return hermes_tool_call("terminal", {"command": command})
        return "solution.py is written and its tests pass."

    return policy


if __name__ == "__main__":
    CodingEnv.cli()
