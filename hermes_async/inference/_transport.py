"""The transport seam under :class:`~hermes_async.inference._http.ServerConnection`.

A transport sends one request to one server and hands back the response as soon as its head
has arrived; it knows nothing of retries, limiters, JSON or the request deadline (the
connection above it owns those). Two implementations:

* :class:`~hermes_async.inference._wire.WirePool` — the lean HTTP/1.1 client (httptools), used
  over the network: 2.6x less client CPU than httpx per streamed request at 16 concurrent
  streams, 16x less at 256 (``bench/http_client.py``);
* :class:`~hermes_async.inference._httpx.HttpxTransport` — httpx, for what the lean client
  does not do: an HTTP proxy from the environment, an injected ``httpx`` transport (tests, an
  in-process ASGI app).

The connection picks one at construction and never branches per request.

Failures are typed by what a caller may do about them — these are the *outcomes* the retry
decision (:func:`~hermes_async.inference._retry.decide_retry`) reads:

=============================  ====================================================  ========
error                          meaning                                               retried
=============================  ====================================================  ========
:class:`ConnectFailed`         no connection (refused, unreachable, TLS failed)      yes
:class:`ClosedBeforeResponse`  closed or reset before any response byte              yes [1]_
:class:`TransportTimeout`      connect, or waiting for the head, took too long       no
:class:`BodyCut`               the response started but was cut / is not HTTP        no
:class:`ResponseTooLarge`      the response head broke its size bound                no
:class:`TransportError`        anything else (a proxy refused, a local error)        no
=============================  ====================================================  ========

.. [1] at once on a new connection, without using an attempt, when the connection was a
   reused keep-alive one (``reused``): that says nothing about the server.

Every transport raises only these (its own library's exceptions are translated once, at its
boundary), plus ``TimeoutError`` from :meth:`Response.receive_some` when its ``timeout``
passes (the caller knows which of its deadlines that was).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, Protocol

__all__ = (
    "BodyCut",
    "ClosedBeforeResponse",
    "ConnectFailed",
    "Response",
    "ResponseTooLarge",
    "Transport",
    "TransportError",
    "TransportTimeout",
)


class TransportError(Exception):
    """A transport failure talking to the server (base of the typed outcomes)."""


class ConnectFailed(TransportError):
    """No connection could be made (refused, unreachable, DNS, TLS), or sending failed on a
    fresh one. Nothing reached the server's application: a retry is safe."""


class ClosedBeforeResponse(TransportError):
    """The connection was closed or reset before any byte of the response arrived.

    Typically a keep-alive connection the server timed out just as it was reused. Nothing was
    received, so retrying the request is safe.

    Args:
        message: What happened.
        reused: The connection had served earlier requests (a stale keep-alive connection: an
            immediate retry on a new connection is the natural remedy).
    """

    def __init__(self, message: str, *, reused: bool = False) -> None:
        super().__init__(message)
        self.reused = reused


class BodyCut(TransportError):
    """The response started but was cut (connection closed or reset) or is not valid HTTP."""


class ResponseTooLarge(TransportError):
    """The response head is longer than its bound (bytes or header lines): a server that
    never ends its head. Never retried; the connection is dropped."""


class TransportTimeout(TransportError):
    """Connecting, or waiting for the response head or the next body bytes, took too long.

    Args:
        message: What happened.
        kind: ``"connect"``, ``"read"`` or ``"pool"`` (no free connection in httpx's pool).
        seconds: The limit that passed.
    """

    def __init__(
        self, message: str, *, kind: Literal["connect", "read", "pool"], seconds: float
    ) -> None:
        super().__init__(message)
        self.kind: Literal["connect", "read", "pool"] = kind
        self.seconds = seconds


class Response(Protocol):
    """A response whose head has arrived. Always :meth:`aclose` it.

    Attributes:
        status_code: The HTTP status.
        reason_phrase: The status line's reason text.
        headers: Header names to values; lookups by lower-case name work.
    """

    @property
    def status_code(self) -> int: ...

    @property
    def reason_phrase(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def receive_some(self, timeout: float = math.inf) -> bytes | None:
        """The next piece of the body, or ``None`` once it is complete.

        Raises:
            TimeoutError: Nothing arrived within ``timeout`` seconds.
            BodyCut: The body ended early or is not valid HTTP.
            TransportTimeout: The transport's own read timeout passed.

        **Cancellation**: safe; the response must still be closed.
        """
        ...

    async def aclose(self) -> None:
        """Release the connection (reused only if the body was read to its end); idempotent.

        **Cancellation**: shielded and bounded by the transport (the caller adds no bound).
        """
        ...


class Transport(Protocol):
    """Requests to one server (scheme, host, port and path prefix fixed at creation)."""

    #: ``"wire"`` or ``"httpx"``, for diagnostics and tests.
    kind: str

    async def send(self, method: str, path: str, body: bytes = b"") -> Response:
        """Send ``method path`` (relative to the base URL) and wait for the response head.

        The headers are the transport's own, fixed at construction (encoded once): every
        request to a model server carries the same ones.

        Args:
            method: ``"POST"``, ``"GET"``...
            path: The target, relative to the base URL's path.
            body: The request body (sent with a ``Content-Length``).

        Raises:
            TransportError: One of the typed outcomes above.

        **Cancellation**: the connection in use is closed, never returned to a pool.
        """
        ...

    async def aclose(self) -> None:
        """Close idle connections; responses still open close their own.

        **Cancellation**: shielded and bounded per connection.
        """
        ...
