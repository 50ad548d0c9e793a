"""Asynchronous RL from your own trio code: groups run while the trainer updates weights.

The trio twin of ``async_rl_asyncio.py`` (read that docstring first): a simulated trainer
aborts the in-flight generations every ``--abort-every`` seconds through the server's
``/pause`` and ``/resume`` endpoints and bumps its policy version (here an ``async`` version
source, as if it asked a parameter server), while groups run back to back in a nursery; aborted
generations resume exactly, segments carry their versions, groups more than one version stale
are dropped.

    PYTHONPATH=. .venv/bin/python examples/async_rl_trio.py --seconds 10
"""

from __future__ import annotations

import argparse
from collections import Counter

import httpx
import trio

from hermes_async.agent import AgentOptions, RolloutSetup, Staleness, run_group
from hermes_async.inference import SamplingParams, VLLMGenerateClient, load_tokenizer
from hermes_async.testing import ScriptedModelServer, open_loopback_server
from hermes_async.testing.partial import oracle_policy
from hermes_async.tools.registry import get_tool_definitions


class Trainer:
    """The trainer's side: a policy version, bumped at every weight update."""

    def __init__(self) -> None:
        self.version = 0

    async def current_version(self) -> int:  # an async version source works the same way
        await trio.lowlevel.checkpoint()
        return self.version

    async def run(self, http: httpx.AsyncClient, every: float) -> None:
        while True:
            await trio.sleep(every)
            await http.post("/pause", params={"mode": "abort"})
            self.version += 1  # ... load the new weights here ...
            await trio.sleep(0.05)
            await http.post("/resume")


async def main(seconds: float, every: float, group_size: int) -> Counter[str]:
    tokenizer = load_tokenizer()
    server = ScriptedModelServer(
        oracle_policy(2), tokenizer=tokenizer, rng_key="prompt", seconds_per_token=0.002
    )
    trainer = Trainer()
    totals: Counter[str] = Counter()
    async with (
        open_loopback_server(server) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as http,
        VLLMGenerateClient(base_url) as client,
    ):
        options = AgentOptions(
            max_turns=4,
            sampling=SamplingParams(max_tokens=160),
            version_source=trainer.current_version,
        )
        staleness = Staleness(max_staleness=1, action="drop")

        async def groups() -> None:
            item = 0
            while True:
                item += 1
                group = await run_group(
                    client,
                    [{"role": "user", "content": f"Task {item}"}],
                    get_tool_definitions(["todo"], quiet_mode=True),
                    size=group_size,
                    options=options,
                    staleness=staleness,
                    setup=RolloutSetup(tokenizer=tokenizer),
                )
                totals["groups"] += 1
                totals[f"outcome_{group.outcome}"] += 1
                totals["resumes"] += sum(
                    (r.result.managed_state or {}).get("resumes", 0) for r in group.rollouts
                )
                print(
                    f"group {item}: {group.outcome}, versions {group.rollouts[0].policy_versions}"
                )

        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trainer.run, http, every)
                nursery.start_soon(groups)
    totals["version"] = trainer.version
    print(dict(totals))
    return totals


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--abort-every", type=float, default=2.0)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    trio.run(main, args.seconds, args.abort_every, args.group_size)
