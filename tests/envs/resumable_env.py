"""A TerminalTestEnv with a dozen eval items, run as a program by the kill-and-resume tests.

``python -m tests.envs.resumable_env evaluate|process ...``. If the file named by
``RESUME_TEST_FAIL_MARKER`` exists, the reward of the items listed in it raises (a verifier
failure), so a test can make items error in one run and succeed in the next.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hermes_async.agent import AgentResult, ToolContext
from hermes_async.envs.terminal_test import EVAL_TASKS, TRAIN_TASKS, TerminalTestEnv

#: 12 eval items: the four oracle tasks, three times, each with its own name (its item key).
RESUME_EVAL_ITEMS = [
    {**task, "name": f"{task['name']}-{i}"}
    for i in range(3)
    for task in [*TRAIN_TASKS, *EVAL_TASKS]
]


class ResumableEnv(TerminalTestEnv):
    name = "resumable"

    async def setup(self) -> None:
        await super().setup()
        self.eval_items = list(RESUME_EVAL_ITEMS)

    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        marker = os.environ.get("RESUME_TEST_FAIL_MARKER")
        if marker and Path(marker).exists() and item["name"] in Path(marker).read_text().split():
            raise RuntimeError(f"verifier unavailable for {item['name']}")
        return await super().compute_reward(item, result, ctx)


if __name__ == "__main__":
    ResumableEnv.cli()
