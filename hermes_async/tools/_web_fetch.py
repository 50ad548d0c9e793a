"""Direct fetches behind the SSRF guard: vetted, address-pinned, capped in size and time.

For ``web_extract`` and the browser's requests. Each hop vets the URL, connects to the vetted
IP with the original ``Host`` and TLS name, and has its own client (a TLS connection verified
for one host must not carry another's). Redirects are followed by hand, each target vetted.
"""

from __future__ import annotations

import email.message
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import anyio
import httpx

from hermes_async._cleanup import bounded_cleanup
from hermes_async._net import CLOSE_GRACE_SECONDS, aclose_httpx_stream, default_ssl_context
from hermes_async.tools._ssrf import Allowlist, URLRefusedError, WebFetchError, parse_url, vet_url
from hermes_async.tools._web_settings import WebSettings

__all__ = ("HopResponse", "NonClosingTransport", "aclose_client", "fetch", "fetch_page")

#: Statuses that redirect (with a ``Location`` header).
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: ``Content-Encoding`` values decoded here (zlib ``wbits``), bounded by ``max_body_bytes``.
_CODINGS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


@dataclass(frozen=True, slots=True)
class _FetchedPage:
    """A fetched body: final URL, status, media type, charset, body, ``truncated``."""

    url: str
    status: int
    media_type: str
    charset: str | None
    body: bytes
    truncated: bool


@dataclass(frozen=True, slots=True)
class HopResponse:
    """The response to one request (one hop, or the last hop of :func:`fetch`).

    Attributes:
        status: The HTTP status (errors are responses here).
        headers: Every response header, in order, repeated names kept.
        body: The decoded body, at most ``max_body_bytes``; empty for a redirect.
        truncated: The rest of the body was not downloaded.
        redirects: How many redirects :func:`fetch` followed.
    """

    url: str
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    truncated: bool
    redirects: int = 0

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or ``None``."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)

    @property
    def location(self) -> str | None:
        """The ``Location`` of a redirect response, else ``None``."""
        return self.header("location") if self.status in _REDIRECT_STATUSES else None


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
        timeout=httpx.Timeout(settings.fetch_timeout),
        follow_redirects=False,
        trust_env=False,  # a proxy would resolve the name again and defeat the pinning
    )


async def aclose_client(client: httpx.AsyncClient, what: str = "close a web client") -> None:
    """Close a web-tool client: shielded, bounded, failures logged.

    **Cancellation**: the close still runs (bounded); the cancellation follows.
    """
    await bounded_cleanup(what, client.aclose, timeout=CLOSE_GRACE_SECONDS)


async def fetch_page(url: str, settings: WebSettings, *, allow: Allowlist) -> _FetchedPage:
    """``fetch("GET", url)`` under one ``fetch_timeout`` deadline, refusing HTTP errors.

    Raises:
        URLRefusedError: The URL, or a redirect target, is not allowed.
        WebFetchError: Timeout, network failure, HTTP error status, too many redirects.

    **Cancellation**: the response and client are closed (shielded, bounded).
    """
    timeout = settings.fetch_timeout
    headers = {
        "User-Agent": settings.user_agent,
        "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
    }
    try:
        with anyio.fail_after(timeout):
            response = await fetch(
                "GET", url, headers=headers, settings=settings, allow=allow, error_bodies=False
            )
    except TimeoutError:
        raise WebFetchError(
            f"fetching {url!r} took longer than {timeout:g} seconds (fetch_timeout)",
            url=url,
        ) from None
    if response.status >= 400:
        status = response.status
        reason = response.reason or httpx.codes.get_reason_phrase(status)
        raise WebFetchError(
            f"{response.url!r} answered HTTP {status} {reason}".rstrip(), url=response.url
        )
    content_type = response.header("content-type") or ""
    return _FetchedPage(
        url=response.url,
        status=response.status,
        media_type=content_type.split(";", 1)[0].strip().lower(),
        charset=_charset(content_type),
        body=response.body,
        truncated=response.truncated,
    )


def _charset(content_type: str) -> str | None:
    """The ``charset`` parameter of a ``Content-Type`` value (parsed as httpx does)."""
    message = email.message.Message()
    message["content-type"] = content_type
    return message.get_content_charset(failobj=None)


