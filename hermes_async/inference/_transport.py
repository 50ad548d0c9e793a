"""The transport seam under :class:`~hermes_async.inference._http.ServerConnection`.

A transport sends one request and returns the response once its head has arrived; retries,
limiters, JSON and the request deadline belong to the connection above it. It raises only the
typed outcomes below (plus ``TimeoutError`` from :meth:`Response.receive_some`), which the
retry decision reads. docs/architecture.md ("The model-server transport seam") has the table.
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
    """No connection (refused, unreachable, DNS, TLS), or sending failed on a fresh one."""


class ClosedBeforeResponse(TransportError):
    """The connection was closed or reset before any byte of the response arrived.

    Args:
        reused: The connection had served earlier requests (a stale keep-alive one).
    """

    def __init__(self, message: str, *, reused: bool = False) -> None:
        super().__init__(message)
        self.reused = reused


class BodyCut(TransportError):
    """The response started but was cut (connection closed or reset) or is not valid HTTP."""


class ResponseTooLarge(TransportError):
    """The response head is longer than its bound (bytes or header lines)."""


class TransportTimeout(TransportError):
    """Connecting, or waiting for the response head or the next body bytes, took too long.

    Args:
        kind: ``"connect"``, ``"read"`` or ``"pool"`` (no free connection in httpx's pool).
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
        headers: Header names to values; lookups by lower-case name work.
    """

    @property
    def status_code(self) -> int: ...

    @property
    def reason_phrase(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def body_received(self) -> bool:
        """The whole body is here: :meth:`receive_some` returns the rest without waiting."""
        ...

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

        **Cancellation**: shielded and bounded by the transport.
        """
        ...


class Transport(Protocol):
    """Requests to one server (scheme, host, port and path prefix fixed at creation)."""

    #: ``"wire"`` or ``"httpx"``, for diagnostics and tests.
    kind: str

    async def send(self, method: str, path: str, body: bytes = b"") -> Response:
        """Send ``method path`` (relative to the base URL) and wait for the response head.

        The headers are fixed at construction: every request carries the same ones.

        Raises:
            TransportError: One of the typed outcomes.

        **Cancellation**: the connection in use is closed, never returned to a pool.
        """
        ...

    async def aclose(self) -> None:
        """Close idle connections; responses still open close their own.

        **Cancellation**: shielded and bounded per connection.
        """
        ...
