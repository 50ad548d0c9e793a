"""Under trio the environments refuse to run, with a clear error (atroposlib is asyncio-only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_async.envs.base import AsyncBackendError
from hermes_async.envs.terminal_test import TRAIN_TASKS, TerminalTestEnv
from tests.envs.helpers import env_config, server_config

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("trio", {})


async def test_envs_raise_a_clear_error_under_trio(tmp_path: Path) -> None:
    env = TerminalTestEnv(env_config(tmp_path), [server_config("http://127.0.0.1:9")])
    await env.setup()  # the subclass's own code is not ours to police
    with pytest.raises(
        AsyncBackendError,
        match=r"^collect_trajectories: .*needs asyncio.*runs under 'trio'.*atroposlib",
    ):
        await env.collect_trajectories(TRAIN_TASKS[0])
    with pytest.raises(AsyncBackendError, match=r"^run_agent_eval: .*needs asyncio"):
        await env.run_agent_eval(TRAIN_TASKS)
    with pytest.raises(AsyncBackendError, match=r"^process: "):
        await env.process_manager()
    with pytest.raises(AsyncBackendError, match=r"^evaluate: "):
        await env._run_evaluate()
