"""What every HTTP user in hermes_async shares: TLS trust, the close bound, URL redaction.

One :func:`default_ssl_context`, one :data:`CLOSE_GRACE_SECONDS`, one
:func:`aclose_httpx_stream`, and :func:`redact_url` / :func:`redact_urls` for messages.
"""

from __future__ import annotations

import functools
import ssl
import urllib.parse
from collections.abc import AsyncIterator

import httpx

from hermes_async._cleanup import cleanup_scope
from hermes_async._redact import REDACTED, redact_url, redact_urls

__all__ = (
    "CLOSE_GRACE_SECONDS",
    "REDACTED",
    "aclose_httpx_stream",
    "base_url_problem",
    "default_ssl_context",
    "redact_url",
    "redact_urls",
)

#: Bound on closing one response, connection or client during cleanup (shielded). A close
#: never waits for the peer (no TLS close_notify), so 2 s only guards the pathological.
CLOSE_GRACE_SECONDS = 2.0

#: Pulls allowed after closing an abandoned httpx body before giving up on finishing its chain.
_DRAIN_MAX_READS = 64


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """The process's shared verifying TLS context (system store plus certifi). Do not modify it."""
    import certifi  # an httpx dependency; imported here to keep module import cheap

    # The system store holds operators' private CAs; certifi is what httpx trusts and what
    # a container without ca-certificates still has. Built once: a bundle costs ~20-25 ms.
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=certifi.where())
    return context


async def aclose_httpx_stream(
    response: httpx.Response,
    chunks: AsyncIterator[bytes] | None,
    *,
    what: str = "close HTTP response",
    reason: str | None = None,
) -> None:
    """Close a streamed httpx response and finish its body iterator; shielded and bounded.

    Args:
        chunks: The iterator the body was read from, or ``None`` if reading never started.
        what: The step, for the overrun log line.
        reason: Why the response is closed early, for the overrun log line.

    **Cancellation**: shielded, bounded by :data:`CLOSE_GRACE_SECONDS` (overrun logged).
    """
    with cleanup_scope(what, CLOSE_GRACE_SECONDS, reason=reason):
        await response.aclose()
        # Pulling once more after the close makes httpx's chain of nested generators raise at
        # its bottom and every layer finish; left suspended, trio warns about each on GC.
        if chunks is None:
            return
        for _ in range(_DRAIN_MAX_READS):
            try:
                await chunks.__anext__()
            except StopAsyncIteration:
                return
            except Exception:  # the closed chain's "stream closed" error is the way out
                return


def base_url_problem(url: str) -> str | None:
    """Why ``url`` is not a server's base URL, ``http(s)://host[:port][/path]`` (``None``: it
    is one). The model-server clients' rule; a CLI or config check asks it before they exist."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host"
    if parts.query or parts.fragment:
        return "must not have a query or fragment"
    try:
        parts.port  # noqa: B018  (raises for a port that is not a number in 0-65535)
    except ValueError:
        return "has an invalid port"
    return None
