"""The lean HTTP/1.1 client (``_wire``) and ``ServerConnection`` over it, against loopback
servers scripted byte by byte in the test's own task group."""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import anyio
import anyio.abc
import httpx
import pytest
from hypothesis import given, strategies as st

from hermes_async.inference import ChatClient, _http
from hermes_async.inference._errors import (
    ModelServerError,
    ServerConnectError,
    ServerProtocolError,
    ServerStatusError,
    ServerTimeoutError,
    StreamInterruptedError,
)
from hermes_async.inference._http import HTTPOptions, RetryPolicy, ServerConnection
from hermes_async.inference._transport import BodyCut
from hermes_async.inference._wire import WirePool, _Exchange
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import NamedLimiter
from tests.support import FAST_RETRY, open_fds

pytestmark = pytest.mark.anyio

#: One retry, soon.
RETRY_ONCE = replace(FAST_RETRY, max_attempts=2)

#: Bound on waiting for something the test expects to happen "soon" (generous on 2 cores).
SOON = 5.0

#: What ServerConnection gives its pool by default.
HEAD_BOUNDS = {
    "max_head_bytes": HTTPOptions().max_head_bytes,
    "max_header_lines": HTTPOptions().max_header_lines,
}

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


# ------------------------------------------------------------------ the scripted server


@dataclass(frozen=True, slots=True)
class Request:
    line: str
    headers: dict[str, str]
    body: bytes


class Peer:
    """One accepted connection, seen from the server side."""

    def __init__(self, stream: anyio.abc.SocketStream, index: int) -> None:
        self.stream = stream
        self.index = index
        self.requests: list[Request] = []
        #: Set when the server's read sees end-of-stream or a reset: the client closed.
        self.client_closed = anyio.Event()
        #: Set once the server side closed the socket.
        self.server_closed = anyio.Event()
        #: Set once a complete request has been read.
        self.got_request = anyio.Event()
        self._buffer = bytearray()

    async def _fill(self) -> bool:
        try:
            data = await self.stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.client_closed.set()
            return False
        self._buffer += data
        return True

    async def read_request(self) -> Request | None:
        """The next request, or ``None`` if the client closed the connection first."""
        while b"\r\n\r\n" not in self._buffer:
            if not await self._fill():
                assert not self._buffer, f"client closed mid-request: {bytes(self._buffer)!r}"
                return None
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        line, *header_lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for header in header_lines:
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        self._buffer = bytearray(rest)
        while len(self._buffer) < length:
            assert await self._fill(), "client closed mid-body"
        body = bytes(self._buffer[:length])
        del self._buffer[:length]
        request = Request(line, headers, body)
        self.requests.append(request)
        self.got_request.set()
        return request

    async def send(self, data: bytes) -> None:
        await self.stream.send(data)

    async def wait_client_close(self) -> None:
        """Read (and discard) until the client closes its end."""
        while await self._fill():
            self._buffer.clear()


Handler = Callable[[Peer], Awaitable[None]]


class Server:
    """A loopback HTTP/1.1 server whose every connection runs ``handler``."""

    def __init__(self, handler: Handler, port: int) -> None:
        self.handler = handler
        self.port = port
        self.peers: list[Peer] = []
        self.connected = anyio.Event()

    @property
    def accepts(self) -> int:
        return len(self.peers)

    @property
    def requests(self) -> list[Request]:
        return [r for peer in self.peers for r in peer.requests]

    def url(self, prefix: str = "/v1") -> str:
        return f"http://127.0.0.1:{self.port}{prefix}"

    async def _accept(self, stream: anyio.abc.SocketStream) -> None:
        peer = Peer(stream, len(self.peers))
        self.peers.append(peer)
        self.connected.set()
        await self._run(peer)

    async def _run(self, peer: Peer) -> None:
        try:
            await self.handler(peer)
        finally:
            with anyio.move_on_after(1, shield=True):
                await peer.stream.aclose()
            peer.server_closed.set()


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        server = Server(handler, port)
        tg.start_soon(listener.serve, server._accept, tg)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


def http_response(
    body: bytes = b"",
    *,
    status: int = 200,
    reason: str = "OK",
    headers: Iterable[tuple[str, str]] = (),
) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def json_response(
    value: object, *, status: int = 200, headers: Iterable[tuple[str, str]] = ()
) -> bytes:
    body = json.dumps(value).encode()
    return http_response(
        body, status=status, headers=[("Content-Type", "application/json"), *headers]
    )


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def keep_alive(respond: Callable[[int, Request], bytes]) -> Handler:
    """A handler answering every request on the connection with ``respond(n, request)``,
    ``n`` counting requests across all connections."""
    counter = [0]

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            n = counter[0]
            counter[0] += 1
            await peer.send(respond(n, request))

    return handler