async def fetch(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    settings: WebSettings,
    allow: Allowlist,
    content: bytes | None = None,
    follow_redirects: bool = True,
    error_bodies: bool = True,
) -> HopResponse:
    """Send a request behind the SSRF guard, following redirects by hand when asked.

    301/302/303 turn a non-``HEAD`` request into a body-less ``GET``; 307/308 keep it. The
    caller bounds the exchange. Returns the last response, whatever its status.

    Raises:
        URLRefusedError: The URL, or a redirect target, is not allowed.
        WebFetchError: Network failure or too many redirects.

    **Cancellation**: the response and client are closed (shielded, bounded).
    """
    current = parse_url(url)
    previous: httpx.URL | None = None
    for hop in range(settings.max_redirects + 1):
        try:
            response = await _fetch_hop(
                method,
                current,
                headers=headers,
                settings=settings,
                allow=allow,
                content=content,
                error_bodies=error_bodies,
            )
        except URLRefusedError as exc:
            if previous is None:
                raise
            raise URLRefusedError(
                str(current), f"redirect from {str(previous)!r}: {exc.reason}"
            ) from None
        location = response.location
        if not follow_redirects or not location:
            return HopResponse(
                response.url,
                response.status,
                response.reason,
                response.headers,
                response.body,
                response.truncated,
                redirects=hop,
            )
        try:
            previous, current = current, parse_url(str(current.join(location)))
        except URLRefusedError as exc:
            raise URLRefusedError(
                location, f"redirect from {str(current)!r}: {exc.reason}"
            ) from None
        if response.status in (301, 302, 303) and method.upper() != "HEAD":
            method, content = "GET", None
    raise WebFetchError(
        f"too many redirects fetching {url!r} (more than {settings.max_redirects}, the "
        "max_redirects setting)",
        url=url,
    )


async def _fetch_hop(
    method: str,
    url: httpx.URL,
    *,
    headers: Mapping[str, str],
    settings: WebSettings,
    allow: Allowlist,
    content: bytes | None = None,
    error_bodies: bool = True,
) -> HopResponse:
    """One request to the vetted address of ``url``; redirects are returned, not followed.

    ``Accept-Encoding: identity`` asks for the body as is; one compressed anyway is decoded
    under the cap (:class:`_Decoder`): no compressed bomb.
    """
    target = await vet_url(url, allow=allow, resolver=settings.resolver)
    sent = {k: v for k, v in headers.items() if k.lower() not in ("host", "accept-encoding")}
    sent["Host"] = target.host_header
    sent["Accept-Encoding"] = "identity"
    extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
    client = _hop_client(settings)
    body_chunks: AsyncIterator[bytes] | None = None  # once reading the body started
    try:
        request = client.build_request(
            method, target.connect_url, headers=sent, content=content, extensions=extensions
        )
        try:
            response = await client.send(request, stream=True)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL: a bad Location
            raise WebFetchError(
                f"could not fetch {str(url)!r}: {type(exc).__name__}: {exc}", url=str(url)
            ) from None
        try:
            header_items = tuple(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw
            )
            redirect = response.status_code in _REDIRECT_STATUSES and response.headers.get(
                "location"
            )
            if redirect or (response.status_code >= 400 and not error_bodies):
                body, truncated = b"", False
            else:
                decoder = _Decoder(response.headers.get_list("content-encoding"), url)
                body_chunks = response.aiter_raw()
                body, truncated = await _read_capped(
                    body_chunks, decoder, settings.max_body_bytes, url
                )
            return HopResponse(
                url=str(url),
                status=response.status_code,
                reason=response.reason_phrase,
                headers=header_items,
                body=body,
                truncated=truncated,
            )
        finally:
            await aclose_httpx_stream(response, body_chunks, what="close a fetched response")
    finally:
        await aclose_client(client, "close a page-fetch client")


class _Decoder:
    """Undo a ``Content-Encoding`` chunk by chunk, never making more than the room left.

    The request asks for ``identity``; a server may still compress, and a few KB of gzip can
    inflate to gigabytes, so the cap must hold while decoding, not after.
    """

    def __init__(self, values: list[str], url: httpx.URL) -> None:
        codings = [c.strip().lower() for v in values for c in v.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        self._url = url
        self._coding = codings[0] if codings else None
        if len(codings) > 1 or (self._coding is not None and self._coding not in _CODINGS):
            raise WebFetchError(
                f"{str(url)!r} sent its body with Content-Encoding {', '.join(codings)!r}; "
                "only gzip and deflate can be read",
                url=str(url),
            )
        self._inflater = zlib.decompressobj(_CODINGS[self._coding]) if self._coding else None
        self._started = False

    def decode(self, data: bytes, room: int) -> bytes:
        """Decoded ``data``: at most ``room + 1`` bytes (more than ``room`` means it was cut)."""
        if self._inflater is None:
            return data
        try:
            out = self._inflater.decompress(data, room + 1)
        except zlib.error as exc:
            if self._coding == "deflate" and not self._started:
                # Some servers send raw deflate data without the zlib header.
                self._started = True
                self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.decode(data, room)
            raise WebFetchError(
                f"reading the body of {str(self._url)!r} failed: its {self._coding} data is "
                f"corrupt ({exc})",
                url=str(self._url),
            ) from None
        self._started = True
        return out


async def _read_capped(
    chunks: AsyncIterator[bytes], decoder: _Decoder, limit: int, url: httpx.URL
) -> tuple[bytes, bool]:
    """The decoded body up to ``limit`` bytes, and whether it was longer (the rest is not read;
    the caller's close finishes the iterator)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for raw in chunks:
            room = limit - size
            chunk = decoder.decode(raw, room)
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
