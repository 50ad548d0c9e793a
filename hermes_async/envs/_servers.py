"""Which model client an environment uses, built from atroposlib's server configs.

atroposlib describes servers with ``APIServerConfig`` (``server_type``, ``base_url``,
``model_name``, ``api_key``, ``timeout``). The environment talks to them with its own anyio
clients, never through atroposlib's ``ServerManager``/``ManagedServer``:

=================  ======================================  =====================================
``server_type``    client                                   phase
=================  ======================================  =====================================
``vllm``           token client; ``token_endpoint``:        Phase 2 (exact tokens and logprobs)
                   ``auto`` (default: the generate route
                   if the server has it, else the stock
                   ``/v1/completions``; probed once),
                   ``vllm`` (``/inference/v1/generate``),
                   ``completions`` (``/v1/completions``)
                   or ``atropos`` (``/generate``)
``sglang``         :class:`SGLangGenerateClient`            Phase 2
``openai``         :class:`ChatClient`                      Phase 1 (placeholder tokens)
=================  ======================================  =====================================

Several servers of one kind (atroposlib's list of server configs, or a ``ServerBaseline``'s
four) become one :class:`~hermes_async.inference.pool.ServerPool` behind one client: a
rollout's turns stay on one server while it is healthy (its prefix cache), new sessions go to
the least-loaded server, per-server concurrency adapts to 429s and failures, a failing server
is ejected and probed back in. The per-server limiters (``model_requests@host:port``) join the
environment's ``limits``, each up to ``model_request_limit``. Servers with different API keys
cannot share a pool; they are used in turn, group by group, as with ``server_pool=False``.

Before the first request, :func:`check_reachable` proves the server answers HTTP at all,
within a bounded time (atroposlib's own health check waits forever on a dead server).
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

    Attributes:
        base_url: The configured base URL (usually ending in ``/v1``; shown redacted).
        server_type: ``openai``, ``vllm`` or ``sglang``.
        model_name: ``model`` for chat requests.
        api_key: Bearer token, if any (never logged).
        timeout: Overall per-request deadline in seconds.
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
    """Turn atroposlib server configs into :class:`ServerSpec` s.

    Accepts a list of ``APIServerConfig``, a single one, or a ``ServerBaseline`` (which atroposlib
    expands to four servers at ``localhost:9004-9007``; the same here).

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
    """The token protocol to speak: ``vllm``, ``completions``, ``atropos`` or ``sglang``.

    Without a probe, ``auto`` means ``sglang`` for SGLang servers and ``vllm`` otherwise;
    :func:`open_model_clients` probes a vLLM server once instead
    (:func:`~hermes_async.inference.completions.detect_token_endpoint`).

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
    """:func:`_endpoint_kind`, with ``auto`` on a vLLM server decided by one probe.

    The probe asks whether ``/inference/v1/generate`` exists (a vLLM started without
    ``--enable-scale-out`` answers 403); if not, the stock ``/v1/completions`` route is used.
    The answer is kept in ``cache`` (by root URL), so an environment probes each server once.

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

    With ``pool`` and several servers that can share one (:func:`_poolable`), the list holds
    one client on a :class:`ServerPool` of them all; else one client per server.

    Args:
        specs: The servers.
        token_endpoint: The token protocol (see :func:`_endpoint_kind`).
        limiter: The one-server clients' request limiter; with a pool, its total is each
            server's highest concurrency (unless ``pool_options`` is given).
        transport: An httpx transport for every client (tests).
        pool: Put several servers behind one :class:`ServerPool`.
        limits: Where the pool's per-server limiters are added.
        pool_options: The pool's options (default: ``max_limit`` from ``limiter``, the request
            deadline from the specs' ``timeout``).

    With ``token_endpoint="auto"`` a vLLM server's route is probed (once per server when an
    ``endpoint_cache`` is passed; see :func:`_resolve_endpoint_kind`).

    ``vocab_size`` (the tokenizer's ``len()``) makes token clients reject ids outside the
    vocabulary (:class:`~hermes_async.inference.InvalidTokenDataError`).

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

    Each probe is a ``GET {root_url}/health`` through the clients' own transport choice
    (:func:`hermes_async.inference.probe_server`). A server that is still starting gets
    retries every :data:`_PROBE_INTERVAL_SECONDS`, and one warning says at once what is waited
    for and how long; one that never answers ends in a :class:`ServerUnreachableError` naming
    the URL (credentials redacted) and what to do.

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