def connection(
    url: str,
    *,
    options: HTTPOptions | None = None,
    api_key: str | None = None,
    limiter: NamedLimiter | None = None,
) -> ServerConnection:
    return ServerConnection(
        url,
        options=options or HTTPOptions(retry=RETRY_ONCE),
        api_key=api_key,
        limiter=limiter,
        rng=random.Random(0),
    )


def pool_of(conn: ServerConnection) -> WirePool:
    assert conn.transport_kind == "wire"
    pool = conn.transport
    assert isinstance(pool, WirePool)
    return pool


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


# ------------------------------------------------------------------ keep-alive and framing


async def test_keep_alive_reuses_one_connection_with_both_body_framings() -> None:
    payload: JSONObject = {"prompt": "héllo ✓", "n": 2, "nested": {"a": [1, 2.5, None]}}

    def respond(n: int, request: Request) -> bytes:
        if n == 0:
            return json_response({"first": True, "echo": json.loads(request.body)})
        body = json.dumps({"second": "chunked ✓"}).encode()
        return CHUNKED_HEAD + chunk(body[:7]) + chunk(body[7:]) + LAST_CHUNK

    options = HTTPOptions(retry=RETRY_ONCE, headers={"X-Extra": "yes"})
    async with serving(keep_alive(respond)) as server:
        conn = ServerConnection(server.url(), options=options, api_key="sk-test")
        async with conn:
            first = await conn.post_json("generate", payload)
            second = await conn.post_json("/generate", payload)
            assert pool_of(conn).connections_opened == 1
            assert pool_of(conn).idle_connections == 1

    assert first == {"first": True, "echo": payload}
    assert second == {"second": "chunked ✓"}
    assert server.accepts == 1
    assert len(server.requests) == 2
    for request in server.requests:
        assert request.line == "POST /v1/generate HTTP/1.1"
        assert request.headers["host"] == f"127.0.0.1:{server.port}"
        assert request.headers["content-type"] == "application/json"
        assert request.headers["x-extra"] == "yes"
        assert request.headers["authorization"] == "Bearer sk-test"
        assert request.headers["content-length"] == str(len(request.body))
        # UTF-8 as written (not \u-escaped), compact separators.
        compact = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        assert request.body == compact.encode("utf-8")


async def test_no_authorization_header_without_an_api_key() -> None:
    handler = keep_alive(lambda n, r: json_response({}))
    async with serving(handler) as server, connection(server.url("")) as conn:
        assert await conn.post_json("health", {}) == {}
    (request,) = server.requests
    assert request.line == "POST /health HTTP/1.1"
    assert "authorization" not in request.headers


async def test_userinfo_is_basic_auth_on_the_wire_too_and_an_api_key_wins() -> None:
    handler = keep_alive(lambda n, r: json_response({}))
    async with serving(handler) as server:
        url = f"http://bob:pa%3Ass@127.0.0.1:{server.port}/v1"
        async with connection(url) as conn:
            await conn.post_json("a", {})
            assert "pa%3Ass" not in conn.endpoint("a")
        async with connection(url, api_key="sk-key") as conn:
            await conn.post_json("a", {})
    first, second = server.requests
    assert first.line == "POST /v1/a HTTP/1.1"
    assert first.headers["authorization"] == "Basic " + base64.b64encode(b"bob:pa:ss").decode()
    assert second.headers["authorization"] == "Bearer sk-key"


async def test_get_without_a_body_has_no_content_length() -> None:
    handler = keep_alive(lambda n, r: http_response(b"", status=404, reason="Not Found"))
    async with serving(handler) as server, connection(server.url("")) as conn:
        assert await conn.get_status("health") == 404
    (request,) = server.requests
    assert request.line == "GET /health HTTP/1.1"
    assert "content-length" not in request.headers


async def test_connection_close_response_opens_a_new_connection() -> None:
    def respond(n: int, request: Request) -> bytes:
        return json_response({"n": n}, headers=[("Connection", "close")])

    async with serving(keep_alive(respond)) as server, connection(server.url()) as conn:
        assert await conn.post_json("a", {}) == {"n": 0}
        # The client closed its end: the server's keep-alive loop sees end-of-stream.
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()
        assert pool_of(conn).idle_connections == 0
        assert await conn.post_json("a", {}) == {"n": 1}
        assert server.accepts == 2
        assert pool_of(conn).connections_opened == 2


async def test_body_delimited_by_close_is_read_to_the_end() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"until": ')
        await peer.send(b'"close"}')

    async with serving(handler) as server, connection(server.url()) as conn:
        assert await conn.post_json("a", {}) == {"until": "close"}
        assert pool_of(conn).idle_connections == 0


