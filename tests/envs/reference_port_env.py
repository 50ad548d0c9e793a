"""The reference's documented example environment, ported with only ``await`` added.

Assembled from the reference's own documentation (the seeds in the brief): the ``MyEnv`` class
of "How Hermes Agent integrates with Atropos" (config class, ``config_init`` with
``terminal_backend="modal"`` and an OpenRouter server), the guide's ``setup`` /
``get_next_item`` / ``evaluate`` / ``wandb_log`` (``evaluate`` builds ``HermesAgentLoop`` and
``ToolContext(task_id)`` itself and calls ``ctx.cleanup()`` in ``finally``), and the
``compute_reward`` of the integration write-up that runs ``python solution.py`` and reads
``output["stdout"]``. Changes from the documents, all marked ``# port:``: the import paths, an
``await`` before each ``ctx.*`` call, and the guide's elided ``...`` placeholders filled in. The
built-in samples carry the ``expected_output`` field the reward reads.

Run as a program, like any atroposlib environment (the test passes ``--env.terminal_backend
local`` and ``--openai.base_url`` on the command line, as a user without Modal would).
"""

from __future__ import annotations

import random

from atroposlib.envs.server_handling.server_manager import APIServerConfig

from hermes_async.envs import HermesAgentBaseEnv, HermesAgentEnvConfig  # port: import path

BUILTIN_SAMPLES = [
    {
        "prompt": f"Write a Python script solution.py that prints {a} + {b} (the number only).",
        "expected_output": str(a + b),
    }
    for a, b in [(i, 2 * i + 1) for i in range(1, 25)]
]


class MyEnvConfig(HermesAgentEnvConfig):
    """Custom config – enable only terminal + file tools, use Modal sandbox."""

    pass  # noqa: PIE790 (verbatim: "all defaults are fine; you could set terminal_backend")


class MyEnv(HermesAgentBaseEnv):
    """Simple RL environment that asks the model to write a function."""

    name = "my-env"
    env_config_cls = MyEnvConfig

    @classmethod
    def config_init(cls):  # type: ignore[no-untyped-def]
        # Enable the terminal and file toolsets, run in Modal for isolation.
        env_cfg = MyEnvConfig(
            enabled_toolsets=["terminal", "file"],
            terminal_backend="modal",
            max_agent_turns=20,
            tool_pool_size=64,
        )
        # Use an OpenAI‑compatible server (OpenRouter in this example)
        server_cfg = [
            APIServerConfig(
                base_url="https://openrouter.ai/api/v1",
                model_name="anthropic/claude-sonnet-4.6",
                server_type="openai",
            )
        ]
        return env_cfg, server_cfg

    async def setup(self) -> None:
        """Called once at startup. Load datasets, initialize state."""
        # Try HuggingFace first, fallback to built-in samples
        try:
            from datasets import load_dataset

            ds = load_dataset("your/dataset", split="test")
            self._items = [dict(row) for row in ds]  # port: the guide's `[...]`
        except Exception:
            self._items = list(BUILTIN_SAMPLES)

        # Always split into train/eval
        random.shuffle(self._items)
        eval_size = max(20, int(len(self._items) * 0.1))
        self._eval_items = self._items[:eval_size]
        self._items = self._items[eval_size:]
        self._index = 0
        self._reward_buffer: list[float] = []

    async def get_next_item(self) -> dict:  # type: ignore[type-arg]
        """Return next item, cycling through dataset."""
        item = self._items[self._index % len(self._items)]
        self._index += 1
        return item

    def format_prompt(self, item):  # type: ignore[no-untyped-def]
        # The model sees a plain user message.
        return item["prompt"]

    async def compute_reward(self, item, result, ctx) -> float:  # type: ignore[no-untyped-def]
        # 核心：用 ToolContext 验证结果
        output = await ctx.terminal("python solution.py")  # port: await
        if output["exit_code"] == 0 and item["expected_output"] in output["stdout"]:
            reward = 1.0
        elif output["exit_code"] == 0:
            reward = 0.3  # 运行了但结果不对
        else:
            reward = 0.0
        self._reward_buffer.append(reward)  # port: the guide's buffer, for wandb_log
        return reward

    async def evaluate(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        import time
        import uuid

        from hermes_async.agent_loop import HermesAgentLoop  # port: import path
        from hermes_async.tool_context import ToolContext  # port: import path

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
                temperature=0.0,  # Deterministic for eval
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
                    "prompt": item["prompt"],  # port: the guide's `...`
                    "response": result.messages[-1].get("content", ""),  # port: `...`
                    "reward": reward,
                }
            )

        eval_metrics = {  # port: the guide's `...`
            "eval/mean_reward": sum(s["reward"] for s in samples) / max(len(samples), 1)
        }
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
        await super().wandb_log(wandb_metrics)  # MUST call super


if __name__ == "__main__":
    # CLI entry point – supports `serve`, `process`, `evaluate`
    MyEnv.cli()
