"""What every HTTP user in hermes_async shares: TLS trust, the close bound, URL redaction.

Three HTTP users live in different packages — the model-server clients (``inference``), the web
tools (``tools``) and the environment's reachability probe (``envs``) — and each used to carry
its own copy of these pieces (one trusted the system store, another certifi; one gave a close 2
seconds, another 5). They are defined once here:

* :func:`default_ssl_context`: one verifying TLS context per process, built on first use.
  Loading a CA bundle costs ~20-25 ms of CPU, too much to pay per client (a web tool makes one
  client per call). It trusts the system store *and* certifi's bundle: the system store is where
  operators install private CAs; certifi is what httpx trusts and what a minimal container
  without ``ca-certificates`` still has. The context is shared: never modify it (pass your own
  ``ssl.SSLContext`` where a setting differs).
* :data:`CLOSE_GRACE_SECONDS`: the bound on one close of a response, a connection or a client.
  Closing a socket never waits for the peer here (no TLS ``close_notify`` exchange), so this
  only guards against the pathological; 2 s keeps a cancelled caller's cleanup short.
* :func:`aclose_httpx_stream`: the drain workaround for httpx streamed bodies (see its doc).
* :func:`redact_url` / :func:`redact_urls`: credentials out of URLs before a message is built
  (defined in ``hermes_async._redact``, standard library only, and re-exported here).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator

import httpx

from hermes_async._cleanup import cleanup_scope
from hermes_async._redact import REDACTED, redact_url, redact_urls

__all__ = (
    "CLOSE_GRACE_SECONDS",
    "REDACTED",
    "aclose_httpx_stream",
    "default_ssl_context",
    "redact_url",
    "redact_urls",
)

#: Bound on closing one response, connection or client during cleanup (shielded).
CLOSE_GRACE_SECONDS = 2.0

#: Pulls allowed after closing an abandoned httpx body before giving up on finishing its chain.
_DRAIN_MAX_READS = 64


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """The process's shared verifying TLS context (system trust store plus certifi's bundle).

    Built once, on first use. Do not modify it.
    """
    import certifi  # an httpx dependency; imported here to keep module import cheap

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

    Why the drain: httpx streams a body through a chain of nested async generators. Leaving
    one early (a ``break``, a size cap, an error between chunks) leaves the inner generators
    suspended, and trio warns about each when it is garbage collected. Closing the response
    and then pulling once more makes the chain raise at its bottom and every layer finish, on
    both backends.

    Args:
        response: The streamed response.
        chunks: The iterator the body was being read from (``response.aiter_bytes()``), or
            ``None`` if reading never started.
        what: The step, for the overrun log line.
        reason: Why the response is closed early, for the overrun log line.

    **Cancellation**: shielded, bounded by :data:`CLOSE_GRACE_SECONDS` (overrun logged).
    """
    with cleanup_scope(what, CLOSE_GRACE_SECONDS, reason=reason):
        await response.aclose()
        if chunks is None:
            return
        for _ in range(_DRAIN_MAX_READS):
            try:
                await chunks.__anext__()
            except StopAsyncIteration:
                return
            except Exception:  # the closed chain's "stream closed" error is the way out
                return