async def test_a_content_length_with_thousands_of_leading_zeros_is_read() -> None:
    # The parser takes it; int() of its 5,002 digits raised a raw ValueError in read_body.
    body = b'{"ok": 1}'
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {'0' * 5000}{len(body)}\r\n\r\n"

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(head.encode() + body)

    async with serving(handler) as server, connection(server.url()) as conn:
        assert await conn.post_json("a", {}) == {"ok": 1}


@pytest.mark.parametrize("status", [b"000 Nothing", b"099 Odd", b"302 Found"])
async def test_a_final_status_outside_2xx_is_a_status_error(status: bytes) -> None:
    # These were taken as success (status < 400) and their body decoded as the answer.
    body = b'{"ok": 1}'

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 " + status + b"\r\nContent-Length: 9\r\n\r\n" + body)

    async with serving(handler) as server, connection(server.url()) as conn:
        with pytest.raises(ServerStatusError, match=f"HTTP {int(status[:3])} ") as info:
            await conn.post_json("a", {})
    assert info.value.status == int(status[:3])


async def test_an_informational_head_before_the_response_is_skipped() -> None:
    def respond(n: int, request: Request) -> bytes:
        early = b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"
        return early + json_response({"n": n}, headers=[("X-Final", "yes")])

    async with serving(keep_alive(respond)) as server, connection(server.url()) as conn:
        assert await conn.post_json("a", {}) == {"n": 0}
        response = await pool_of(conn).send("POST", "a", b"{}")
        try:
            assert (response.status_code, response.reason_phrase) == (200, "OK")
            assert response.headers["x-final"] == "yes"
            assert "link" not in response.headers  # the 103's headers are not the response's
            assert json.loads(await response.aread()) == {"n": 1}
        finally:
            await response.aclose()
        assert server.accepts == 1  # and the connection stays usable


async def test_bytes_after_the_end_of_a_response_retire_the_connection() -> None:
    def respond(n: int, request: Request) -> bytes:
        junk = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" if n == 0 else b""
        return json_response({"n": n}) + junk  # an answer nobody asked for: unusable

    async with serving(keep_alive(respond)) as server, connection(server.url()) as conn:
        assert await conn.post_json("a", {}) == {"n": 0}
        assert await conn.post_json("a", {}) == {"n": 1}
        assert server.accepts == 2
        # A clean response keeps its connection.
        assert await conn.post_json("a", {}) == {"n": 2}
        assert server.accepts == 2


async def test_a_head_request_ends_with_the_response_head() -> None:
    def respond(n: int, request: Request) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"  # no body follows

    async with serving(keep_alive(respond)) as server:
        pool = WirePool(
            server.url(),
            connect_timeout=SOON,
            read_timeout=SOON,
            keepalive_expiry=60,
            max_idle=1,
            **HEAD_BOUNDS,
        )
        try:
            with anyio.fail_after(SOON):
                response = await pool.send("HEAD", "a")
                assert response.headers["content-length"] == "1234"
                assert await response.aread() == b""
                await response.aclose()
        finally:
            await pool.aclose()
        (request,) = server.requests
        assert request.line == "HEAD /v1/a HTTP/1.1"


async def test_concurrent_requests_open_connections_then_share_them() -> None:
    all_in = anyio.Event()

    async def handler(peer: Peer) -> None:
        while await peer.read_request() is not None:
            # Hold every answer until three connections are in: no call can reuse another's.
            if len(server.peers) == 3:
                all_in.set()
            await all_in.wait()
            await peer.send(json_response({"peer": peer.index}))

    async with serving(handler) as server, connection(server.url()) as conn:
        results: list[object] = []

        async def call() -> None:
            results.append(await conn.post_json("x", {}))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(call)
        assert sorted(results, key=str) == [{"peer": 0}, {"peer": 1}, {"peer": 2}]
        assert pool_of(conn).idle_connections == 3
        # A later request reuses a pooled connection instead of opening a fourth.
        assert await conn.post_json("x", {}) in results
        assert server.accepts == 3
        assert pool_of(conn).connections_opened == 3


async def test_pool_keeps_at_most_max_idle_connections() -> None:
    both_in = anyio.Event()
    one_closed = anyio.Event()

    async def handler(peer: Peer) -> None:
        while await peer.read_request() is not None:
            if len(server.peers) == 2:
                both_in.set()
            await both_in.wait()
            await peer.send(http_response(b"ok"))
        one_closed.set()

    async with serving(handler) as server:
        pool = WirePool(
            server.url(),
            connect_timeout=1,
            read_timeout=SOON,
            keepalive_expiry=60,
            max_idle=1,
            **HEAD_BOUNDS,
        )

        async def call() -> None:
            response = await pool.send("POST", "p", b"{}")
            assert await response.aread() == b"ok"
            await response.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            tg.start_soon(call)
        assert pool.connections_opened == 2
        assert pool.idle_connections == 1
        # The surplus connection was closed, and the server saw it go.
        with anyio.fail_after(SOON):
            await one_closed.wait()
        assert sum(p.client_closed.is_set() for p in server.peers) == 1
        await pool.aclose()
        assert pool.idle_connections == 0
        with anyio.fail_after(SOON):
            for peer in server.peers:
                await peer.client_closed.wait()
        with pytest.raises(RuntimeError, match="pool is closed"):
            await pool.send("POST", "p", b"{}")


