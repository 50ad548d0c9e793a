"""A pytest plugin for deterministic tests of environments built on hermes_async.

Installed with the package (entry point ``pytest11``); the loopback server needs the
``testing`` extra. Fixtures: ``hermes_policy``, ``hermes_seed``, ``hermes_sandbox_backend``
(override these three), ``hermes_model_server``, ``hermes_sandboxes`` and ``hermes_env_run``.
Async tests need ``pytest.mark.anyio``; environments run under asyncio only. Usage is in
docs/testing.md; determinism rules in docs/architecture.md, "The pytest plugin".
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from hermes_async.testing.endpoint import ScriptedEndpoint, open_scripted_endpoint

if TYPE_CHECKING:
    from hermes_async.envs.results import EvalReport
    from hermes_async.testing.scripted_server import PolicyRequest
    from hermes_async.tools.sandbox.manager import SandboxManager

__all__ = (
    "EnvRun",
    "ScriptedEndpoint",
    "hermes_env_run",
    "hermes_model_server",
    "hermes_policy",
    "hermes_sandbox_backend",
    "hermes_sandboxes",
    "hermes_seed",
    "normalize_call_ids",
    "open_scripted_endpoint",
    "run_env_item",
)

Mode = Literal["collect", "evaluate"]


def normalize_call_ids(messages: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """A copy of a group's messages with tool-call ids renamed ``call_0``, ``call_1``, ...

    Ids are numbered per rollout in order of first appearance.
    """
    renamed: list[list[dict[str, Any]]] = []
    for rollout in messages:
        ids: dict[str, str] = {}

        def rename(value: Any, ids: dict[str, str] = ids) -> Any:
            if not isinstance(value, str):
                return value
            return ids.setdefault(value, f"call_{len(ids)}")

        out = copy.deepcopy(rollout)
        for message in out:
            for call in message.get("tool_calls") or ():
                if isinstance(call, dict):
                    call["id"] = rename(call.get("id"))
            if "tool_call_id" in message:
                message["tool_call_id"] = rename(message["tool_call_id"])
        renamed.append(out)
    return renamed


@dataclass(slots=True)
class EnvRun:
    """What :func:`run_env_item` returns: ``group``, ``backlog`` (collect) or ``report``."""

    env: Any
    group: dict[str, Any] | None = None
    backlog: list[Any] = field(default_factory=list)
    report: EvalReport | None = None

    @property
    def scores(self) -> list[float]:
        """The group's scores (collect) or the per-item rewards (evaluate)."""
        if self.group is not None:
            return list(self.group["scores"])
        if self.report is not None:
            return [s.reward for s in self.report.rollouts]
        return []


async def run_env_item(
    env: Any,
    item: Any,
    *,
    endpoint: ScriptedEndpoint,
    mode: Mode = "collect",
    server_type: str = "vllm",
    group_size: int | None = None,
    seed: int = 0,
    **config: Any,
) -> EnvRun:
    """Run one ``item`` of an environment against a scripted model and return the result.

    Args:
        env: An environment class (built from ``config_init()``, wandb and output files off) or
            an instance (used as it is; ``setup()`` is still called once).
        item: The dataset item.
        endpoint: The scripted model (the ``hermes_model_server`` fixture).
        mode: ``"collect"``: ``collect_trajectories(item)``; ``"evaluate"``:
            ``run_agent_eval([item])``, nothing logged.
        server_type: ``"vllm"`` (Phase 2) or ``"openai"`` (Phase 1).
        group_size: Rollouts per group (default: the environment's).
        seed: The environment's ``seed``.
        **config: More config fields to set.

    Raises:
        AsyncBackendError: Under trio (environments are asyncio-only, as atroposlib is).
    **Cancellation**: the rollouts are cancelled and their sandboxes released.
    """
    from hermes_async._asynclib import require_asyncio

    require_asyncio(
        "run_env_item: a hermes_async environment",
        "atroposlib",
        remedy="run environment tests under asyncio and test the rollout core (run_group, "
        "ToolContext) under trio",
    )
    if isinstance(env, type):
        env_class: Any = env
        base, _ = env_class.config_init()
        values = base.model_dump()
        values.update(
            use_wandb=False,
            data_path_to_save_groups=None,
            data_dir_to_save_evals=None,
            ensure_scores_are_not_same=False,
            seed=seed,
        )
        if group_size is not None:
            values["group_size"] = group_size
        values.update(config)
        env = env_class(type(base)(**values), [endpoint.server_config(server_type)])
        if endpoint.transport is not None:
            env.model_transport = endpoint.transport
    elif group_size is not None or config:
        raise TypeError("pass group_size and config fields with an environment class")
    if not getattr(env, "_hermes_test_setup_done", False):
        await env.setup()
        env._hermes_test_setup_done = True
    if mode == "collect":
        group, backlog = await env.collect_trajectories(item)
        if group is not None:
            group = dict(group)
            group["messages"] = normalize_call_ids(group["messages"])
        return EnvRun(env, group, list(backlog or []))
    if mode == "evaluate":
        report = await env.run_agent_eval([item], log=False)
        return EnvRun(env, report=report)
    raise ValueError(f"mode must be 'collect' or 'evaluate', got {mode!r}")


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def hermes_policy() -> Callable[[PolicyRequest], str]:
    """The scripted model's policy (override it): by default, answer ``"Done."``."""
    return lambda request: "Done."


@pytest.fixture
def hermes_seed() -> int:
    """Seed of the scripted server and of the environment (override it)."""
    return 0


@pytest.fixture
def hermes_sandbox_backend() -> str:
    """``"local"`` (default) or ``"fake"``: the backend of ``hermes_sandboxes``."""
    return "local"


@pytest.fixture
async def hermes_model_server(
    hermes_policy: Callable[[PolicyRequest], str], hermes_seed: int
) -> AsyncIterator[ScriptedEndpoint]:
    """A scripted model following ``hermes_policy``, on loopback, for the test."""
    async with open_scripted_endpoint(hermes_policy, seed=hermes_seed) as endpoint:
        yield endpoint


@pytest.fixture
async def hermes_sandboxes(
    hermes_sandbox_backend: str, tmp_path: Path
) -> AsyncIterator[SandboxManager]:
    """A sandbox manager for the test (current: ``ToolContext(task_id)`` and envs use it)."""
    from hermes_async.testing.fake_sandbox import FakeSandboxFactory
    from hermes_async.tools.sandbox.local import local_factory
    from hermes_async.tools.sandbox.manager import SandboxFactory, open_sandbox_manager

    factory: SandboxFactory
    if hermes_sandbox_backend == "local":
        root = tmp_path / "hermes-sandboxes"
        root.mkdir(exist_ok=True)
        factory = local_factory(str(root))
    elif hermes_sandbox_backend == "fake":
        factory = FakeSandboxFactory()
    else:
        raise ValueError(
            f"hermes_sandbox_backend must be 'local' or 'fake', got {hermes_sandbox_backend!r}"
        )
    async with open_sandbox_manager(factory, idle_timeout=None) as manager:
        yield manager


@pytest.fixture
def hermes_env_run(
    hermes_model_server: ScriptedEndpoint,
    hermes_sandboxes: SandboxManager,
    hermes_seed: int,
) -> Callable[..., Awaitable[EnvRun]]:
    """:func:`run_env_item` on the test's scripted model and sandboxes."""

    async def run(env: Any, item: Any, **options: Any) -> EnvRun:
        options.setdefault("seed", hermes_seed)
        return await run_env_item(env, item, endpoint=hermes_model_server, **options)

    return run
