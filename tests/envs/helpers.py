"""Shared pieces of the environment tests: configs, a counting sandbox factory, servers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from atroposlib.envs.server_handling.server_baseline import APIServerConfig

from hermes_async.envs.terminal_test import TerminalTestEnv, TerminalTestEnvConfig
from hermes_async.testing.http import open_loopback_server
from hermes_async.testing.scripted_server import ScriptedModelServer
from hermes_async.tools.sandbox.manager import SandboxFactory
from tests.support import RecordingFactory


def server_config(url: str, server_type: str = "vllm") -> APIServerConfig:
    return APIServerConfig(
        base_url=url + "/v1",
        server_type=server_type,
        model_name="scripted",
        api_key="x",
        health_check=False,
    )


def env_config(tmp_path: Path, **overrides: Any) -> TerminalTestEnvConfig:
    config, _ = TerminalTestEnv.config_init()
    values = config.model_dump()
    values.update(
        use_wandb=False,
        data_path_to_save_groups=None,
        data_dir_to_save_evals=str(tmp_path / "evals"),
        server_connect_timeout=5.0,
    )
    values.update(overrides)
    return TerminalTestEnvConfig(**values)


def with_factory(env: Any, factory: RecordingFactory) -> None:
    def make() -> SandboxFactory:
        return factory

    env.make_sandbox_factory = make


async def ready_env(cls: Any, config: Any, url: str, factory: RecordingFactory) -> Any:
    """``cls(config, [server at url])`` on ``factory``'s sandboxes, after ``setup()``."""
    env = cls(config, [server_config(url)])
    with_factory(env, factory)
    await env.setup()
    return env


@asynccontextmanager
async def serve_policy(
    policy: Callable[[Any], str], **kw: Any
) -> AsyncIterator[tuple[str, ScriptedModelServer]]:
    server = ScriptedModelServer(policy, **kw)
    async with open_loopback_server(server) as url:
        yield url, server