# ------------------------------------------------------------------ closed connections


async def test_keep_alive_connection_closed_by_the_server_while_idle() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        if peer.index == 0:
            await peer.send(json_response({"conn": 0}))
            return  # close the idle keep-alive connection
        await peer.send(json_response({"conn": peer.index}))
        await peer.wait_client_close()

    # No retries: the pool itself must notice the close and not reuse the connection.
    options = HTTPOptions(retry=RetryPolicy(max_attempts=1))
    async with serving(handler) as server, connection(server.url(), options=options) as conn:
        assert await conn.post_json("a", {}) == {"conn": 0}
        with anyio.fail_after(SOON):
            await server.peers[0].server_closed.wait()
        assert await conn.post_json("a", {}) == {"conn": 1}
        assert server.accepts == 2
        assert len(server.requests) == 2


async def test_keep_alive_closed_just_as_it_is_reused_is_retried_on_a_new_connection() -> None:
    # The race the pool's check cannot see: the server reads the second request on the
    # kept-alive connection and closes it without answering. Nothing was received: retry.
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(json_response({"conn": peer.index}))
        if peer.index == 0:
            await peer.read_request()
            return
        await peer.wait_client_close()

    # One attempt only: a stale kept-alive connection is retried at once without using up an
    # attempt (and without back-off); the server's health is not in question.
    options = HTTPOptions(retry=RetryPolicy(max_attempts=1, initial_backoff_seconds=5.0))
    async with serving(handler) as server, connection(server.url(), options=options) as conn:
        assert await conn.post_json("a", {}) == {"conn": 0}
        start = anyio.current_time()
        assert await conn.post_json("a", {}) == {"conn": 1}
        assert anyio.current_time() - start < 2.5  # no 2.5-5 s back-off
        assert server.accepts == 2
        assert [len(p.requests) for p in server.peers] == [2, 1]


async def test_request_path_is_percent_encoded() -> None:
    async with (
        serving(keep_alive(lambda n, r: json_response({}))) as server,
        connection(server.url()) as conn,
    ):
        await conn.post_json("a b/ü", {})
    assert server.requests[0].line == "POST /v1/a%20b/%C3%BC HTTP/1.1"


async def test_closed_before_any_response_byte_is_retried_then_raised() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()

    async with serving(handler) as server, connection(server.url()) as conn:
        with pytest.raises(
            ServerConnectError, match="closed the connection before responding"
        ) as info:
            await conn.post_json("a", {})
        assert info.value.attempt == 2
        assert "gave up after 2 attempts" in str(info.value)
        assert server.accepts == 2
        assert conn.limiter.statistics().in_use == 0


async def test_connection_refused_is_a_connect_error() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()
    async with connection(f"http://127.0.0.1:{port}") as conn:
        with pytest.raises(ServerConnectError, match="cannot connect to the model server") as info:
            await conn.post_json("a", {})
        assert info.value.attempt == 2


# ------------------------------------------------------------------ statuses and retries


async def test_503_is_retried_on_the_same_connection_then_succeeds() -> None:
    def respond(n: int, request: Request) -> bytes:
        if n == 0:
            return http_response(b"overloaded", status=503, reason="Service Unavailable")
        return json_response({"ok": True})

    async with serving(keep_alive(respond)) as server, connection(server.url()) as conn:
        assert await conn.post_json("a", {"x": 1}) == {"ok": True}
        assert len(server.requests) == 2
        assert server.accepts == 1  # the error body was read, so the connection was kept


async def test_429_waits_for_retry_after() -> None:
    def respond(n: int, request: Request) -> bytes:
        if n == 0:
            return http_response(
                b"slow down",
                status=429,
                reason="Too Many Requests",
                headers=[("Retry-After", "0.2")],
            )
        return json_response({"ok": True})

    async with serving(keep_alive(respond)) as server, connection(server.url()) as conn:
        start = anyio.current_time()
        assert await conn.post_json("a", {}) == {"ok": True}
        elapsed = anyio.current_time() - start
    assert 0.2 <= elapsed < 0.2 + SOON
    assert len(server.requests) == 2


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
@pytest.mark.parametrize("transport", ["wire", "httpx"])
async def test_a_429_with_retry_after_then_success_leaves_no_descriptor(transport: str) -> None:
    # The earlier red team saw three descriptors (not sockets) left after this sequence.
    def respond(n: int, request: Request) -> bytes:
        if n % 2 == 0:
            headers = [("Retry-After", "0.05")]
            return http_response(b"slow down", status=429, reason="Too Many", headers=headers)
        return json_response({"ok": True})

    async with serving(keep_alive(respond)) as server:
        before = open_fds()
        for _ in range(3):
            conn = ServerConnection(
                server.url(),
                options=HTTPOptions(retry=FAST_RETRY),
                transport=httpx.AsyncHTTPTransport() if transport == "httpx" else None,
            )
            async with conn:
                assert await conn.post_json("a", {}) == {"ok": True}
        with anyio.fail_after(SOON):  # the server closes its side once the client has
            for peer in server.peers:
                await peer.server_closed.wait()
        left = open_fds() - before
    assert left == set()
    assert len(server.requests) == 6


