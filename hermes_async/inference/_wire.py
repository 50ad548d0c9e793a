"""A lean HTTP/1.1 client for the model-server hot path: httptools over anyio byte streams.

One :class:`WirePool` per server keeps a LIFO stack of idle keep-alive connections. Failures
are the typed outcomes of :mod:`~hermes_async.inference._transport`; only
:class:`ConnectFailed` and :class:`ClosedBeforeResponse` are safe to retry. No proxies,
compression, redirects or cookies. Why not httpx or h11: docs/decisions/038-model-server-client.md.
"""

from __future__ import annotations

import collections
import contextlib
import math
import re
import select
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio
import anyio.abc
import httptools

from hermes_async._cleanup import cleanup_scope
from hermes_async._net import CLOSE_GRACE_SECONDS, base_url_problem, redact_url
from hermes_async.inference._transport import (
    BodyCut,
    ClosedBeforeResponse,
    ConnectFailed,
    ResponseTooLarge,
    TransportTimeout,
)

__all__ = (
    "WirePool",
    "WireResponse",
    "check_base_url",
    "check_headers",
)

#: What a broken or closed connection raises, on either backend and with or without TLS.
_STREAM_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError)

#: Bytes asked for per socket read; a streamed response usually arrives in far less.
_READ_SIZE = 65536

#: Request targets kept encoded per pool (a model server is called on a handful of paths).
_TARGETS_KEPT = 64


@dataclass(frozen=True, slots=True)
class _Origin:
    scheme: str
    host: str
    port: int
    prefix: str
    host_header: bytes


def _parse_origin(base_url: str) -> _Origin:
    problem = base_url_problem(base_url)
    if problem is not None:
        raise ValueError(f"model-server base_url {problem}: {redact_url(base_url)!r}")
    parts = urllib.parse.urlsplit(base_url)
    scheme = parts.scheme.lower()
    default_port = 443 if scheme == "https" else 80
    port = parts.port or default_port
    host = parts.hostname
    assert host is not None  # base_url_problem checked it
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == default_port else f"{shown}:{port}"
    return _Origin(scheme, host, port, parts.path.rstrip("/"), host_header.encode("ascii"))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


#: RFC 9110 ``token`` (a header name) and ``field-value`` (visible characters, spaces and tabs
#: inside, none at either end; obs-text allowed as Latin-1).
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(
    rb"(?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?"
)

#: Headers that frame the body: the pool writes Content-Length itself, and a second one (or a
#: Transfer-Encoding beside it) would make the server read the body differently.
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


def _header(name: str, value: str) -> tuple[bytes, bytes]:
    """Encode and validate one header; the error names the header, never its value."""
    try:
        pair = (name.encode("latin-1"), value.encode("latin-1"))
    except UnicodeEncodeError:
        pair = None
    if pair is None or not _TOKEN.fullmatch(pair[0]) or not _FIELD_VALUE.fullmatch(pair[1]):
        raise ValueError(
            f"HTTP header {name!r} has an invalid name or value (non-Latin-1 or control "
            "characters such as a newline); the value is not shown"
        ) from None
    if pair[0].lower() in _FRAMING:
        raise ValueError(
            f"HTTP header {name!r} frames the request body, which the client does itself "
            "(one Content-Length per request); remove it from the headers"
        )
    return pair


def check_base_url(base_url: str) -> None:
    """Raise ``ValueError`` unless the pool can talk to ``base_url``."""
    _parse_origin(base_url)


def check_headers(headers: Mapping[str, str]) -> None:
    """Raise ``ValueError`` naming the first header that cannot be sent (never its value)."""
    for name, value in headers.items():
        _header(name, value)


