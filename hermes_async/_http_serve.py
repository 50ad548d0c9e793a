"""A minimal HTTP/1.1 GET server for local pages: the metrics endpoint and the run viewer.

One request per connection (``Connection: close``), a request head of at most
:data:`MAX_REQUEST_BYTES`, and every read and write bounded by :data:`READ_TIMEOUT_SECONDS`;
a silent or slow client is dropped. The caller decides the bind address (loopback by default).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus

__all__ = ("MAX_REQUEST_BYTES", "READ_TIMEOUT_SECONDS", "Answer", "serve_get")

#: Longest wait for a client's request head, and for the answer to be sent.
READ_TIMEOUT_SECONDS = 5.0
#: A longer request head is not read further (the request is answered as it stands).
MAX_REQUEST_BYTES = 8192

#: ``path -> (status, content type, body)``; called for each GET (query string removed).
Answer = Callable[[str], tuple[str, str, bytes]]


async def serve_get(
    answer: Answer,
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer GET requests with ``answer(path)`` until cancelled.

    Start it with ``port = await tg.start(serve_get, answer, 0)``. Other methods get 405.

    **Cancellation**: the listener and every open connection are closed.
    """
    async with await anyio.create_tcp_listener(local_host=host, local_port=port) as listener:
        task_status.started(listener.extra(SocketAttribute.local_port))

        async def handle(stream: SocketStream) -> None:
            await _answer(stream, answer)

        await listener.serve(handle)


async def _answer(stream: SocketStream, answer: Answer) -> None:
    async with stream:
        request = b""
        with anyio.move_on_after(READ_TIMEOUT_SECONDS):
            while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST_BYTES:
                try:
                    request += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
        first = request.split(b"\r\n", 1)[0].split()
        if len(first) >= 2 and first[0] == b"GET":
            path = first[1].split(b"?")[0].decode("latin-1")
            status, kind, body = answer(path)
        else:
            status, kind, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
        )
        try:
            with anyio.move_on_after(READ_TIMEOUT_SECONDS):
                await stream.send(head.encode() + body)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the client went away
