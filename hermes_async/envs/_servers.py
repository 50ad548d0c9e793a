"""Which model client an environment uses, built from atroposlib's server configs.

Our own anyio clients, never atroposlib's ``ServerManager``; servers of one kind share a
``ServerPool``. See docs/decisions/025-model-servers.md.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, MutableMapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import httpx

from hermes_async._net import redact_url
from hermes_async.errors import ConfigError, InferenceError
from hermes_async.inference import HTTPOptions, ModelServerError, probe_server
from hermes_async.inference.chat import ChatClient
from hermes_async.inference.completions import VLLMCompletionsClient, detect_token_endpoint
from hermes_async.inference.generate import (
    AtroposGenerateClient,
    GenerateClient,
    SGLangGenerateClient,
    VLLMGenerateClient,
)
from hermes_async.inference.pool import PoolAPI, PoolOptions, ServerPool
from hermes_async.limits import Limits, NamedLimiter

__all__ = (
    "ModelClient",
    "ServerSpec",
    "ServerUnreachableError",
    "check_reachable",
    "open_model_clients",
    "server_specs",
)

logger = logging.getLogger("hermes_async.envs.base")

TokenEndpoint = Literal["auto", "vllm", "completions", "atropos", "sglang"]
#: Values ``token_endpoint`` accepts.
_TOKEN_ENDPOINTS: tuple[str, ...] = ("auto", "vllm", "completions", "atropos", "sglang")

#: Pause between reachability probes of a server that is still starting.
_PROBE_INTERVAL_SECONDS = 0.25
#: Longest single probe (a server that accepts but never answers is retried after it).
_PROBE_TIMEOUT_SECONDS = 10.0

#: Where atroposlib puts a ``ServerBaseline``'s servers when not under SLURM.
_BASELINE_URLS = tuple(f"http://localhost:{9004 + i}/v1" for i in range(4))

ModelClient = GenerateClient | ChatClient


class ServerUnreachableError(InferenceError):
    """The model server did not answer HTTP within the connect deadline."""


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One model server, as the environment uses it.

    ``base_url`` is shown redacted and ``api_key`` never logged; ``timeout`` is the per-request
    deadline in seconds.
    """

    base_url: str
    server_type: str
    model_name: str
    api_key: str | None
    timeout: float

    def __repr__(self) -> str:  # credentials never reach a log line
        return (
            f"ServerSpec(base_url={redact_url(self.base_url)!r}, "
            f"server_type={self.server_type!r}, model_name={self.model_name!r}, "
            f"api_key={'[REDACTED]' if self.api_key else None}, timeout={self.timeout!r})"
        )

    @property
    def phase(self) -> int:
        """2 for token servers (vllm, sglang), 1 for chat servers (openai)."""
        return 1 if self.server_type == "openai" else 2

    @property
    def root_url(self) -> str:
        """The base URL without a trailing ``/v1`` (token endpoints live at the root)."""
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


def server_specs(server_configs: Any) -> list[ServerSpec]:
    """Turn atroposlib server configs (list, one, ``ServerBaseline``) into specs.

    Raises:
        ConfigError: An unsupported ``server_type`` (``trl``) or a missing ``base_url``.
    """
    configs = server_configs if isinstance(server_configs, list) else [server_configs]
    if not configs:
        raise ConfigError("no model server configured: config_init() returned an empty list")
    specs: list[ServerSpec] = []
    for config in configs:
        server_type = str(getattr(config, "server_type", "openai"))
        if server_type not in ("openai", "vllm", "sglang"):
            raise ConfigError(
                f"server_type {server_type!r} is not supported by hermes_async environments; "
                "use 'vllm' or 'sglang' (Phase 2, exact tokens) or 'openai' (Phase 1)"
            )
        base_url = getattr(config, "base_url", None)
        urls = [base_url] if base_url else ([] if hasattr(config, "base_url") else _BASELINE_URLS)
        if not urls:
            raise ConfigError(
                "a model server has no base_url; pass --openai.base_url http://host:port/v1"
            )
        for url in urls:
            specs.append(
                ServerSpec(
                    base_url=str(url),
                    server_type=server_type,
                    model_name=str(getattr(config, "model_name", "default")),
                    api_key=getattr(config, "api_key", None) or None,
                    timeout=float(getattr(config, "timeout", 1200)),
                )
            )
    phases = {s.phase for s in specs}
    if len(phases) > 1:
        raise ConfigError(
            "mixing chat ('openai') and token ('vllm'/'sglang') servers in one environment is "
            f"not supported; got {sorted({s.server_type for s in specs})}"
        )
    return specs


def _endpoint_kind(server_type: str, token_endpoint: str) -> str:
    """The token protocol to speak, without a probe (``auto``: ``sglang`` or ``vllm``).

    Raises:
        ConfigError: ``token_endpoint`` is not one of :data:`_TOKEN_ENDPOINTS`.
    """
    if token_endpoint not in _TOKEN_ENDPOINTS:
        raise ConfigError(
            f"unknown token_endpoint {token_endpoint!r}; valid: {', '.join(_TOKEN_ENDPOINTS)}"
        )
    if token_endpoint != "auto":
        return token_endpoint
    return "sglang" if server_type == "sglang" else "vllm"