class _Exchange:
    """One response as httptools parses it.

    A new parser per request: bytes after the end of a response mark the connection unusable
    instead of starting a "next response" nobody asked for.
    """

    __slots__ = (
        "after_end",
        "body",
        "complete",
        "head",
        "header_lines",
        "headers",
        "keep_alive",
        "no_body",
        "parser",
        "reason",
        "status",
    )

    def __init__(self, *, no_body: bool) -> None:
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.no_body = no_body  # a HEAD request: its response ends with its head
        self.head = False
        self.complete = False
        self.after_end = False
        self.keep_alive = False
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_lines = 0  # every header line, 1xx heads' included
        self.body: list[bytes] = []

    # httptools calls these (by name) from ``feed_data``.
    def on_message_begin(self) -> None:
        if self.complete:
            self.after_end = True
        elif not self.head:  # a 1xx head came first: what follows replaces it
            self.reason = b""
            self.headers = []

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_lines += 1
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None  # called by the parser itself
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            return  # informational: the final head follows
        self.status = status
        self.head = True
        if self.no_body:
            self.complete = True

    def on_body(self, data: bytes) -> None:
        if not self.complete:
            self.body.append(data)

    def on_message_complete(self) -> None:
        if self.head and not self.complete:
            assert self.parser is not None  # called by the parser itself
            self.complete = True
            # Read here: the parser forgets it once the message is over.
            self.keep_alive = self.parser.should_keep_alive()

    def feed(self, data: bytes) -> None:
        """Parse ``data``; :class:`BodyCut` if it is not an HTTP/1.1 response."""
        if self.parser is None:
            raise BodyCut("the response was closed")
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.complete:
                self.after_end = True
                return
            where = "response head" if not self.head else "response"
            raise BodyCut(f"invalid HTTP {where} from the server: {exc}") from None

    def release(self) -> None:
        """Drop the parser, breaking its reference cycle with this object (no GC needed)."""
        self.parser = None

    def ends_at_close(self) -> bool:
        """The body has no length and is not chunked: it ends when the server closes."""
        if self.no_body or self.status in (204, 304):
            return False
        names = {name.lower(): value for name, value in self.headers}
        encoding = names.get(b"transfer-encoding", b"").lower()
        return b"content-length" not in names and not encoding.rstrip().endswith(b"chunked")

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.after_end and not self.no_body


class _Connection:
    __slots__ = ("idle_since", "sock", "stream")

    def __init__(self, stream: anyio.abc.ByteStream, sock: socket.socket | None) -> None:
        self.stream = stream
        self.sock = sock
        self.idle_since = 0.0

    def looks_closed(self) -> bool:
        """True if the idle connection is readable: the server closed it (or sent junk)."""
        if self.sock is None:
            return False
        try:
            # poll, not select: select() fails for descriptors above 1023.
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    async def aclose(self) -> None:
        # Bounded though it never waits long (no TLS close_notify): callers add no bound.
        with (
            cleanup_scope("close a model-server connection", CLOSE_GRACE_SECONDS),
            contextlib.suppress(*_STREAM_ERRORS),
        ):
            await self.stream.aclose()


