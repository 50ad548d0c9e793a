"""The lean HTTP client over TLS: a private CA, keep-alive reuse, streaming, a failed check."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest
import trustme
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSListener

from hermes_async.inference import HTTPOptions, RetryPolicy, ServerConnectError
from hermes_async.inference._http import ServerConnection
from hermes_async.inference._wire import WirePool

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


class _Server:
    def __init__(self) -> None:
        self.accepts = 0
        self.requests: list[bytes] = []
        self.port = 0


async def _serve_connection(stream: anyio.abc.ByteStream, server: _Server) -> None:
    server.accepts += 1
    reader = BufferedByteReceiveStream(stream)
    try:
        while True:
            head = await reader.receive_until(b"\r\n\r\n", 65536)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.receive_exactly(length) if length else b""
            server.requests.append(head.split(b"\r\n")[0])
            if b"stream" in head.split(b"\r\n")[0]:
                events = b"".join(
                    b"data: " + json.dumps({"n": n}).encode() + b"\n\n" for n in range(3)
                )
                chunk = f"{len(events):x}\r\n".encode() + events + b"\r\n0\r\n\r\n"
                await stream.send(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n" + chunk
                )
            else:
                payload = json.dumps({"echo": json.loads(body)}).encode()
                await stream.send(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
    except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, ssl.SSLError):
        pass
    finally:
        await stream.aclose()


@asynccontextmanager
async def _tls_server(ca: trustme.CA) -> AsyncIterator[_Server]:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    server = _Server()
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1")
    server.port = tcp.extra(anyio.abc.SocketAttribute.local_port)
    listener = TLSListener(tcp, server_context, standard_compatible=False)
    async with listener, anyio.create_task_group() as tg:

        async def handle(stream: anyio.abc.ByteStream) -> None:
            await _serve_connection(stream, server)

        tg.start_soon(listener.serve, handle)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


async def test_https_with_a_private_ca_reuses_one_connection(ca: trustme.CA) -> None:
    options = HTTPOptions(ssl_context=_client_context(ca))
    async with _tls_server(ca) as server:
        url = f"https://127.0.0.1:{server.port}/v1"
        async with ServerConnection(url, options=options) as conn:
            assert conn.transport_kind == "wire"
            assert await conn.post_json("a", {"n": 1}) == {"echo": {"n": 1}}
            assert await conn.post_json("b", {"n": 2}) == {"echo": {"n": 2}}
            async with conn.open_lines("stream", {}) as reader:
                lines = []
                while (line := await reader.readline()) is not None:
                    lines.append(line)
            assert [json.loads(x[len("data: ") :]) for x in lines if x] == [
                {"n": 0},
                {"n": 1},
                {"n": 2},
            ]
            # TLS 1.3 session tickets arrive after the handshake: they must not make an idle
            # connection look closed, or every request would pay a new handshake.
            assert server.accepts == 1
            assert isinstance(conn.transport, WirePool)
            assert conn.transport.connections_opened == 1
    assert server.requests == [
        b"POST /v1/a HTTP/1.1",
        b"POST /v1/b HTTP/1.1",
        b"POST /v1/stream HTTP/1.1",
    ]


async def test_https_to_an_untrusted_certificate_is_a_clear_connect_error(
    ca: trustme.CA,
) -> None:
    options = HTTPOptions(retry=RetryPolicy(max_attempts=1))  # the system trust store only
    async with _tls_server(ca) as server:
        url = f"https://127.0.0.1:{server.port}"
        async with ServerConnection(url, options=options) as conn:
            with pytest.raises(ServerConnectError, match=r"cannot connect.*CERTIFICATE_VERIFY"):
                await conn.post_json("a", {})
    assert server.requests == []
