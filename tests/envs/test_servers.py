"""Server specs and the reachability probe: bounded, through the clients' transport, redacted."""

from __future__ import annotations

import socket

import anyio
import httpx
import pytest

from hermes_async.envs._servers import ServerSpec, ServerUnreachableError, check_reachable

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
