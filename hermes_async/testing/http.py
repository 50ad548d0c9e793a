"""Serve an ASGI app to httpx clients in tests: over real loopback HTTP, or in-process.

:func:`open_asgi_transport` streams, unlike ``httpx.ASGITransport`` (0.28), which buffers
the whole body: a stalled stream would block the request and no read timeout apply.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from hermes_async._asgi import ASGIApp, bind_socket, serve_asgi
from hermes_async._cleanup import cleanup_scope

__all__ = (
    "SERVER_SHUTDOWN_GRACE_SECONDS",
    "ASGIApp",
    "answer_lifespan",
    "open_app_endpoint",
    "open_asgi_transport",
    "open_loopback_server",
)

#: How long shutdown waits for in-flight requests before cancelling them. Short: test servers
#: have nothing worth waiting for, and every test pays this when a stream is left open.
SERVER_SHUTDOWN_GRACE_SECONDS = 1.0


@asynccontextmanager
async def open_loopback_server(
    app: ASGIApp, *, host: str = "127.0.0.1", startup_timeout: float = 10.0
) -> AsyncIterator[str]:
    """Serve ``app`` over HTTP/1.1 on an ephemeral port; yield ``"http://host:port"``.

    The socket is bound first, so the URL is valid once yielded. Needs the ``testing`` extra.
    ``lifespan`` is answered here (hypercorn's trio worker fails on apps that ignore it), so
    do start-up work before entering the block.

    **Cancellation**: leaving the block starts a shielded graceful shutdown bounded by
    :data:`SERVER_SHUTDOWN_GRACE_SECONDS`; the socket is always closed.
    """
    sock = bind_socket(host, 0)
    port = sock.getsockname()[1]
    shutdown = anyio.Event()
    server_done = anyio.Event()

    async def run_server() -> None:
        try:
            await serve_asgi(
                _without_lifespan(app),
                sock,
                shutdown=shutdown.wait,
                grace_seconds=SERVER_SHUTDOWN_GRACE_SECONDS,
                startup_timeout=startup_timeout,
                log=logging.getLogger("hermes_async.testing.http"),
            )
        finally:
            server_done.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_server)
            try:
                yield f"http://{host}:{port}"
            finally:
                shutdown.set()
                # hypercorn waits up to graceful_timeout for in-flight requests; allow for that,
                # then cancel whatever is left.
                with cleanup_scope(
                    f"graceful shutdown of the loopback server on port {port}",
                    SERVER_SHUTDOWN_GRACE_SECONDS * 3,
                    reason="the server's block exited",
                ):
                    await server_done.wait()
                tg.cancel_scope.cancel(reason="loopback server closed")
    finally:
        sock.close()


def _without_lifespan(app: ASGIApp) -> ASGIApp:
    async def wrapper(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        await answer_lifespan(receive, send)

    return wrapper


async def answer_lifespan(
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
) -> None:
    """Answer an ASGI ``lifespan`` scope: startup and shutdown complete at once.

    **Cancellation**: safe; nothing is held.
    """
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# --------------------------------------------------------------------------------------------
# In-process streaming transport


@asynccontextmanager
async def open_asgi_transport(app: ASGIApp) -> AsyncIterator[httpx.AsyncBaseTransport]:
    """Yield an httpx transport that runs ``app`` in-process with real streaming semantics.

    Chunks reach the client as sent, so read timeouts apply; closing the response early
    gives the app ``http.disconnect``. An app that fails before responding is
    ``httpx.RemoteProtocolError``.

    **Cancellation**: leaving the block cancels every request still running in the app.
    """
    async with anyio.create_task_group() as tg:
        try:
            yield _StreamingASGITransport(app, tg)
        finally:
            tg.cancel_scope.cancel(reason="ASGI transport closed")


class _StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: ASGIApp, tg: anyio.abc.TaskGroup) -> None:
        self._app = app
        self._tg = tg

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 0),
            "server": (request.url.host, request.url.port or 80),
        }
        read_timeout = _read_timeout(request)
        exchange = _Exchange(body)
        started = anyio.Event()
        self._tg.start_soon(exchange.run_app, self._app, scope, started)
        # Wait for the response start (or the app's failure) under the client's read timeout,
        # as a socket read would; a cancelled or timed-out client disconnects.
        try:
            with anyio.fail_after(read_timeout):
                await started.wait()
        except TimeoutError:
            exchange.disconnect()
            raise httpx.ReadTimeout(
                f"no response within the read timeout of {read_timeout:g} s", request=request
            ) from None
        except BaseException:
            exchange.disconnect()
            raise
        if exchange.status is None:
            exchange.disconnect()
        if exchange.error is not None and exchange.status is None:
            raise httpx.RemoteProtocolError(
                f"ASGI app failed before responding: {exchange.error!r}", request=request
            ) from exchange.error
        if exchange.status is None:
            raise httpx.RemoteProtocolError(
                "ASGI app returned without sending a response", request=request
            )
        return httpx.Response(
            exchange.status,
            headers=exchange.headers,
            stream=_ExchangeStream(exchange, read_timeout),
        )


def _read_timeout(request: httpx.Request) -> float:
    timeouts = request.extensions.get("timeout") or {}
    value = timeouts.get("read")
    return math.inf if value is None else float(value)


class _Exchange:
    """One request/response between the transport and the app task."""

    def __init__(self, body: bytes) -> None:
        self.request_body = body
        self.request_sent = False
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.error: BaseException | None = None
        self.disconnected = anyio.Event()
        send, receive = anyio.create_memory_object_stream[bytes | None](math.inf)
        self.body_send: MemoryObjectSendStream[bytes | None] = send
        self.body_receive: MemoryObjectReceiveStream[bytes | None] = receive

    def disconnect(self) -> None:
        self.disconnected.set()
        self.body_receive.close()

    async def run_app(
        self, app: ASGIApp, scope: MutableMapping[str, Any], started: anyio.Event
    ) -> None:
        async def receive() -> MutableMapping[str, Any]:
            if not self.request_sent:
                self.request_sent = True
                return {"type": "http.request", "body": self.request_body, "more_body": False}
            await self.disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if self.disconnected.is_set():
                raise OSError("client disconnected")
            if message["type"] == "http.response.start":
                self.status = int(message["status"])
                self.headers = list(message.get("headers", []))
                started.set()
            elif message["type"] == "http.response.body":
                chunk = bytes(message.get("body", b""))
                try:
                    if chunk:
                        self.body_send.send_nowait(chunk)
                    if not message.get("more_body", False):
                        self.body_send.send_nowait(None)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    raise OSError("client disconnected") from None
                # Let the reader run, as a socket write would.
                await anyio.lowlevel.checkpoint()

        try:
            await app(scope, receive, send)
        except Exception as exc:
            # Like a server: a failure after the response started cuts the connection.
            self.error = exc
        finally:
            started.set()
            self.body_send.close()


class _ExchangeStream(httpx.AsyncByteStream):
    def __init__(self, exchange: _Exchange, read_timeout: float) -> None:
        self._exchange = exchange
        self._read_timeout = read_timeout
        self._complete = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        receive = self._exchange.body_receive
        while True:
            try:
                with anyio.fail_after(self._read_timeout):
                    chunk = await receive.receive()
            except TimeoutError:
                raise httpx.ReadTimeout(
                    f"no data within the read timeout of {self._read_timeout:g} s"
                ) from None
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                ) from self._exchange.error
            if chunk is None:
                self._complete = True
                return
            yield chunk

    async def aclose(self) -> None:
        if self._complete:
            self._exchange.body_receive.close()
        else:
            self._exchange.disconnect()


@asynccontextmanager
async def open_app_endpoint(
    app: ASGIApp, *, loopback: bool
) -> AsyncIterator[tuple[str, httpx.AsyncBaseTransport | None]]:
    """Serve ``app`` one way or the other; yield ``(base_url, transport)`` for a client.

    With ``loopback`` the app runs under :func:`open_loopback_server` and ``transport`` is
    ``None``; otherwise it is an :func:`open_asgi_transport` at ``"http://scripted.test"``.

    **Cancellation**: as for the two helpers.
    """
    if loopback:
        async with open_loopback_server(app) as base_url:
            yield base_url, None
    else:
        async with open_asgi_transport(app) as transport:
            yield "http://scripted.test", transport
