"""``token_endpoint="auto"``: a vLLM without the generate route is spoken to over /v1/completions."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_async.envs.terminal_test import TRAIN_TASKS, TerminalTestEnv, terminal_test_oracle
from tests.envs.helpers import env_config, serve_policy, server_config

pytestmark = pytest.mark.anyio

GREETING = TRAIN_TASKS[0]


@pytest.mark.parametrize("scale_out", [True, False], ids=["generate", "stock"])
async def test_auto_probes_once_and_picks_the_route(tmp_path: Path, scale_out: bool) -> None:
    async with serve_policy(terminal_test_oracle(), scale_out=scale_out) as (url, server):
        env = TerminalTestEnv(
            env_config(
                tmp_path,
                group_size=2,
                sampling_extra={"min_p": 0.01},
                end_of_turn_tokens=["<|im_end|>"],
            ),
            [server_config(url)],
        )
        await env.setup()
        for _ in range(2):
            group, _ = await env.collect_trajectories(GREETING)
            assert group is not None and group["scores"] == [1.0, 1.0]
    expected = "vllm" if scale_out else "completions"
    generations = [r for r in server.requests if r.completion_ids]
    assert {r.protocol for r in generations} == {expected}
    # One probe for the whole environment (it answers 400 or 403 and generates nothing).
    assert len([r for r in server.requests if not r.completion_ids]) <= 1
    body = generations[0].body
    extras = body["sampling_params"] if scale_out else body
    assert extras["min_p"] == 0.01 and extras["stop_token_ids"] == [151645]
