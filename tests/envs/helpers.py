"""Shared pieces of the environment tests: configs, a counting sandbox factory, servers."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from atroposlib.envs.server_handling.server_baseline import APIServerConfig

from hermes_async.envs.terminal_test import TerminalTestEnv, TerminalTestEnvConfig
from hermes_async.testing.http import open_loopback_server
from hermes_async.testing.scripted_server import ScriptedModelServer
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.local import LocalSandbox, local_factory
from hermes_async.tools.sandbox.manager import SandboxFactory


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


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


class CountingFactory:
    """Local sandboxes under ``root``; records every one created.

    Process isolation: these tests are about the environment's pipeline, and they time it;
    the namespaced backend has its own tests (tests/tools/sandbox/test_namespaces.py).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.inner = local_factory(str(root), isolation="process")
        self.created: list[LocalSandbox] = []

    async def __call__(self, task_id: str) -> Sandbox:
        sandbox = await self.inner(task_id)
        assert isinstance(sandbox, LocalSandbox)
        self.created.append(sandbox)
        return sandbox

    def leftovers(self) -> list[str]:
        """Sandbox directories still on disk."""
        return [s.root for s in self.created if os.path.exists(s.root)]


def with_factory(env: Any, factory: CountingFactory) -> None:
    def make() -> SandboxFactory:
        return factory

    env.make_sandbox_factory = make


async def ready_env(cls: Any, config: Any, url: str, factory: CountingFactory) -> Any:
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
