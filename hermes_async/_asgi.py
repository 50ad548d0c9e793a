"""Serve an ASGI app with hypercorn on the running backend (asyncio or trio).

The one place that starts hypercorn: the rollout worker service and the test kit's loopback
server. The caller binds the socket (so its address is known before serving starts) and
says when to stop; hypercorn then lets in-flight requests finish for ``grace_seconds``.
Needs hypercorn (the ``service`` or ``testing`` extra).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from hermes_async._asynclib import current_async_library

__all__ = ("ASGIApp", "bind_socket", "serve_asgi")

#: An ASGI 3 application: ``await app(scope, receive, send)``.
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]


def bind_socket(host: str, port: int, *, backlog: int = 128) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (``port`` 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_asgi(
    app: ASGIApp,
    sock: socket.socket,
    *,
    shutdown: Callable[[], Awaitable[None]],
    grace_seconds: float,
    startup_timeout: float = 10.0,
    log: logging.Logger | None = None,
) -> None:
    """Serve ``app`` on ``sock`` until ``shutdown()`` returns, then for ``grace_seconds`` more.

    ``app`` gets ``http`` scopes and the ``lifespan`` protocol as hypercorn sends them.

    Raises:
        ImportError: hypercorn is missing (naming the extra to install).

    **Cancellation**: the server stops at once; in-flight requests are cancelled.
    """
    try:
        from hypercorn.app_wrappers import ASGIWrapper
        from hypercorn.config import Config, Sockets
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "serving HTTP needs hypercorn: pip install 'hermes-async[service]' (or [testing])"
        ) from exc
    config = Config()
    config.graceful_timeout = grace_seconds
    config.startup_timeout = startup_timeout
    config.shutdown_timeout = grace_seconds
    config.accesslog = None
    config.errorlog = log or logging.getLogger("hermes_async.http")
    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    wrapped = ASGIWrapper(app)  # type: ignore[arg-type]
    if current_async_library() == "trio":
        from hypercorn.trio.run import worker_serve as trio_serve

        await trio_serve(wrapped, config, sockets=sockets, shutdown_trigger=shutdown)
    else:
        from hypercorn.asyncio.run import worker_serve as asyncio_serve

        await asyncio_serve(wrapped, config, sockets=sockets, shutdown_trigger=shutdown)
