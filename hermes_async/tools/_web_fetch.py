"""Direct page fetches for ``web_extract``: SSRF-vetted, address-pinned, capped in size and time.

One fetch is a loop over redirect hops. Each hop: vet the URL (:func:`~._ssrf.vet_url`), send
``GET`` to the vetted IP with the original ``Host`` header and TLS server name (so certificate
checks still name the host), and stream the body up to ``max_body_bytes``. Redirects are
followed by hand, at most ``max_redirects`` of them, each target vetted again. The whole fetch,
all hops and the body included, runs under one deadline (``fetch_timeout_seconds``).

Each hop uses its own short-lived client: connections are pooled per *address*, and a pooled
TLS connection verified for one host name must not carry a request for another.

What is raised: :class:`~._ssrf.URLRefusedError` when the guard refuses a hop,
:class:`~._ssrf.WebFetchError` for every other failure (timeout, network error, HTTP status >= 400,
too many redirects). Both name the URL.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType

import anyio
import httpx

from hermes_async.tools._ssrf import Allowlist, URLRefusedError, WebFetchError, parse_url, vet_url
from hermes_async.tools._web_settings import WebSettings

__all__ = [
    "CLOSE_GRACE_SECONDS",
    "FetchedPage",
    "NonClosingTransport",
    "fetch_page",
    "shared_ssl_context",
]

#: Bound on closing a response or client during cleanup (shielded).
CLOSE_GRACE_SECONDS = 5.0
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# Reads tolerated after closing an abandoned body before giving up on finishing its iterators.
_ABANDON_MAX_READS = 64
_ssl_context: ssl.SSLContext | None = None


@dataclass(frozen=True, slots=True)
class FetchedPage:
    """A fetched body.

    Attributes:
        url: The final URL (after redirects).
        status: Its HTTP status.
        media_type: Lower-case media type without parameters (``text/html``).
        charset: The declared charset, if any.
        body: The body bytes (decoded from any content coding), at most ``max_body_bytes``.
        truncated: The body was longer than ``max_body_bytes``; the rest was not downloaded.
    """

    url: str
    status: int
    media_type: str
    charset: str | None
    body: bytes
    truncated: bool


class NonClosingTransport(httpx.AsyncBaseTransport):
    """Wrap an injected transport so that per-call clients never close it (its owner does)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        return None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        return None


def shared_ssl_context() -> ssl.SSLContext:
    """One verified TLS context for every web-tool client (loading the CA bundle costs ~25 ms)."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context()
    return _ssl_context


def _hop_client(settings: WebSettings) -> httpx.AsyncClient:
    transport: httpx.AsyncBaseTransport
    if settings.transport is not None:
        transport = NonClosingTransport(settings.transport)
    else:
        transport = httpx.AsyncHTTPTransport(verify=shared_ssl_context(), retries=0)
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(settings.fetch_timeout_seconds),
        follow_redirects=False,
        trust_env=False,  # a proxy would resolve the name again and defeat the pinning
    )


async def _close(resource: httpx.Response | httpx.AsyncClient) -> None:
    with anyio.move_on_after(CLOSE_GRACE_SECONDS, shield=True):
        await resource.aclose()


async def fetch_page(url: str, settings: WebSettings, *, allow: Allowlist) -> FetchedPage:
    """Fetch ``url`` directly, behind the SSRF guard.

    Args:
        url: The URL the model gave.
        settings: Caps, deadline, transport and resolver.
        allow: Hosts and networks let through on purpose.

    Returns:
        The final page (status < 400).

    Raises:
        URLRefusedError: The URL, or a redirect target, is not allowed.
        WebFetchError: Timeout, network failure, HTTP error status, too many redirects.

    **Cancellation**: the open response and client are closed (shielded, bounded by
    :data:`CLOSE_GRACE_SECONDS`) and the cancellation propagates.
    """
    timeout = settings.fetch_timeout_seconds
    try:
        with anyio.fail_after(timeout):
            return await _fetch(url, settings, allow)
    except TimeoutError:
        raise WebFetchError(
            f"fetching {url!r} took longer than {timeout:g} seconds (fetch_timeout_seconds)",
            url=url,
        ) from None


async def _fetch(start: str, settings: WebSettings, allow: Allowlist) -> FetchedPage:
    current = parse_url(start)
    previous: httpx.URL | None = None
    for _hop in range(settings.max_redirects + 1):
        try:
            target = await vet_url(current, allow=allow, resolver=settings.resolver)
        except URLRefusedError as exc:
            if previous is None:
                raise
            raise URLRefusedError(
                str(current), f"redirect from {str(previous)!r}: {exc.reason}"
            ) from None
        headers = {
            "Host": target.host_header,
            "User-Agent": settings.user_agent,
            "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
            # Ask for no content coding: the size cap then counts what was sent, and a
            # compressed bomb cannot inflate inside one read.
            "Accept-Encoding": "identity",
        }
        extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
        client = _hop_client(settings)
        try:
            request = client.build_request(
                "GET", target.connect_url, headers=headers, extensions=extensions
            )
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                raise WebFetchError(
                    f"could not fetch {str(current)!r}: {type(exc).__name__}: {exc}",
                    url=str(current),
                ) from None
            try:
                location = response.headers.get("location")
                if response.status_code in _REDIRECT_STATUSES and location:
                    try:
                        previous, current = current, parse_url(str(current.join(location)))
                    except URLRefusedError as exc:
                        raise URLRefusedError(
                            location, f"redirect from {str(current)!r}: {exc.reason}"
                        ) from None
                    continue
                if response.status_code >= 400:
                    status = response.status_code
                    reason = response.reason_phrase or httpx.codes.get_reason_phrase(status)
                    raise WebFetchError(
                        f"{str(current)!r} answered HTTP {status} {reason}".rstrip(),
                        url=str(current),
                    )
                body, truncated = await _read_capped(response, settings.max_body_bytes, current)
                media_type = response.headers.get("content-type", "").split(";", 1)[0]
                return FetchedPage(
                    url=str(current),
                    status=response.status_code,
                    media_type=media_type.strip().lower(),
                    charset=response.charset_encoding,
                    body=body,
                    truncated=truncated,
                )
            finally:
                await _close(response)
        finally:
            await _close(client)
    raise WebFetchError(
        f"too many redirects fetching {start!r} (more than {settings.max_redirects}, the "
        "max_redirects setting)",
        url=start,
    )


async def _read_capped(response: httpx.Response, limit: int, url: httpx.URL) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    iterator = response.aiter_bytes()
    try:
        async for chunk in iterator:
            room = limit - size
            if len(chunk) > room:
                chunks.append(chunk[:room])
                await _abandon(response, iterator)
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
    except httpx.HTTPError as exc:
        raise WebFetchError(
            f"reading the body of {str(url)!r} failed: {type(exc).__name__}: {exc}", url=str(url)
        ) from None
    return b"".join(chunks), False


async def _abandon(response: httpx.Response, iterator: AsyncIterator[bytes]) -> None:
    """Stop downloading: close the connection, then run the body iterator to its end.

    httpx's body iterators are nested async generators. Leaving them suspended lets the garbage
    collector finalize them later (trio warns about each one); after the close, the next read
    fails at the bottom of the chain and every layer finishes at once.
    """
    await _close(response)
    for _ in range(_ABANDON_MAX_READS):
        try:
            await iterator.__anext__()
        except StopAsyncIteration:
            return
        except Exception:  # the expected "socket closed" error ends the chain; nothing to report
            return