async def _resolve_endpoint_kind(
    spec: ServerSpec,
    token_endpoint: str,
    *,
    cache: MutableMapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout: float = _PROBE_TIMEOUT_SECONDS,
) -> str:
    """:func:`_endpoint_kind`, with ``auto`` on a vLLM server decided by one probe, cached by URL.

    Raises:
        ConfigError: An unknown ``token_endpoint``.
        ModelServerError: The probe failed (unreachable server, wrong key).

    **Cancellation**: the probe's connection is closed.
    """
    kind = _endpoint_kind(spec.server_type, token_endpoint)
    if token_endpoint != "auto" or spec.server_type != "vllm" or spec.phase != 2:
        return kind
    if cache is not None and spec.root_url in cache:
        return cache[spec.root_url]
    kind = await detect_token_endpoint(
        spec.root_url, timeout=timeout, transport=transport, api_key=spec.api_key
    )
    if cache is not None:
        cache[spec.root_url] = kind
    return kind


def _make_client(
    spec: ServerSpec,
    kind: str,
    limiter: NamedLimiter | None,
    transport: httpx.AsyncBaseTransport | None,
    vocab_size: int | None = None,
) -> ModelClient:
    options = HTTPOptions(request_timeout=max(spec.timeout, 1.0))
    if spec.phase == 1:
        return ChatClient(
            spec.base_url,
            model=spec.model_name,
            api_key=spec.api_key,
            options=options,
            limiter=limiter,
            transport=transport,
        )
    common: dict[str, Any] = {
        "options": options,
        "limiter": limiter,
        "transport": transport,
        "api_key": spec.api_key,
        "vocab_size": vocab_size,
    }
    if kind == "atropos":
        return AtroposGenerateClient(spec.base_url, **common)
    if kind == "sglang":
        return SGLangGenerateClient(spec.root_url, **common)
    if kind == "completions":
        return VLLMCompletionsClient(spec.root_url, model=spec.model_name, **common)
    return VLLMGenerateClient(spec.root_url, **common)


def _poolable(specs: Sequence[ServerSpec]) -> bool:
    """True if ``specs`` can share one :class:`ServerPool`: several, one API key."""
    return len(specs) > 1 and len({s.api_key for s in specs}) == 1


_POOL_APIS: dict[str, PoolAPI] = {
    "chat": "chat",
    "vllm": "vllm",
    "atropos": "atropos",
    "sglang": "sglang",
}


@asynccontextmanager
async def open_model_clients(
    specs: Sequence[ServerSpec],
    *,
    token_endpoint: str = "auto",
    limiter: NamedLimiter | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    endpoint_cache: MutableMapping[str, str] | None = None,
    pool: bool = True,
    limits: Limits | None = None,
    pool_options: PoolOptions | None = None,
    vocab_size: int | None = None,
) -> AsyncIterator[list[ModelClient]]:
    """Open the clients of ``specs``; close them (and their pool) on exit.

    With ``pool``, several poolable servers share one :class:`ServerPool` (its per-server
    limiters go into ``limits``); ``limiter`` bounds the requests. ``vocab_size`` makes token
    clients reject ids outside the vocabulary.

    **Cancellation**: the pools are closed, shielded and bounded, however the block exits.
    """
    async with AsyncExitStack() as stack:
        clients: list[ModelClient] = []
        first = specs[0] if specs else None
        first_kind = (
            "chat"
            if first is None or first.phase != 2
            else await _resolve_endpoint_kind(
                first, token_endpoint, cache=endpoint_cache, transport=transport
            )
        )
        # A pool speaks the generate routes and chat; stock-vLLM completions servers get one
        # client each.
        if pool and _poolable(specs) and first is not None and first_kind in _POOL_APIS:
            options = pool_options or PoolOptions(
                max_limit=limiter.total if limiter is not None else PoolOptions().max_limit,
                http=HTTPOptions(request_timeout=max(max(s.timeout for s in specs), 1.0)),
            )
            server_pool = await stack.enter_async_context(
                ServerPool(
                    [s.base_url for s in specs],
                    options=options,
                    limits=limits,
                    transport=transport,
                    api_key=first.api_key,
                    api=_POOL_APIS[first_kind],
                    model=first.model_name,
                )
            )
            clients.append(await stack.enter_async_context(server_pool.client()))
            yield clients
            return
        for spec in specs:
            kind = (
                await _resolve_endpoint_kind(
                    spec, token_endpoint, cache=endpoint_cache, transport=transport
                )
                if spec.phase == 2
                else "chat"
            )
            client = _make_client(spec, kind, limiter, transport, vocab_size)
            clients.append(await stack.enter_async_context(client))
        yield clients


async def check_reachable(
    spec: ServerSpec,
    *,
    timeout: float,
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """Wait until ``spec``'s server answers HTTP (any status), for at most ``timeout`` seconds.

    Raises :class:`ServerUnreachableError` naming the URL (redacted) and what to do.

    **Cancellation**: the probe's connection is closed; nothing else is held.
    """
    last: ModelServerError | None = None
    with anyio.move_on_after(timeout):
        while True:
            try:
                await probe_server(
                    spec.root_url,
                    "/health",
                    timeout=min(timeout, _PROBE_TIMEOUT_SECONDS),
                    transport=transport,
                    api_key=spec.api_key,
                )
                return
            except ModelServerError as exc:
                if last is None:
                    logger.warning(
                        "waiting up to %g s for the model server at %s (server_type=%s): %s",
                        timeout,
                        redact_url(spec.base_url),
                        spec.server_type,
                        exc.message,
                    )
                last = exc
            await anyio.sleep(_PROBE_INTERVAL_SECONDS)
    reason = f"{type(last).__name__}: {last.message}" if last is not None else "no answer"
    raise ServerUnreachableError(
        f"the model server at {redact_url(spec.base_url)} (server_type={spec.server_type}) did "
        f"not answer within {timeout:g} s ({reason}); start it, or fix --openai.base_url, or "
        "raise --env.server_connect_timeout"
    )