async def test_404_is_not_retried_and_shows_the_body() -> None:
    def respond(n: int, request: Request) -> bytes:
        return http_response(b"no route /v1/nope", status=404, reason="Not Found")

    async with serving(keep_alive(respond)) as server, connection(server.url()) as conn:
        with pytest.raises(
            ServerStatusError, match=r"HTTP 404 Not Found: the request was rejected"
        ) as info:
            await conn.post_json("nope", {})
        assert info.value.status == 404
        assert info.value.attempt == 1
        assert info.value.line == "no route /v1/nope"
        assert len(server.requests) == 1
        assert pool_of(conn).idle_connections == 1


# ------------------------------------------------------------------ cut and stalled bodies


async def test_body_cut_midway_is_stream_interrupted_and_not_retried() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"partial": ')

    async with serving(handler) as server, connection(server.url()) as conn:
        with pytest.raises(StreamInterruptedError, match="closed before the response body ended"):
            await conn.post_json("a", {})
        assert server.accepts == 1
        assert pool_of(conn).idle_connections == 0
        assert conn.limiter.statistics().in_use == 0


async def test_streamed_body_cut_midway_delivers_lines_then_interrupts() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(CHUNKED_HEAD + chunk(b"line one\r\nline two\n") + chunk(b"line thr"))

    async with serving(handler) as server, connection(server.url()) as conn:
        lines: list[str | None] = []
        with pytest.raises(
            StreamInterruptedError, match="closed before the response body ended"
        ) as info:
            async with conn.open_lines("stream", {}) as reader:
                while True:
                    lines.append(await reader.readline())
        # The cut-off "line thr" is never handed out as if it were complete.
        assert lines == ["line one", "line two"]
        assert info.value.status == 200
        assert server.accepts == 1
        assert conn.limiter.statistics().in_use == 0


async def test_response_head_never_sent_is_a_read_timeout() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.wait_client_close()

    options = HTTPOptions(read_timeout=0.3, retry=RETRY_ONCE)
    async with serving(handler) as server, connection(server.url(), options=options) as conn:
        start = anyio.current_time()
        with pytest.raises(ServerTimeoutError, match=r"read timeout after 0\.3 s") as info:
            await conn.post_json("a", {})
        elapsed = anyio.current_time() - start
        assert info.value.kind == "read"
        assert info.value.timeout == 0.3
        assert 0.3 <= elapsed < 0.3 + SOON
        assert server.accepts == 1  # timeouts are not retried
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()


async def test_stall_mid_stream_is_a_read_timeout() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(CHUNKED_HEAD + chunk(b"first\n"))
        await peer.wait_client_close()

    options = HTTPOptions(read_timeout=0.3, retry=RETRY_ONCE)
    async with serving(handler) as server, connection(server.url(), options=options) as conn:
        async with conn.open_lines("stream", {}) as reader:
            assert await reader.readline() == "first"
            start = anyio.current_time()
            with pytest.raises(ServerTimeoutError, match=r"no data for 0.3 s") as info:
                await reader.readline()
            assert 0.3 <= anyio.current_time() - start < 0.3 + SOON
        assert info.value.kind == "read"
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()
        assert pool_of(conn).idle_connections == 0


