"""The environments a worker serves, by name: how an item becomes a ready-to-run task.

An environment is a function ``item -> RolloutTask`` (sync or async; asyncio and trio) or a
:class:`~hermes_async.envs.HermesAgentBaseEnv` subclass, built from its ``config_init`` on
the worker's server with ``setup()`` awaited once (the ``atropos`` extra; asyncio only).
A spec names one: ``[ALIAS=]module:NAME`` or ``[ALIAS=]path/to/file.py:NAME``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from hermes_async.agent.rollout import RolloutTask, TaskSource
from hermes_async.errors import ConfigError
from hermes_async.jsontypes import JSON
from hermes_async.tools.sandbox.manager import SandboxManager

__all__ = (
    "Environment",
    "FunctionEnvironment",
    "load_environment",
    "open_environments",
    "parse_spec",
)


class Environment(Protocol):
    """What a worker needs of an environment."""

    @property
    def asyncio_only(self) -> bool:
        """True if it needs the asyncio backend (atroposlib environments)."""
        ...

    async def task(
        self, item: JSON, *, token_server: bool, sandboxes: SandboxManager
    ) -> RolloutTask:
        """The task for ``item``, its rollouts on ``sandboxes``.

        **Cancellation**: nothing is held.
        """
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class FunctionEnvironment:
    """An environment that is a function ``item -> RolloutTask`` (see :data:`TaskSource`)."""

    factory: TaskSource
    asyncio_only: bool = False

    async def task(
        self, item: JSON, *, token_server: bool, sandboxes: SandboxManager
    ) -> RolloutTask:
        """Call the factory (awaiting it if it is async).

        **Cancellation**: the factory's await is cancelled.
        """
        made = self.factory(item)
        task = await made if inspect.isawaitable(made) else made
        if not isinstance(task, RolloutTask):
            raise TypeError(
                f"environment function {getattr(self.factory, '__name__', self.factory)!r} "
                f"returned {type(task).__name__}, not a RolloutTask"
            )
        return task


@dataclasses.dataclass(frozen=True, slots=True)
class _AtroposEnvironment:
    env: Any  # a HermesAgentBaseEnv, set up
    asyncio_only: bool = True

    async def task(
        self, item: JSON, *, token_server: bool, sandboxes: SandboxManager
    ) -> RolloutTask:
        task: RolloutTask = self.env.rollout_task(
            item, token_server=token_server, sandboxes=sandboxes
        )
        return task


def parse_spec(spec: str) -> tuple[str, str]:
    """``"[ALIAS=]TARGET:NAME"`` -> ``(alias, "TARGET:NAME")``.

    Raises:
        ConfigError: Not of that form.
    """
    alias, eq, target = spec.partition("=")
    if not eq:
        alias, target = "", spec
    module, colon, name = target.rpartition(":")
    if not colon or not module or not name.isidentifier():
        raise ConfigError(
            f"environment spec {spec!r}: expected [ALIAS=]module:NAME or [ALIAS=]file.py:NAME"
        )
    alias = alias or name
    if not alias.replace("-", "_").replace(".", "_").isidentifier():
        raise ConfigError(f"environment spec {spec!r}: the name {alias!r} is not a plain name")
    return alias, target


def _import(target: str) -> Any:
    """The object ``module:NAME`` or ``file.py:NAME`` names (blocking: start-up only)."""
    module_name, _, name = target.rpartition(":")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise ConfigError(f"environment {target!r}: no such file {path!r}")
        key = f"_hermes_async_env_{abs(hash(path))}"
        module = sys.modules.get(key)
        if module is None:
            spec = importlib.util.spec_from_file_location(key, path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"environment {target!r}: cannot import {path!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            try:
                spec.loader.exec_module(module)
            except BaseException as exc:
                del sys.modules[key]  # a later spec of this file imports it afresh
                if isinstance(exc, SyntaxError):  # also a file that is not UTF-8
                    from hermes_async.envs.specs import syntax_problem

                    raise ConfigError(
                        f"environment {target!r}: cannot import {path!r}: {syntax_problem(exc)}"
                    ) from None
                raise
    else:
        try:
            module = importlib.import_module(module_name)
        except SyntaxError as exc:
            from hermes_async.envs.specs import syntax_problem

            raise ConfigError(
                f"environment {target!r}: cannot import {module_name!r}: {syntax_problem(exc)}"
            ) from None
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):
                raise
            raise ConfigError(
                f"environment {target!r}: no module named {module_name!r}; give an importable "
                "module (pkg.tasks:make_task) or a file (tasks.py:make_task)"
            ) from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise ConfigError(f"environment {target!r}: {module_name} has no {name!r}") from None


def load_environment(spec: str) -> tuple[str, Any]:
    """``(name, source)`` for a spec: a :class:`FunctionEnvironment`, or an environment class.

    Raises:
        ConfigError: A bad spec, a missing module or name, or an object that is neither a
            callable nor a ``HermesAgentBaseEnv`` subclass.
    """
    name, target = parse_spec(spec)
    found = _import(target)
    if isinstance(found, type) and hasattr(found, "rollout_task"):
        return name, found
    if callable(found) and not isinstance(found, type):
        return name, FunctionEnvironment(found)
    raise ConfigError(
        f"environment {spec!r} is {found!r}: expected a function item -> RolloutTask or a "
        "HermesAgentBaseEnv subclass"
    )


async def _open_atropos(cls: Any, base_url: str, api: str) -> _AtroposEnvironment:
    """An environment class built the way atroposlib's CLI would, on the worker's server."""
    try:
        from atroposlib.envs.server_handling.server_baseline import APIServerConfig

        from hermes_async.envs.base import HermesAgentBaseEnv
    except ImportError as exc:
        raise ConfigError(
            f"environment {cls.__name__} is a HermesAgentBaseEnv: it needs the atropos extra "
            f"(pip install 'hermes-async[atropos]'): {exc}"
        ) from exc
    if not issubclass(cls, HermesAgentBaseEnv):
        raise ConfigError(f"{cls!r} is a class but not a HermesAgentBaseEnv subclass")
    config, _ = cls.config_init()
    server = APIServerConfig(
        base_url=base_url.rstrip("/") + "/v1",
        server_type="openai" if api == "chat" else api,
        model_name="worker",
        api_key="unused",  # the worker's own pool talks to the server, not atroposlib
        health_check=False,
    )
    env = cls(config, [server])
    await env.setup()
    return _AtroposEnvironment(env)


@asynccontextmanager
async def open_environments(
    sources: Mapping[str, Any] | Sequence[str], *, base_url: str = "", api: str = "vllm"
) -> AsyncIterator[dict[str, Environment]]:
    """The environments of ``sources``; environment classes are built and set up here once.

    Raises:
        ConfigError: A bad spec or source, or two with one name.

    **Cancellation**: what was built is dropped.
    """
    if not isinstance(sources, Mapping):
        pairs = [load_environment(spec) for spec in sources]
        names = [n for n, _ in pairs]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"two environments named {repeated}: give one an ALIAS=")
        sources = dict(pairs)
    opened: dict[str, Environment] = {}
    for name, source in sources.items():
        if isinstance(source, type):
            opened[name] = await _open_atropos(source, base_url, api)
        elif hasattr(source, "task") and hasattr(source, "asyncio_only"):
            opened[name] = source
        elif callable(source):
            opened[name] = FunctionEnvironment(source)
        else:
            raise ConfigError(f"environment {name!r}: {source!r} is not an environment")
    yield opened
