"""Fakes for testing code that uses the web tools without touching the network.

:class:`FakeResolver` answers lookups from a table; :class:`LoopbackOnlyTransport`
reaches only 127.0.0.0/8 and records any other attempt, so even a broken SSRF guard sends
nothing out; :class:`FakeWebProvider` is an ASGI app playing Firecrawl, Tavily or Exa
(serve it with :func:`hermes_async.testing.http.open_loopback_server`).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio
import httpx

from hermes_async.jsontypes import JSON, JSONObject

__all__ = (
    "FakeResolver",
    "FakeWebProvider",
    "LoopbackOnlyTransport",
    "RecordedRequest",
)

_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")

Scope = MutableMapping[str, JSON]
Receive = Callable[[], Awaitable[MutableMapping[str, JSON]]]
Send = Callable[[MutableMapping[str, JSON]], Awaitable[None]]


class FakeResolver:
    """An async resolver (``WebSettings.resolver``) answering from a fixed table.

    Args:
        table: Host name -> addresses. Unknown names fail like a DNS miss (``OSError``).
    """

    def __init__(self, table: Mapping[str, Sequence[str]] | None = None) -> None:
        self.table = {k.lower(): list(v) for k, v in (table or {}).items()}
        self.queries: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        await anyio.lowlevel.checkpoint()
        self.queries.append(host)
        try:
            return list(self.table[host.lower()])
        except KeyError:
            raise OSError(f"fake DNS: no such host {host!r}") from None


class LoopbackOnlyTransport(httpx.AsyncBaseTransport):
    """An httpx transport that can only reach loopback addresses.

    Args:
        routes: ``"ip"`` or ``"ip:port"`` -> loopback base URL; such a request goes there,
            keeping its path, query and ``Host`` header.

    Any other destination outside 127.0.0.0/8, host names included, is refused with
    ``httpx.ConnectError`` and recorded in :attr:`violations`.
    """

    def __init__(self, routes: Mapping[str, str] | None = None) -> None:
        self.routes = dict(routes or {})
        self.violations: list[str] = []
        self.requests: list[str] = []
        self.sni_hostnames: list[str | None] = []
        self._inner = httpx.AsyncHTTPTransport(retries=0)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        self.requests.append(str(request.url))
        sni = request.extensions.get("sni_hostname")
        self.sni_hostnames.append(sni if isinstance(sni, str) else None)
        route = self.routes.get(f"{host}:{port}") or self.routes.get(host)
        if route is not None:
            base = httpx.URL(route)
            request.url = request.url.copy_with(scheme=base.scheme, host=base.host, port=base.port)
            request.extensions.pop("sni_hostname", None)
            return await self._inner.handle_async_request(request)
        try:
            loopback = ipaddress.ip_address(host) in _LOOPBACK
        except ValueError:
            loopback = False
        if not loopback:
            message = f"LoopbackOnlyTransport refused a connection to {host}:{port} ({request.url})"
            self.violations.append(message)
            raise httpx.ConnectError(message, request=request)
        return await self._inner.handle_async_request(request)

    def assert_no_violations(self) -> None:
        """Fail (``AssertionError``) if any request tried to leave the loopback network."""
        assert not self.violations, "non-loopback connections attempted: " + "; ".join(
            self.violations
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request a :class:`FakeWebProvider` received."""

    method: str
    path: str
    headers: Mapping[str, str]
    json: JSON


@dataclass
class FakeWebProvider:
    """An ASGI app playing one web provider (Firecrawl v2, Tavily or Exa).

    Attributes:
        pages: URL -> ``(title, markdown)`` for the extract endpoints; other URLs fail per URL.
        results: Search hits as ``(title, url, description)``.
        status: When set, every request gets this HTTP status and ``error_body``.
        hang: Never answer (until the client disconnects): a timeout test.
        requests: Every request received, in order.
    """

    provider: Literal["firecrawl", "tavily", "exa"]
    pages: dict[str, tuple[str, str]] = field(default_factory=dict)
    results: list[tuple[str, str, str]] = field(
        default_factory=lambda: [
            ("Result one", "https://one.example/", "First description"),
            ("Result two", "https://two.example/", "Second description"),
        ]
    )
    status: int | None = None
    error_body: JSONObject = field(default_factory=lambda: {"error": "Unauthorized"})
    hang: bool = False
    requests: list[RecordedRequest] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan: nothing to do
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            body: JSON = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append(RecordedRequest(scope["method"], scope["path"], headers, body))
        if self.hang:
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        if self.status is not None:
            await _send_json(send, self.status, self.error_body)
            return
        answer = self._answer(scope["path"], body if isinstance(body, dict) else {})
        if answer is None:
            await _send_json(send, 404, {"error": f"no such endpoint {scope['path']}"})
        else:
            await _send_json(send, 200, answer)

    def _answer(self, path: str, body: JSONObject) -> JSONObject | None:
        hits = self.results
        if self.provider == "firecrawl":
            if path == "/v2/search":
                limit = int(body.get("limit", 5))
                web = [
                    {"url": u, "title": t, "description": d, "position": i + 1}
                    for i, (t, u, d) in enumerate(hits[:limit])
                ]
                return {"success": True, "data": {"web": web}}
            if path == "/v2/scrape":
                url = str(body.get("url"))
                if url not in self.pages:
                    return {
                        "success": True,
                        "data": {"metadata": {"sourceURL": url, "statusCode": 404}},
                    }
                title, markdown = self.pages[url]
                return {
                    "success": True,
                    "data": {
                        "markdown": markdown,
                        "metadata": {"title": title, "sourceURL": url, "statusCode": 200},
                    },
                }
            return None
        if self.provider == "tavily":
            if path == "/search":
                limit = int(body.get("max_results", 5))
                return {
                    "query": body.get("query"),
                    "results": [
                        {"title": t, "url": u, "content": d, "score": 0.9}
                        for t, u, d in hits[:limit]
                    ],
                }
            if path == "/extract":
                urls = [str(u) for u in body.get("urls", [])]
                return {
                    "results": [
                        {"url": u, "raw_content": self.pages[u][1]} for u in urls if u in self.pages
                    ],
                    "failed_results": [
                        {"url": u, "error": "Failed to fetch url"}
                        for u in urls
                        if u not in self.pages
                    ],
                }
            return None
        if path == "/search":
            limit = int(body.get("numResults", 10))
            return {
                "requestId": "fake",
                "results": [{"id": u, "title": t, "url": u, "text": d} for t, u, d in hits[:limit]],
            }
        if path == "/contents":
            urls = [str(u) for u in body.get("urls", [])]
            return {
                "requestId": "fake",
                "results": [
                    {"id": u, "url": u, "title": self.pages[u][0], "text": self.pages[u][1]}
                    for u in urls
                    if u in self.pages
                ],
                "statuses": [
                    {"id": u, "status": "success"}
                    if u in self.pages
                    else {
                        "id": u,
                        "status": "error",
                        "error": {"tag": "CRAWL_NOT_FOUND", "httpStatusCode": 404},
                    }
                    for u in urls
                ],
            }
        return None


async def _send_json(send: Send, status: int, body: JSON) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(data)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