async def test_stall_in_a_post_json_body_is_a_read_timeout() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{")
        await peer.wait_client_close()

    options = HTTPOptions(read_timeout=0.2, request_timeout=1.0, retry=RETRY_ONCE)
    async with serving(handler) as server, connection(server.url(), options=options) as conn:
        with pytest.raises(ServerTimeoutError) as info:
            await conn.post_json("a", {})
    # HTTPOptions.read_timeout: "longest silence allowed between two chunks".
    assert info.value.kind == "read", info.value


async def test_request_deadline_while_streaming() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(CHUNKED_HEAD)
        while True:  # a trickle that never trips the read timeout
            await peer.send(chunk(b"."))
            with anyio.move_on_after(0.02):
                await peer.wait_client_close()
            if peer.client_closed.is_set():
                return

    options = HTTPOptions(read_timeout=5, request_timeout=0.3, retry=RETRY_ONCE)
    async with serving(handler) as server, connection(server.url(), options=options) as conn:
        with pytest.raises(ServerTimeoutError, match="request deadline") as info:
            async with conn.open_lines("stream", {}) as reader:
                while True:
                    await reader.readline()
        assert info.value.kind == "request"
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()


# ------------------------------------------------------------------ cancellation


async def test_cancelling_a_blocked_readline_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(CHUNKED_HEAD + chunk(b"first\n"))
        await peer.wait_client_close()

    limiter = NamedLimiter("model_requests", 4)
    async with serving(handler) as server, connection(server.url(), limiter=limiter) as conn:
        blocked = anyio.Event()
        scope = anyio.CancelScope()
        lines: list[str | None] = []

        async def consume() -> None:
            with scope:
                async with conn.open_lines("stream", {}) as reader:
                    lines.append(await reader.readline())
                    blocked.set()
                    lines.append(await reader.readline())

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await blocked.wait()
            await anyio.wait_all_tasks_blocked()
            assert limiter.statistics().in_use == 1
            scope.cancel()
        assert scope.cancelled_caught
        assert lines == ["first"]
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()
        assert limiter.statistics().in_use == 0
        assert pool_of(conn).idle_connections == 0


async def test_cancelling_a_request_waiting_for_its_head_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.wait_client_close()

    async with serving(handler) as server, connection(server.url()) as conn:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(conn.post_json, "a", {})
                await server.connected.wait()
                await server.peers[0].got_request.wait()
                scope.cancel()
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()
        assert conn.limiter.statistics().in_use == 0
        assert pool_of(conn).idle_connections == 0


# ------------------------------------------------------------------ open_lines and the pool


async def test_open_lines_read_to_the_end_returns_the_connection() -> None:
    def respond(n: int, request: Request) -> bytes:
        if n == 0:
            return CHUNKED_HEAD + chunk(b"a\nb\n") + chunk(b"c") + LAST_CHUNK
        return json_response({"n": n})

    async with serving(keep_alive(respond)) as server, connection(server.url()) as conn:
        async with conn.open_lines("stream", {}) as reader:
            lines = [await reader.readline() for _ in range(4)]
        assert lines == ["a", "b", "c", None]
        assert pool_of(conn).idle_connections == 1
        assert await conn.post_json("x", {}) == {"n": 1}
        assert server.accepts == 1
        assert pool_of(conn).connections_opened == 1


async def test_a_sse_line_over_the_cap_is_a_clear_error_and_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(CHUNKED_HEAD + chunk(b"data: " + b"z" * 8192))  # no newline, ever
        await peer.wait_client_close()

    options = HTTPOptions(retry=RETRY_ONCE, max_line_bytes=4096)
    async with serving(handler) as server:
        client = ChatClient(server.url(), stream=True, options=options, rng=random.Random(0))
        async with client:
            with (
                anyio.fail_after(SOON),
                pytest.raises(
                    ServerProtocolError,
                    match=r"longer than HTTPOptions\.max_line_bytes=4096 bytes.*Raise "
                    r"HTTPOptions\.max_line_bytes",
                ) as info,
            ):
                await client.chat_completion(messages=[])
            assert info.value.status == 200
            assert client.connection.limiter.statistics().in_use == 0
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()  # the client hung up


async def test_a_chat_stream_is_read_past_done_so_its_connection_is_reused() -> None:
    events = (
        b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
        b'data: {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )

    def respond(n: int, request: Request) -> bytes:
        return CHUNKED_HEAD + chunk(events) + LAST_CHUNK

    async with (
        serving(keep_alive(respond)) as server,
        ChatClient(server.url(), stream=True, options=HTTPOptions()) as client,
    ):
        for _ in range(3):
            completion = await client.chat_completion(messages=[])
            assert completion.choices[0].message.content == "hi"
        assert server.accepts == 1


async def test_leaving_open_lines_early_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        while await peer.read_request() is not None:
            if peer.index == 0:
                await peer.send(CHUNKED_HEAD + chunk(b"a\nb\n"))  # the body never ends
            else:
                await peer.send(json_response({"peer": peer.index}))

    async with serving(handler) as server, connection(server.url()) as conn:
        async with conn.open_lines("stream", {}) as reader:
            assert await reader.readline() == "a"
        assert pool_of(conn).idle_connections == 0
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()
        assert await conn.post_json("x", {}) == {"peer": 1}
        assert server.accepts == 2


async def test_idle_connection_past_keepalive_expiry_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_http, "KEEPALIVE_EXPIRY_SECONDS", 0.05)
    handler = keep_alive(lambda n, r: json_response({"n": n}))
    async with serving(handler) as server, connection(server.url()) as conn:
        assert await conn.post_json("a", {}) == {"n": 0}
        await anyio.sleep(0.15)  # past the expiry (a duration, not an ordering)
        assert await conn.post_json("a", {}) == {"n": 1}
        assert server.accepts == 2
        assert pool_of(conn).connections_opened == 2
        with anyio.fail_after(SOON):
            await server.peers[0].client_closed.wait()


async def test_wire_pool_directly_expiry_and_reuse() -> None:
    async with serving(keep_alive(lambda n, r: http_response(f"n={n}".encode()))) as server:
        pool = WirePool(
            server.url(""),
            **HEAD_BOUNDS,
            connect_timeout=1,
            read_timeout=SOON,
            keepalive_expiry=0.05,
            max_idle=4,
            headers={"User-Agent": "custom", "Content-Type": "text/plain"},
        )
        assert pool.target("/a/b") == b"/a/b"
        try:
            for expected, opened in [(b"n=0", 1), (b"n=1", 1)]:
                response = await pool.send("POST", "a", b"xyz")
                assert response.status_code == 200
                assert response.reason_phrase == "OK"
                assert response.headers["content-length"] == "3"
                assert await response.aread() == expected
                await response.aclose()
                await response.aclose()  # idempotent
                assert pool.connections_opened == opened
            await anyio.sleep(0.15)  # past the expiry
            response = await pool.send("POST", "a", b"")
            await response.aread()
            await response.aclose()
            assert pool.connections_opened == 2
        finally:
            await pool.aclose()
        assert server.requests[0].headers["user-agent"] == "custom"
        assert server.requests[0].headers["content-type"] == "text/plain"
        assert server.requests[0].body == b"xyz"


async def test_receive_some_after_the_end_keeps_returning_none() -> None:
    tail: list[bytes | None] = []
    async with serving(keep_alive(lambda n, r: http_response(b"body"))) as server:
        pool = WirePool(
            server.url(),
            connect_timeout=1,
            read_timeout=SOON,
            keepalive_expiry=60,
            max_idle=4,
            **HEAD_BOUNDS,
        )
        try:
            response = await pool.send("POST", "a", b"")
            assert await response.aread() == b"body"
            with anyio.move_on_after(0.3):
                tail.append(await response.receive_some())
            await response.aclose()
        finally:
            await pool.aclose()
    assert tail == [None], "receive_some() blocked after the end of the body"


async def test_reading_a_closed_wire_response_is_an_error() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(CHUNKED_HEAD + chunk(b"abc"))
        await peer.wait_client_close()

    async with serving(handler) as server:
        pool = WirePool(
            server.url(),
            connect_timeout=1,
            read_timeout=SOON,
            keepalive_expiry=60,
            max_idle=4,
            **HEAD_BOUNDS,
        )
        try:
            response = await pool.send("POST", "a", b"")
            assert await response.receive_some() == b"abc"
            await response.aclose()
            with pytest.raises(BodyCut, match="the response was closed"):
                await response.receive_some()
            assert pool.idle_connections == 0
            with anyio.fail_after(SOON):
                await server.peers[0].client_closed.wait()
        finally:
            await pool.aclose()


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://x", "must start with http:// or https://"),
        ("http://", "has no host"),
        ("http://h:99999", "has an invalid port"),
        ("http://h:port", "has an invalid port"),
        ("http://h/x?q=1", "must not have a query or fragment"),
        ("http://h/x#frag", "must not have a query or fragment"),
    ],
)
def test_bad_base_urls_are_rejected_naming_the_url(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why) + r".*" + re.escape(repr(url))):
        WirePool(
            url, **HEAD_BOUNDS, connect_timeout=1, read_timeout=1, keepalive_expiry=1, max_idle=1
        )
    # ServerConnection names the URL as it was given.
    with pytest.raises(ValueError, match=re.escape(why) + r".*" + re.escape(repr(url))):
        ServerConnection(url)


