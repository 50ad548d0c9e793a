"""A worker described by plain values: what ``hermes-async worker`` and a Ray actor start from.

:class:`WorkerConfig` is picklable (strings and numbers), so a driver can hand it to a Ray
actor on another machine; :func:`open_configured_worker` opens everything it names there: the
model-server pool, the tokenizer, the environments and the worker.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import anyio

from hermes_async._net import base_url_problem
from hermes_async.errors import ConfigError
from hermes_async.inference.pool import ServerPool
from hermes_async.inference.tokenizer import load_tokenizer
from hermes_async.limits import Limits
from hermes_async.service.environments import open_environments
from hermes_async.service.worker import RolloutWorker, WorkerOptions, open_worker

__all__ = ("TOKENIZER_LOAD_LIMITER", "WorkerConfig", "open_configured_worker")

#: The one thread a worker's tokenizer is loaded on (a blocking load, once, at start).
TOKENIZER_LOAD_LIMITER = anyio.CapacityLimiter(1)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything a worker process needs, as plain values.

    Attributes:
        environments: Environment specs (``[ALIAS=]module:NAME`` or ``file.py:NAME``).
        api: ``vllm``, ``sglang``, ``atropos`` (token servers) or ``chat``.
        tokenizer: For token servers: an HF name or directory; ``None``: the built-in Qwen.
        api_key_env: The variable holding the API key; never the key, which would travel.
    """

    environments: tuple[str, ...]
    servers: tuple[str, ...]
    api: Literal["vllm", "sglang", "atropos", "chat"] = "vllm"
    tokenizer: str | None = None
    model: str = "default"
    options: WorkerOptions = field(default_factory=WorkerOptions)
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        if not self.environments:
            raise ConfigError("a worker needs at least one environment (--env module:NAME)")
        if not self.servers:
            raise ConfigError("a worker needs at least one model server (--server URL)")
        for url in self.servers:
            if (problem := base_url_problem(url)) is not None:
                raise ConfigError(
                    f"--server {url!r} is not a model server URL: it {problem}; expected "
                    "http(s)://host[:port]"
                )


@asynccontextmanager
async def open_configured_worker(config: WorkerConfig) -> AsyncIterator[RolloutWorker]:
    """Open the pool, the tokenizer, the environments and the worker ``config`` names.

    Raises:
        ConfigError: A bad environment spec, server list or tokenizer.

    **Cancellation**: everything opened is closed (sandboxes released, shielded, bounded).
    """
    api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
    if config.api_key_env and api_key is None:  # read here, where the worker runs (Ray: its node)
        raise ConfigError(
            f"--api-key-env {config.api_key_env}: the variable is not set; set it, or leave "
            "the option out for servers without a key"
        )
    limits = Limits()
    tokenizer = None
    if config.api != "chat":
        load = partial(load_tokenizer, config.tokenizer)  # blocking: once, off the loop
        tokenizer = await anyio.to_thread.run_sync(load, limiter=TOKENIZER_LOAD_LIMITER)
    async with (
        ServerPool(
            config.servers, api=config.api, model=config.model, limits=limits, api_key=api_key
        ) as pool,
        open_environments(
            config.environments, base_url=config.servers[0], api=config.api
        ) as environments,
        open_worker(
            environments, pool, options=config.options, limits=limits, tokenizer=tokenizer
        ) as worker,
    ):
        yield worker
