"""The httpx implementation of the transport seam: proxies, injected transports, the drain.

Used instead of the lean client (:mod:`~hermes_async.inference._wire`) only with an injected
``httpx`` transport or an environment proxy for the server's host. httpx's exceptions are
translated here, once, into the typed outcomes of :mod:`~hermes_async.inference._transport`.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator, Mapping

import anyio
import httpx

from hermes_async._cleanup import cleanup_scope
from hermes_async._net import CLOSE_GRACE_SECONDS, aclose_httpx_stream
from hermes_async.inference._transport import (
    BodyCut,
    ClosedBeforeResponse,
    ConnectFailed,
    TransportError,
    TransportTimeout,
)

__all__ = ("HttpxTransport", "translate")


def translate(
    exc: httpx.TransportError, *, connect_timeout: float, read_timeout: float, pool_timeout: float
) -> TransportError:
    """The typed outcome of an httpx failure before the response head."""
    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, httpx.ConnectError | httpx.WriteError):
        return ConnectFailed(what)
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return ClosedBeforeResponse(what)
    if isinstance(exc, httpx.ConnectTimeout):
        return TransportTimeout(what, kind="connect", seconds=connect_timeout)
    if isinstance(exc, httpx.PoolTimeout):
        return TransportTimeout(what, kind="pool", seconds=pool_timeout)
    if isinstance(exc, httpx.TimeoutException):
        return TransportTimeout(what, kind="read", seconds=read_timeout)
    return TransportError(what)


class _HttpxResponse:
    """An httpx streamed response; :meth:`aclose` drains the body iterator chain."""

    __slots__ = ("_chunks", "_eof", "_read_timeout", "_response", "_started")

    def __init__(self, response: httpx.Response, read_timeout: float) -> None:
        self._response = response
        self._read_timeout = read_timeout
        self._chunks: AsyncIterator[bytes] = response.aiter_bytes()
        self._started = False
        self._eof = False

    @property
    def status_code(self) -> int:
        return self._response.status_code

    @property
    def reason_phrase(self) -> str:
        return self._response.reason_phrase

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    @property
    def body_received(self) -> bool:
        return self._eof  # httpx does not say what it has buffered

    async def receive_some(self, timeout: float = math.inf) -> bytes | None:
        """The next piece of the body, or ``None`` at its end.

        Raises:
            TimeoutError: Nothing arrived within ``timeout``.
            TransportTimeout: httpx's own read timeout passed.
            BodyCut: The body was cut or could not be decoded.

        **Cancellation**: safe; the response must still be closed.
        """
        if self._eof:
            return None
        self._started = True
        try:
            with anyio.fail_after(timeout):
                return await self._chunks.__anext__()
        except StopAsyncIteration:
            self._eof = True
            return None
        except httpx.TimeoutException as exc:
            raise TransportTimeout(
                f"{type(exc).__name__}: {exc}", kind="read", seconds=self._read_timeout
            ) from exc
        except (httpx.TransportError, httpx.DecodingError, httpx.StreamError) as exc:
            raise BodyCut(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        """Close the response and finish its body iterator; idempotent.

        **Cancellation**: shielded, bounded by :data:`hermes_async._net.CLOSE_GRACE_SECONDS`.
        """
        chunks = self._chunks if self._started and not self._eof else None
        self._eof = True
        self._started = False
        await aclose_httpx_stream(
            self._response,
            chunks,
            what="close a model-server response (httpx)",
            reason=None if chunks is None else "body not read to its end",
        )


class HttpxTransport:
    """Requests to one server through an ``httpx.AsyncClient``.

    Args:
        base_url: The server's base URL, without credentials (they travel as a header).
        read_timeout: Longest silence before the head and between body bytes.
        keepalive_expiry: Idle connections older than this are not reused.
        transport: An httpx transport to use instead of the network.
    """

    kind = "httpx"

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        pool_timeout: float,
        max_connections: int,
        keepalive_expiry: float,
        headers: Mapping[str, str],
        ssl_context: ssl.SSLContext,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._timeouts = (connect_timeout, read_timeout, pool_timeout)
        self._read_timeout = read_timeout
        #: The pool limits given to httpx (for tests and diagnostics).
        self.limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=keepalive_expiry,
        )
        self._client = httpx.AsyncClient(
            base_url=base_url,
            headers=dict(headers),
            timeout=httpx.Timeout(
                connect=connect_timeout,
                read=read_timeout,
                write=read_timeout,
                pool=pool_timeout,
            ),
            limits=self.limits,
            transport=transport,
            verify=ssl_context,
        )

    async def send(self, method: str, path: str, body: bytes = b"") -> _HttpxResponse:
        """Send ``method path`` through httpx and wait for the response head.

        Raises:
            TransportError: httpx's error, translated.

        **Cancellation**: httpx closes the connection in use.
        """
        client = self._client
        request = client.build_request(method, path, content=body or None)
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError as exc:
            connect, read, pool = self._timeouts
            raise translate(
                exc, connect_timeout=connect, read_timeout=read, pool_timeout=pool
            ) from exc
        return _HttpxResponse(response, self._read_timeout)

    async def aclose(self) -> None:
        """Close the client and its pool.

        **Cancellation**: shielded, bounded by :data:`hermes_async._net.CLOSE_GRACE_SECONDS`.
        """
        with cleanup_scope("close a model-server client (httpx)", CLOSE_GRACE_SECONDS):
            await self._client.aclose()
