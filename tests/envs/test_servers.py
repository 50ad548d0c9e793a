"""Server specs and the reachability probe: bounded, through the clients' transport, redacted."""

from __future__ import annotations

import socket
from contextlib import AsyncExitStack

import anyio
import httpx
import pytest

from hermes_async.envs._servers import (
    ServerSpec,
    ServerUnreachableError,
    check_reachable,
    open_model_clients,
)
from hermes_async.inference import SamplingParams, VLLMGenerateClient
from hermes_async.inference.tokenizer import load_tokenizer
from hermes_async.limits import Limits
from hermes_async.testing import FixedScript, ScriptedModelServer, open_loopback_server

pytestmark = pytest.mark.anyio


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spec(base_url: str, api_key: str | None = None) -> ServerSpec:
    return ServerSpec(base_url, "vllm", "m", api_key, 60.0)


async def test_an_unreachable_server_is_named_without_its_credentials() -> None:
    spec = _spec(f"http://admin:pw-secret@127.0.0.1:{_closed_port()}/v1", api_key="sk-secret")
    start = anyio.current_time()
    with pytest.raises(ServerUnreachableError, match=r"did not answer within 0\.5 s") as info:
        await check_reachable(spec, timeout=0.5)
    assert anyio.current_time() - start < 5
    assert "pw-secret" not in str(info.value)
    assert "[REDACTED]@127.0.0.1" in str(info.value)
    assert "ServerConnectError" in str(info.value)
    assert "pw-secret" not in repr(spec) and "sk-secret" not in repr(spec)


async def test_any_answer_counts_and_the_probe_asks_the_root_for_health() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url}")
        return httpx.Response(503 if len(seen) == 1 else 404)

    await check_reachable(
        _spec("http://model:8000/v1"), timeout=5, transport=httpx.MockTransport(handler)
    )
    assert seen == ["GET http://model:8000/health"]  # a 503 is an answer too


async def test_several_servers_share_one_pool_unless_their_keys_differ() -> None:
    tokenizer = load_tokenizer()
    servers = [
        ScriptedModelServer(FixedScript(["ok"], repeat=True), tokenizer=tokenizer) for _ in range(2)
    ]
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(open_loopback_server(s)) for s in servers]
        specs = [_spec(u + "/v1") for u in urls]
        limits = Limits(model_requests=5)
        async with open_model_clients(
            specs, limiter=limits.model_requests, limits=limits
        ) as clients:
            assert len(clients) == 1 and isinstance(clients[0], VLLMGenerateClient)
            client = clients[0]
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(client.generate, [i, 1], SamplingParams(max_tokens=4))
            pooled = {lim.name: lim.total for lim in limits if "@" in lim.name}
        assert all(len(s.requests) >= 2 for s in servers)  # both served (least loaded)
        assert pooled == {f"model_requests@{u.removeprefix('http://')}": 5 for u in urls}
        async with open_model_clients(specs, pool=False) as clients:
            assert len(clients) == 2
        keyed = [_spec(u + "/v1", api_key=f"k{i}") for i, u in enumerate(urls)]
        async with open_model_clients(keyed) as clients:
            assert len(clients) == 2  # different keys: one client each, used in turn