class WireResponse:
    """A response whose head has arrived; read the body with :meth:`receive_some`.

    Always :meth:`aclose` it: a fully read body hands the connection back to the pool, anything
    else closes the connection. A repeated header keeps its last value in ``headers``.
    """

    __slots__ = ("_conn", "_done", "_exchange", "_pool", "headers", "reason_phrase", "status_code")

    def __init__(self, pool: WirePool, conn: _Connection, exchange: _Exchange) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._exchange = exchange
        self._done = False
        self.status_code = exchange.status
        self.reason_phrase = exchange.reason.decode("latin-1")
        self.headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in exchange.headers
        }

    @property
    def body_received(self) -> bool:
        """The whole body is here: :meth:`receive_some` returns the rest without waiting."""
        return self._done or self._exchange.complete

    async def receive_some(self, timeout: float = math.inf) -> bytes | None:
        """Return the next piece of the body, or ``None`` once it is complete.

        Body bytes already parsed come back at once, without a cancel scope.

        Raises:
            TimeoutError: Nothing arrived within ``timeout`` seconds.
            BodyCut: The connection broke before the body ended, or the bytes are not HTTP/1.1.
        **Cancellation**: safe; the response must still be closed (which drops the connection).
        """
        if self._done:
            return None
        conn = self._conn
        if conn is None:
            raise BodyCut("the response was closed")
        exchange = self._exchange
        while True:
            body = exchange.body
            if body:
                exchange.body = []
                return body[0] if len(body) == 1 else b"".join(body)
            if exchange.complete:
                self._done = True
                return None
            # A bare scope and a check, not ``fail_after`` (two generator context managers
            # and four backend lookups per read, on the path of every streamed chunk).
            with anyio.move_on_after(timeout) as scope:
                data = await _receive(conn, started=True)
            if scope.cancelled_caught:
                raise TimeoutError
            if data:
                exchange.feed(data)
            elif exchange.ends_at_close():
                exchange.complete = True  # keep_alive stays False: the connection is closed
            else:
                raise BodyCut("the connection ended mid-body")

    async def aread(self) -> bytes:
        """Read the rest of the body.

        **Cancellation**: as for :meth:`receive_some`.
        """
        parts = []
        while (part := await self.receive_some()) is not None:
            parts.append(part)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Release the connection: back to the pool if the exchange finished cleanly, else closed.

        **Cancellation**: every connection close is shielded and bounded.
        """
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._exchange.release()
        if self._done and self._exchange.reusable():
            await self._pool._release(conn)
        else:
            await conn.aclose()


async def _receive(conn: _Connection, *, started: bool, reused: bool = False) -> bytes:
    try:
        return await conn.stream.receive(_READ_SIZE)
    except anyio.EndOfStream:
        return b""
    except _STREAM_ERRORS as exc:
        what = _describe(exc)
        if started:
            raise BodyCut(f"the connection broke mid-response ({what})") from None
        raise ClosedBeforeResponse(
            f"the connection broke before a response ({what})", reused=reused
        ) from None


class WirePool:
    """Keep-alive connections to one server, and the requests made over them.

    Implements :class:`~hermes_async.inference._transport.Transport`.

    Args:
        base_url: ``http://host:port[/prefix]`` or ``https://...``.
        read_timeout: Seconds allowed between sending a request and the response head.
        keepalive_expiry: Idle connections older than this are not reused.
        ssl_context: Factory of the TLS context for ``https`` (called once, on first connect).
    """

    kind = "wire"

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        keepalive_expiry: float,
        max_idle: int,
        max_head_bytes: int,
        max_header_lines: int,
        headers: Mapping[str, str] | None = None,
        ssl_context: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self._origin = _parse_origin(base_url)
        self._max_head_bytes = max_head_bytes
        self._max_header_lines = max_header_lines
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._keepalive_expiry = keepalive_expiry
        self._max_idle = max(1, max_idle)
        self._ssl_factory = ssl_context or ssl.create_default_context
        self._ssl: ssl.SSLContext | None = None
        fixed: dict[str, str] = {
            "host": self._origin.host_header.decode("ascii"),
            "user-agent": "hermes-async",
            "accept": "*/*",
        }
        fixed.update({k.lower(): v for k, v in (headers or {}).items()})
        self._headers = [_header(k, v) for k, v in fixed.items()]
        self._header_block = b"".join(b"%s: %s\r\n" % pair for pair in self._headers)
        self._targets: dict[str, bytes] = {}
        self._idle: collections.deque[_Connection] = collections.deque()
        self._closed = False
        #: Connections opened so far (for tests and statistics).
        self.connections_opened = 0

    def target(self, path: str) -> bytes:
        target = self._targets.get(path)
        if target is None:
            quoted = urllib.parse.quote(path.lstrip("/"), safe="/:@!$&'()*+,;=-._~%?")
            target = f"{self._origin.prefix}/{quoted}".encode("ascii")
            if len(self._targets) < _TARGETS_KEPT:  # a client uses a handful of paths
                self._targets[path] = target
        return target

    async def send(self, method: str, path: str, body: bytes = b"") -> WireResponse:
        """Send ``method path`` with ``body`` and the pool's headers; wait for the head.

        Raises:
            ConnectFailed: No connection could be made.
            ClosedBeforeResponse: The connection closed before a response byte (retry-safe).
            BodyCut: The response head was invalid or cut.
            ResponseTooLarge: The head went past ``max_head_bytes`` or ``max_header_lines``.
            TransportTimeout: Connecting or waiting for the head took too long.
        **Cancellation**: the connection in use is closed (never returned to the pool).
        """
        if self._closed:
            raise RuntimeError("the connection pool is closed")
        head = b"%s %s HTTP/1.1\r\n%s" % (
            method.encode("ascii"),
            self.target(path),
            self._header_block,
        )
        if body or method not in ("GET", "HEAD"):
            head += b"content-length: %d\r\n" % len(body)
        data = head + b"\r\n" + body
        conn = await self._checkout()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        exchange = _Exchange(no_body=method == "HEAD")
        ok = False
        try:
            try:
                await conn.stream.send(data)
            except _STREAM_ERRORS as exc:
                error = _describe(exc)
                if reused:
                    raise ClosedBeforeResponse(
                        f"the kept-alive connection broke ({error})", reused=True
                    ) from None
                raise ConnectFailed(f"cannot send the request ({error})") from None
            await self._receive_head(conn, exchange, reused=reused)
            ok = True
            return WireResponse(self, conn, exchange)
        finally:
            if not ok:
                exchange.release()
                await conn.aclose()

    async def _receive_head(self, conn: _Connection, exchange: _Exchange, *, reused: bool) -> None:
        received = 0
        with anyio.move_on_after(self._read_timeout):  # not fail_after: see receive_some
            while not exchange.head:
                data = await _receive(conn, started=received > 0, reused=reused)
                if not data:
                    if not received:
                        raise ClosedBeforeResponse(
                            "the connection closed before a response", reused=reused
                        )
                    raise BodyCut("the connection ended before the response head")
                received += len(data)
                exchange.feed(data)
                # Checked per read (at most _READ_SIZE bytes past the bound), not per byte.
                if exchange.header_lines > self._max_header_lines or (
                    not exchange.head and received > self._max_head_bytes
                ):
                    raise self._head_too_large(received, exchange.header_lines)
            return
        # Only the scope's deadline gets here: every way out of the loop returns or raises.
        raise TransportTimeout(
            f"no response head within {self._read_timeout:g} s",
            kind="read",
            seconds=self._read_timeout,
        )

    def _head_too_large(self, received: int, lines: int) -> ResponseTooLarge:
        what = (
            f"{lines} header lines, more than HTTPOptions.max_header_lines={self._max_header_lines}"
            if lines > self._max_header_lines
            else f"{received} bytes without its end, more than HTTPOptions.max_head_bytes="
            f"{self._max_head_bytes}"
        )
        return ResponseTooLarge(
            f"the response head has {what}; a model server sends a few hundred bytes "
            "(check that base_url points at one, or raise the option)"
        )

    async def _checkout(self) -> _Connection | None:
        idle = self._idle
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < self._keepalive_expiry and not conn.looks_closed():
                return conn
            await conn.aclose()
        return None

    async def _release(self, conn: _Connection) -> None:
        if self._closed:
            await conn.aclose()
            return
        now = time.monotonic()
        conn.idle_since = now
        idle = self._idle
        idle.append(conn)
        # Oldest first: drop the expired and the surplus from the bottom of the stack.
        while idle and (
            len(idle) > self._max_idle or now - idle[0].idle_since >= self._keepalive_expiry
        ):
            await idle.popleft().aclose()

    async def _connect(self) -> _Connection:
        origin = self._origin
        try:
            with anyio.fail_after(self._connect_timeout):
                if origin.scheme == "https":
                    if self._ssl is None:
                        self._ssl = self._ssl_factory()
                    stream: anyio.abc.ByteStream = await anyio.connect_tcp(
                        origin.host,
                        origin.port,
                        ssl_context=self._ssl,
                        tls_standard_compatible=False,
                    )
                else:
                    stream = await anyio.connect_tcp(origin.host, origin.port)
        except TimeoutError:
            raise TransportTimeout(
                f"no connection within {self._connect_timeout:g} s",
                kind="connect",
                seconds=self._connect_timeout,
            ) from None
        except _STREAM_ERRORS as exc:
            raise ConnectFailed(_describe(exc)) from None
        self.connections_opened += 1
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        return _Connection(stream, sock)

    async def aclose(self) -> None:
        """Close every idle connection; connections in use close when their response does.

        **Cancellation**: each close is shielded and bounded.
        """
        self._closed = True
        idle, self._idle = self._idle, collections.deque()
        for conn in idle:
            await conn.aclose()

    @property
    def idle_connections(self) -> int:
        """Connections waiting for reuse."""
        return len(self._idle)
