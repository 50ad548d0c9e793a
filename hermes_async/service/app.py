"""The worker's HTTP API: a plain ASGI app over one :class:`RolloutWorker`.

``POST /groups`` (optionally NDJSON, a line per rollout), ``GET /health``,
``GET /statistics``, ``POST /drain``. A refused request gets a 4xx or 503 and the worker
goes on; bodies are bounded in size and time; a client that disconnects cancels its group.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import orjson

from hermes_async._asgi import ASGIApp
from hermes_async.agent.rollout import ScoredRollout
from hermes_async.errors import RequestError
from hermes_async.service.wire import WIRE_VERSION, GroupRequest, RolloutRecord
from hermes_async.service.worker import RolloutWorker

__all__ = ("BODY_TIMEOUT_SECONDS", "NDJSON", "worker_app")

logger = logging.getLogger(__name__)

#: The streaming answer's media type.
NDJSON = "application/x-ndjson"

#: How much of an oversized body is read (and dropped) before answering 413.
_DISCARD_FACTOR = 4

#: Longest wait for a request's whole body (1 MiB in a minute is 17 KiB/s); past it, 408.
BODY_TIMEOUT_SECONDS = 60.0

_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def worker_app(worker: RolloutWorker, *, on_drain: Callable[[], object] | None = None) -> ASGIApp:
    """The ASGI app of ``worker``.

    Args:
        on_drain: Called once after ``POST /drain`` (e.g. to stop serving when drained).
    """

    async def app(scope: MutableMapping[str, Any], receive: _Receive, send: _Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await _refuse_websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        try:
            if path == "/groups":
                _allow(method, "POST")
                await _groups(worker, scope, receive, send)
            elif path == "/health":
                _allow(method, "GET")
                status = 200 if worker.state == "serving" else 503
                body = {"status": worker.state, "name": worker.name, "wire": WIRE_VERSION}
                await _json(send, status, body)
            elif path == "/statistics":
                _allow(method, "GET")
                await _json(send, 200, worker.statistics().to_json())
            elif path == "/drain":
                _allow(method, "POST")
                first = worker.state == "serving"
                worker.refuse_new()
                if first and on_drain is not None:
                    on_drain()
                await _json(send, 202, {"status": worker.state, "name": worker.name})
            else:
                raise RequestError(
                    f"no route {path!r}; routes: POST /groups, GET /health, GET /statistics, "
                    "POST /drain",
                    status=404,
                )
        except RequestError as exc:
            await _json(send, exc.status, {"error": str(exc), "status": exc.status})

    return app


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise RequestError(f"method {method} not allowed here; use {allowed}", status=405)


async def _lifespan(receive: _Receive, send: _Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _refuse_websocket(
    scope: MutableMapping[str, Any], receive: _Receive, send: _Send
) -> None:
    """Refuse a WebSocket handshake with a 400 (the server's bare 403 if it cannot send one)."""
    if (await receive())["type"] != "websocket.connect":
        return
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close"})
        return
    data = orjson.dumps({"error": "this worker speaks plain HTTP, not WebSocket", "status": 400})
    await send(
        {
            "type": "websocket.http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": data})


async def _json(send: _Send, status: int, body: object) -> None:
    data = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _read_body(scope: MutableMapping[str, Any], receive: _Receive, limit: int) -> bytes:
    """The request body: refused past ``limit`` bytes (413) or ``BODY_TIMEOUT_SECONDS`` (408)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise RequestError(f"bad content-length {value!r:.40}") from None
            if declared > limit:
                raise RequestError(
                    f"the body is {declared} bytes; this worker takes at most {limit}", status=413
                )
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(BODY_TIMEOUT_SECONDS):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError("the client went away before sending the body", status=400)
            chunk = message.get("body", b"")
            size += len(chunk)
            more = message.get("more_body", False)
            if size > limit:
                # Read on (and drop) up to DISCARD_FACTOR x the limit so the client, still
                # sending, gets the 413 rather than a reset; past that the connection is cut.
                if more and size <= limit * _DISCARD_FACTOR:
                    chunks.clear()
                    continue
                raise RequestError(
                    f"the body is over {limit} bytes; this worker takes at most {limit}",
                    status=413,
                )
            chunks.append(chunk)
            if not more:
                return b"".join(chunks)
    raise RequestError(
        f"the body did not arrive within {BODY_TIMEOUT_SECONDS:g} s ({size} bytes came)",
        status=408,
    )


def _wants_stream(scope: MutableMapping[str, Any]) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"accept" and NDJSON.encode() in value:
            return True
    return False


async def _groups(
    worker: RolloutWorker, scope: MutableMapping[str, Any], receive: _Receive, send: _Send
) -> None:
    try:
        body = await _read_body(scope, receive, worker.options.max_body_bytes)
    except RequestError:
        worker.refused()
        raise
    request = worker.parse(body)
    worker.admit(request)
    stream = _wants_stream(scope)
    async with anyio.create_task_group() as tg:

        async def watch_disconnect() -> None:
            # A client that goes away cancels its group: nobody would read the answer.
            while (await receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel(reason="the client disconnected")

        tg.start_soon(watch_disconnect)
        if stream:
            await _answer_streaming(worker, request, send)
        else:
            try:
                result = await worker.answer(request)
            except RequestError as exc:
                await _json(send, exc.status, {"error": str(exc), "status": exc.status})
            else:
                await _send_bytes(send, 200, "application/json", result.to_bytes())
        tg.cancel_scope.cancel(reason="answered")


async def _send_bytes(send: _Send, status: int, kind: str, data: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", kind.encode()),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _answer_streaming(worker: RolloutWorker, request: GroupRequest, send: _Send) -> None:
    """NDJSON: a line per finished rollout, then the result (or the error) as the last line."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", NDJSON.encode())],
        }
    )
    # Room for every rollout and the result: the group never waits for a slow reader, and
    # the buffer is bounded by the group's size (itself bounded).
    lines_in, lines_out = anyio.create_memory_object_stream[bytes](request.size + 1)

    def finished(scored: ScoredRollout) -> None:
        line = {
            "type": "rollout",
            "rollout": RolloutRecord.of(scored, messages=request.include_messages).to_json(),
        }
        lines_in.send_nowait(orjson.dumps(line) + b"\n")

    async def pump() -> None:
        async with lines_out:
            async for line in lines_out:
                await send({"type": "http.response.body", "body": line, "more_body": True})

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        async with lines_in:
            try:
                result = await worker.answer(request, on_rollout=finished)
                last: dict[str, Any] = {"type": "result", "result": result.to_json()}
            except RequestError as exc:
                last = {"type": "error", "error": str(exc), "status": exc.status}
            await lines_in.send(orjson.dumps(last) + b"\n")
    await send({"type": "http.response.body", "body": b"", "more_body": False})
