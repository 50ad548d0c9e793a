"""The benchmark environments' items through the rollout core on asyncio AND trio.

The environments are atroposlib's (asyncio only), but what they add runs in the core: the
sandbox preparation, the reward and its judge. ``rollout_task`` + ``run_rollout`` (the seam
trainer adapters and workers use) run them under either backend. TBLite runs on Docker
(aiodocker: asyncio only); the Terminal-Bench path's trio error is tested in
tests/envs/terminalbench/test_env.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from hermes_async.agent import run_rollout
from hermes_async.envs.base import HermesAgentBaseEnv
from hermes_async.envs.swe import HermesSweEnv
from hermes_async.envs.web_research import WebResearchEnv
from hermes_async.envs.yc_bench import YCBenchEvalEnv
from hermes_async.testing.benchmarks import (
    open_web_research_world,
    swe_oracle,
    web_research_oracle,
    yc_bench_oracle,
)
from tests.envs import test_yc_bench
from tests.envs.helpers import serve_policy, server_config
from tests.envs.test_yc_bench import ORACLE_FUNDS_CENTS, config as yc_config

#: The simulator fixture of test_yc_bench.py (skips without its venv).
yc_bench = test_yc_bench.yc_bench

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"debug": True}), id="asyncio"),
        pytest.param(("trio", {}), id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    return request.param  # type: ignore[no-any-return]


def _config(cls: type[HermesAgentBaseEnv], **values: Any) -> Any:
    base, _ = cls.config_init()
    fields = base.model_dump()
    fields.update(use_wandb=False, tokenizer_name="qwen-offline", terminal_backend="local")
    fields.update(values)
    return cls.env_config_cls(**fields)


@asynccontextmanager
async def rollout_of(env: HermesAgentBaseEnv) -> AsyncIterator[Any]:
    """A function running one item through ``run_rollout`` on the env's sandboxes and server."""
    async with env.open_sandboxes() as manager, env.open_model_clients() as clients:

        async def run(item: Any) -> Any:
            task = env.rollout_task(item, token_server=True, sandboxes=manager)
            return await run_rollout(
                clients[0],
                task.messages,
                task.tools,
                setup=task.setup,
                options=task.options,
                task_id="core-1",
            )

        yield run


async def test_swe_rollouts_pass_on_both_backends(tmp_path: Path) -> None:
    async with serve_policy(swe_oracle()) as (url, _):
        config = _config(HermesSweEnv, enabled_toolsets=["terminal", "file"], dataset_name=None)
        env = HermesSweEnv(config, [server_config(url)])
        await env.setup()
        async with rollout_of(env) as run:
            scored = await run(env.items[1])
    assert (scored.reward, scored.error) == (1.0, None)


async def test_web_research_rollouts_are_judged_on_both_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_web_research_world() as (web_url, judge_url):
        monkeypatch.setenv("TAVILY_API_KEY", "fake")
        monkeypatch.setenv("TAVILY_BASE_URL", web_url)
        async with serve_policy(web_research_oracle()) as (url, _):
            config = _config(WebResearchEnv, dataset_name=None, judge_base_url=judge_url)
            env = WebResearchEnv(config, [server_config(url)])
            await env.setup()
            async with rollout_of(env) as run:
                scored = await run(env.train_items[0])
    assert scored.reward == 1.0 and env.parts["core-1"].judged


@pytest.mark.yc_bench
@pytest.mark.timeout(300)
@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {}), id="trio")])
async def test_a_yc_bench_run_on_trio(tmp_path: Path, yc_bench: str, anyio_backend: object) -> None:
    # asyncio runs the same path in test_yc_bench.py.
    async with serve_policy(yc_bench_oracle()) as (url, _):
        env = YCBenchEvalEnv(yc_config(tmp_path, yc_bench), [server_config(url)])
        await env.setup()
        async with rollout_of(env) as run:
            scored = await run(env.items[0])
    assert scored.error is None, scored.error
    assert env.runs["core-1"].final_funds_cents == ORACLE_FUNDS_CENTS
