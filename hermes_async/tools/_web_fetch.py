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

from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx

from hermes_async._cleanup import bounded_cleanup
from hermes_async._net import CLOSE_GRACE_SECONDS, aclose_httpx_stream, default_ssl_context
from hermes_async.tools._ssrf import Allowlist, URLRefusedError, WebFetchError, parse_url, vet_url
from hermes_async.tools._web_settings import WebSettings

__all__ = (
    "FetchedPage",
    "NonClosingTransport",
    "aclose_client",
    "fetch_page",
)

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


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
        """Leave the wrapped transport open (``async with`` exits through this too)."""
        return None


def _hop_client(settings: WebSettings) -> httpx.AsyncClient:
    transport: httpx.AsyncBaseTransport
    if settings.transport is not None:
        transport = NonClosingTransport(settings.transport)
    else:
        transport = httpx.AsyncHTTPTransport(verify=default_ssl_context(), retries=0)
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(settings.fetch_timeout_seconds),
        follow_redirects=False,
        trust_env=False,  # a proxy would resolve the name again and defeat the pinning
    )


async def aclose_client(client: httpx.AsyncClient, what: str = "close a web client") -> None:
    """Close a web-tool client: shielded, bounded by the shared close grace, failures logged.

    **Cancellation**: the close still runs (bounded); the caller's cancellation follows.
    """
    await bounded_cleanup(what, client.aclose, timeout=CLOSE_GRACE_SECONDS)


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

    **Cancellation**: the open response and client are closed (shielded, each bounded by
    :data:`hermes_async._net.CLOSE_GRACE_SECONDS`) and the cancellation propagates.
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
        body_chunks: AsyncIterator[bytes] | None = None  # once reading the body started
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
                body_chunks = response.aiter_bytes()
                body, truncated = await _read_capped(body_chunks, settings.max_body_bytes, current)
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
                await aclose_httpx_stream(response, body_chunks, what="close a fetched page")
        finally:
            await aclose_client(client, "close a page-fetch client")
    raise WebFetchError(
        f"too many redirects fetching {start!r} (more than {settings.max_redirects}, the "
        "max_redirects setting)",
        url=start,
    )


async def _read_capped(
    chunks: AsyncIterator[bytes], limit: int, url: httpx.URL
) -> tuple[bytes, bool]:
    """The body up to ``limit`` bytes, and whether it was longer (the rest is not read; the
    caller's close finishes the iterator)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            room = limit - size
            if len(chunk) > room:
                parts.append(chunk[:room])
                return b"".join(parts), True
            parts.append(chunk)
            size += len(chunk)
    except httpx.HTTPError as exc:
        raise WebFetchError(
            f"reading the body of {str(url)!r} failed: {type(exc).__name__}: {exc}", url=str(url)
        ) from None
    return b"".join(parts), False
