"""A tiny HTTP/1.1 server on loopback for the browser tests, counting every connection.

``Site`` serves a dict of paths (``"/form"``) to :class:`Page` values or callables that get the
:class:`Received` request. Every accepted TCP connection is counted *before* anything is read,
so a test that expects "0 requests reached this server" also rules out preconnects and
half-open probes. Each response closes its connection (no keep-alive), which keeps the count
equal to the number of requests that got through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.abc import TaskStatus

__all__ = ["Page", "Received", "Site"]

_READ_TIMEOUT_SECONDS = 10.0
_MAX_HEAD_BYTES = 65536


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Page:
    body: bytes | str
    content_type: str = "text/html; charset=utf-8"
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0  # seconds the server waits before answering


Handler = Page | Callable[[Received], Page]


@dataclass
class Site:
    pages: Mapping[str, Handler] = field(default_factory=dict)
    connections: int = 0
    received: list[Received] = field(default_factory=list)
    port: int = 0

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.origin + path

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started(self.port)
            await listener.serve(self._connection)

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        async with stream:
            try:
                with anyio.fail_after(_READ_TIMEOUT_SECONDS):
                    request = await _read_request(stream)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, ValueError):
                return
            self.received.append(request)
            handler = self.pages.get(request.path)
            if handler is None:
                page = Page("<title>Not found</title><h1>404</h1>", status=404)
            elif isinstance(handler, Page):
                page = handler
            else:
                page = handler(request)
            if page.delay:
                await anyio.sleep(page.delay)
            body = page.body.encode() if isinstance(page.body, str) else page.body
            head = [
                f"HTTP/1.1 {page.status} X",
                f"Content-Type: {page.content_type}",
                f"Content-Length: {len(body)}",
                "Connection: close",
            ]
            head += [f"{k}: {v}" for k, v in page.headers]
            try:
                await stream.send(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return


async def _read_request(stream: anyio.abc.SocketStream) -> Received:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive()
        if len(data) > _MAX_HEAD_BYTES:
            raise ValueError("request head too large")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    while len(body) < length:
        body += await stream.receive()
    path, _, query = target.partition("?")
    return Received(method, path, query, headers, body[:length])
