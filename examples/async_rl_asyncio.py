"""Asynchronous RL from your own asyncio code: groups run while the trainer updates weights.

A simulated trainer pauses the inference server every ``--abort-every`` seconds the way an
asynchronous RL trainer does around a weight update (``POST /pause?mode=abort``: in-flight
generations end with ``finish_reason="abort"``), bumps its policy version and resumes the
server (``POST /resume``). Meanwhile groups run back to back:

* an aborted generation keeps its exact prefix and resumes with the remaining token budget;
* every request reads the trainer's version once, at dispatch, and each sampled segment
  carries it (``overrides[i]["policy_versions"]`` in the Atropos group);
* ``Staleness(max_staleness=1, action="mask")`` masks segments more than one version old.

The model server here is the offline scripted one over loopback; point ``base_url`` at a vLLM
started with ``--enable-scale-out`` (and its dev-mode ``/pause`` endpoints) for the real thing.

    PYTHONPATH=. .venv/bin/python examples/async_rl_asyncio.py --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

import httpx

from hermes_async.agent import AgentOptions, RolloutSetup, Staleness, run_group
from hermes_async.inference import SamplingParams, VLLMGenerateClient, load_tokenizer
from hermes_async.testing import ScriptedModelServer, open_loopback_server
from hermes_async.testing.partial import oracle_policy
from hermes_async.tools.registry import get_tool_definitions


class Trainer:
    """The trainer's side: a policy version, bumped at every weight update."""

    def __init__(self) -> None:
        self.version = 0

    def current_version(self) -> int:  # the version source: read once per request
        return self.version

    async def run(self, http: httpx.AsyncClient, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            await http.post("/pause", params={"mode": "abort"})  # in-flight requests abort
            self.version += 1  # ... load the new weights here ...
            await asyncio.sleep(0.05)
            await http.post("/resume")


async def main(seconds: float, every: float, group_size: int) -> Counter[str]:
    tokenizer = load_tokenizer()
    server = ScriptedModelServer(
        oracle_policy(1), tokenizer=tokenizer, rng_key="prompt", seconds_per_token=0.002
    )
    trainer = Trainer()
    totals: Counter[str] = Counter()
    async with (
        open_loopback_server(server) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=10) as http,
        VLLMGenerateClient(base_url) as client,
    ):

        async def paused() -> bool:  # lets rollouts wait out a pause instead of failing
            return bool((await http.get("/is_paused")).json()["is_paused"])

        options = AgentOptions(
            max_turns=4,
            sampling=SamplingParams(max_tokens=160),
            version_source=trainer.current_version,
            pause_probe=paused,
        )
        staleness = Staleness(max_staleness=1, action="mask")

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
                if group.staleness is not None:
                    totals["stale_masked_tokens"] += group.staleness.masked_tokens
                if not group.masked:
                    data = group.to_scored_data_group()  # -> your trainer's queue
                    versions = data["group_overrides"].get("policy_version_min")
                    print(f"group {item}: {group.outcome}, oldest version {versions}")

        try:
            async with asyncio.timeout(seconds), asyncio.TaskGroup() as tg:
                tg.create_task(trainer.run(http, every))
                tg.create_task(groups())
        except TimeoutError:
            pass
    totals["version"] = trainer.version
    print(dict(totals))
    return totals


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--abort-every", type=float, default=2.0)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.abort_every, args.group_size))