@pytest.mark.parametrize(
    ("api_key", "headers", "named"),
    [
        ("sk-secret\n", {}, "Authorization"),
        (None, {"X-Token": "sk-secret\r\nX-Evil: 1"}, "X-Token"),
        (None, {"X-Token": "sk-secret-é✓"}, "X-Token"),
        (None, {"Bad Name": "v"}, "Bad Name"),
    ],
)
def test_unsendable_headers_are_rejected_without_showing_the_value(
    api_key: str | None, headers: dict[str, str], named: str
) -> None:
    options = HTTPOptions(headers=headers)
    with pytest.raises(ValueError, match=f"HTTP header {named!r} has an invalid") as info:
        ServerConnection("http://127.0.0.1:1", options=options, api_key=api_key)
    assert "sk-secret" not in str(info.value)


@pytest.mark.parametrize("name", ["Content-Length", "transfer-encoding"])
def test_body_framing_headers_are_the_clients_own(name: str) -> None:
    options = HTTPOptions(headers={name: "5"})
    with pytest.raises(ValueError, match=f"HTTP header {name!r} frames the request body"):
        ServerConnection("http://127.0.0.1:1", options=options)


def test_ipv6_and_default_port_host_headers() -> None:
    pool = WirePool(
        "http://[::1]:8000/v1/",
        connect_timeout=1,
        read_timeout=1,
        keepalive_expiry=1,
        max_idle=1,
        **HEAD_BOUNDS,
    )
    assert ("host", "[::1]:8000") in [(k.decode(), v.decode()) for k, v in pool._headers]
    assert pool.target("chat/completions") == b"/v1/chat/completions"
    pool = WirePool(
        "https://example.test",
        connect_timeout=1,
        read_timeout=1,
        keepalive_expiry=1,
        max_idle=1,
        **HEAD_BOUNDS,
    )
    assert ("host", "example.test") in [(k.decode(), v.decode()) for k, v in pool._headers]


