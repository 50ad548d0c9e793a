"""The worker's HTTP API over real loopback HTTP: groups, streaming, bad requests, drain."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from hermes_async.service.app import NDJSON
from hermes_async.service.dispatch import HTTPWorker
from hermes_async.service.serve import serve_worker
from hermes_async.service.wire import GroupRequest, GroupResult
from hermes_async.service.worker import RolloutWorker
from tests.service.test_worker import worker_on

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def served(
    tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[RolloutWorker, httpx.AsyncClient]]:
    async with worker_on(tmp_path, **options) as worker, anyio.create_task_group() as tg:
        stop = anyio.Event()
        url = await tg.start(
            lambda task_status: serve_worker(worker, stop=stop, task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield worker, client
        stop.set()


def body(**changes: Any) -> dict[str, Any]:
    request = GroupRequest.within(60, "echo", {"label": "x"}, 2).to_json()
    request.update(changes)
    return request


async def test_a_group_over_http_and_streamed(tmp_path: Path) -> None:
    async with served(tmp_path) as (_worker, client):
        response = await client.post("/groups", json=body())
        assert response.status_code == 200
        result = GroupResult.from_bytes(response.content)
        assert result.outcome == "ok" and result.rewards == [1.0, 1.0]

        lines: list[dict[str, Any]] = []
        async with client.stream(
            "POST", "/groups", json=body(size=3), headers={"accept": NDJSON}
        ) as streamed:
            assert streamed.headers["content-type"] == NDJSON
            async for line in streamed.aiter_lines():
                lines.append(orjson.loads(line))
        assert [line["type"] for line in lines] == ["rollout"] * 3 + ["result"]
        final = GroupResult.from_json(lines[-1]["result"])
        assert sorted(line["rollout"]["task_id"] for line in lines[:3]) == sorted(
            r.task_id for r in final.rollouts
        )
        # The same client the driver uses.
        result = await HTTPWorker(str(client.base_url), client).run_group(
            GroupRequest.within(60, "echo", {"label": "y"}, 1)
        )
        assert result.rewards == [1.0]


async def test_bad_requests_get_4xx_and_the_worker_keeps_serving(tmp_path: Path) -> None:
    async with served(tmp_path, max_body_bytes=4096) as (_worker, client):
        cases: list[tuple[Any, int, str]] = [
            (body(environment="nope"), 404, "unknown environment 'nope'"),
            (b"{not json", 400, "not valid JSON"),
            (body(size=0), 400, "'size' must be between 1 and 256"),
            (body(size=10**6), 400, "got 1000000"),
            (body(deadline=time.time() - 5), 400, "has already passed"),
            (body(item={"label": "a b"}), 422, "refused the item"),
            (body(wire=7), 422, "wire version 7"),
            (b"x" * 5000, 413, "this worker takes at most 4096"),
        ]
        for sent, status, message in cases:
            content = sent if isinstance(sent, bytes) else orjson.dumps(sent)
            response = await client.post("/groups", content=content)
            assert response.status_code == status, (sent, response.text)
            assert message in response.json()["error"]
            assert response.json()["status"] == status

        # A body that lies about its length past the limit is cut off as it streams.
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" " * 1000

        response = await client.post("/groups", content=chunks())
        assert response.status_code == 413
        assert (await client.get("/groups")).status_code == 405
        assert (await client.get("/nothing")).status_code == 404
        assert (await client.get("/health")).json()["status"] == "serving"
        response = await client.post("/groups", json=body())
        assert response.status_code == 200
        stats = (await client.get("/statistics")).json()
        assert stats["refused"] == 9 and stats["answered"] == {"ok": 1}


async def test_drain_over_http(tmp_path: Path) -> None:
    async with served(tmp_path) as (_worker, client), anyio.create_task_group() as tg:
        answers: list[httpx.Response] = []

        async def slow() -> None:
            answers.append(await client.post("/groups", json=body(item={"label": "s", "sleep": 1})))

        tg.start_soon(slow)
        await anyio.sleep(0.4)
        response = await client.post("/drain")
        assert response.status_code == 202 and response.json()["status"] == "draining"
        assert (await client.get("/health")).status_code == 503
        refused = await client.post("/groups", json=body())
        assert refused.status_code == 503 and "takes no new groups" in refused.json()["error"]
        stats = (await client.get("/statistics")).json()
        assert stats["state"] == "draining" and stats["groups_running"] == 1
    [answer] = answers
    assert answer.status_code == 200
    assert GroupResult.from_bytes(answer.content).rewards == [1.0, 1.0]


async def test_a_client_that_disconnects_cancels_its_group(tmp_path: Path) -> None:
    async with served(tmp_path) as (worker, client):
        with anyio.move_on_after(1.0):
            await client.post("/groups", json=body(item={"label": "s", "sleep": 60}))
        with anyio.fail_after(10):
            while worker.statistics().groups_running:
                await anyio.sleep(0.05)
        assert worker.manager.statistics().active == 0


async def _raw_exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection; everything the worker sends back until it closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    answer = b""
    with anyio.fail_after(10):
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(request)
            try:
                while True:
                    answer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    return answer


async def test_a_websocket_handshake_is_refused_with_a_400(tmp_path: Path) -> None:
    async with served(tmp_path) as (_worker, client):
        answer = await _raw_exchange(
            str(client.base_url),
            b"GET /health HTTP/1.1\r\nHost: worker\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        assert b"speaks plain HTTP, not WebSocket" in answer
        assert (await client.get("/health")).json()["status"] == "serving"


async def test_a_body_that_never_arrives_is_refused_with_a_408(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hermes_async.service.app.BODY_TIMEOUT_SECONDS", 0.3)
    async with served(tmp_path) as (_worker, client):
        answer = await _raw_exchange(
            str(client.base_url),
            b'POST /groups HTTP/1.1\r\nHost: worker\r\nContent-Length: 100\r\n\r\n{"wire": 1',
        )
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"did not arrive within 0.3 s (10 bytes came)" in answer
        stats = (await client.get("/statistics")).json()
        assert stats["refused"] == 1 and stats["groups_running"] == 0
