"""A complete environment in 30 lines: copy it, change the tasks and the reward.

    hermes-async eval examples/my_env.py --oracle examples/my_env.py:oracle --limit 5
"""

from hermes_async.envs import HermesAgentBaseEnv, HermesAgentEnvConfig
from hermes_async.testing import PolicyRequest, hermes_tool_call

TASKS = [
    {"name": f"add-{a}-{b}", "prompt": f"Write {a} + {b} to ~/answer.txt", "answer": str(a + b)}
    for a, b in [(1, 2), (20, 22), (7, 5), (100, 1), (3, 3), (12, 30)]
]


class MyEnv(HermesAgentBaseEnv):
    name = "my_env"

    @classmethod
    def config_init(cls):
        return HermesAgentEnvConfig(enabled_toolsets=["terminal", "file"], max_agent_turns=5), []

    async def setup(self):
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return TASKS[self.i % len(TASKS)]

    def format_prompt(self, item):
        return item["prompt"]

    async def compute_reward(self, item, result, ctx):
        out = await ctx.terminal("cat ~/answer.txt")  # in the rollout's own sandbox
        return 1.0 if out["output"].strip() == item["answer"] else 0.0

    async def evaluate(self, *args, **kwargs):
        await self.run_agent_eval(TASKS)


def oracle(request: PolicyRequest) -> str:
    """A scripted model that solves each task (offline runs: --oracle)."""
    if request.tool_results:
        return "Done: the answer is in ~/answer.txt."
    task = next(t for t in TASKS if t["prompt"] == request.last_user_text)
    return hermes_tool_call("terminal", {"command": f"echo {task['answer']} > ~/answer.txt"})


if __name__ == "__main__":
    MyEnv.cli()  # the reference's own: python examples/my_env.py evaluate|process|serve ...