@pytest.mark.parametrize("var", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_an_applicable_proxy_falls_back_to_httpx(monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    assert ServerConnection("http://example.test").transport_kind == "wire"
    monkeypatch.setenv(var, "http://127.0.0.1:9")
    assert ServerConnection("http://example.test").transport_kind == "httpx"
    for no_proxy in ("NO_PROXY", "no_proxy"):
        with monkeypatch.context() as m:
            m.setenv(no_proxy, "example.test")
            assert ServerConnection("http://example.test").transport_kind == "wire"


def test_proxy_for_another_scheme_does_not_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert ServerConnection("http://example.test").transport_kind == "wire"
    assert ServerConnection("https://example.test").transport_kind == "httpx"


def test_an_injected_transport_uses_httpx() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    assert ServerConnection("http://example.test", transport=transport).transport_kind == "httpx"


# ------------------------------------------------------------------ invalid HTTP


@pytest.mark.parametrize(
    ("reply", "close"),
    [
        (b"garbage\r\n\r\n", False),
        (b"garbage\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nContent-Le", True),  # head cut by a close
        (b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n", False),
    ],
    ids=["garbage-open", "garbage-closed", "cut-head", "bad-status"],
)
async def test_invalid_http_is_a_clear_error_not_a_hang(reply: bytes, close: bool) -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(reply)
        if not close:
            await peer.wait_client_close()

    async with serving(handler) as server, connection(server.url()) as conn:
        with anyio.fail_after(SOON), pytest.raises(ModelServerError) as info:
            await conn.post_json("a", {})
        assert isinstance(info.value, ServerConnectError)
        assert re.search(r"invalid HTTP|closed|ended", str(info.value)), str(info.value)
        assert info.value.attempt == 1  # something arrived: not retried
        assert server.accepts == 1
        if not close:  # the client closed its end (the server never reads again otherwise)
            with anyio.fail_after(SOON):
                await server.peers[0].client_closed.wait()
        assert conn.limiter.statistics().in_use == 0


# ------------------------------------------------------------------ the parser, sans I/O


@st.composite
def _framed_responses(draw: st.DrawFn) -> tuple[bytes, bytes, str]:
    """(response bytes, body, framing) with the body framed one of the three ways."""
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body, body, framing
    if framing == "close":
        return head + b"Connection: close\r\n\r\n" + body, body, framing
    pieces, rest = [], body
    while rest:
        size = draw(st.integers(min_value=1, max_value=len(rest)))
        pieces.append(b"%x\r\n%s\r\n" % (size, rest[:size]))
        rest = rest[size:]
    return (
        head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(pieces) + b"0\r\n\r\n",
        body,
        framing,
    )


@given(_framed_responses(), st.lists(st.integers(min_value=0, max_value=2000), max_size=8))
def test_the_parser_reads_any_body_however_the_bytes_are_cut(
    response: tuple[bytes, bytes, str], cuts: list[int]
) -> None:
    data, body, framing = response
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    exchange = _Exchange(no_body=False)
    received = []
    for start, end in itertools.pairwise(bounds):
        exchange.feed(data[start:end])
        received.extend(exchange.body)
        exchange.body = []
    assert exchange.head and exchange.status == 200
    if framing == "close":  # ends when the server closes: not complete until then
        assert not exchange.complete and exchange.ends_at_close()
    else:
        assert exchange.complete and exchange.reusable() and not exchange.ends_at_close()
    assert b"".join(received) == body


@given(st.binary(max_size=200), st.binary(max_size=200))
def test_whatever_a_server_sends_is_parsed_or_a_body_cut(first: bytes, second: bytes) -> None:
    exchange = _Exchange(no_body=False)
    for data in (b"HTTP/1.1 200 OK\r\n" + first, second):
        try:
            exchange.feed(data)
        except BodyCut:
            return
