"""The SSRF guard: address policy, URL checks, and refusals through the web_extract tool.

No test here can send traffic off the machine: host names resolve through :class:`FakeResolver`
(no DNS) and every request goes through :class:`LoopbackOnlyTransport`, which refuses (and
records) any destination outside 127.0.0.0/8 that is not routed to a loopback test server.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from hermes_async.errors import ConfigError
from hermes_async.testing.fake_web import FakeResolver, FakeWebProvider, LoopbackOnlyTransport
from hermes_async.testing.http import open_loopback_server
from hermes_async.tools._ssrf import (
    Allowlist,
    URLRefusedError,
    WebFetchError,
    address_problem,
    parse_url,
    vet_url,
)
from hermes_async.tools._web_settings import WebSettings
from hermes_async.tools.registry import ToolRuntime
from hermes_async.tools.web import web_extract

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PUBLIC_IP = "93.184.216.34"

# --------------------------------------------------------------------------------------------
# Pure policy (no I/O)


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "private"),
        ("255.255.255.255", "private"),
        ("100.64.0.1", "reserved"),  # shared address space (CGNAT)
        ("192.0.0.8", "reserved"),
        ("198.18.0.1", "private"),
        ("203.0.113.7", "private"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "link-local"),
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 of 169.254.169.254
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("::7f00:1", "loopback"),  # IPv4-compatible 127.0.0.1
        ("fec0::1", "reserved"),  # deprecated site-local
    ],
)
def test_non_public_addresses_are_refused(address: str, category: str) -> None:
    problem = address_problem(ipaddress.ip_address(address))
    assert problem is not None
    assert category in problem


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "2002:808:808::1",
    ],
)
def test_public_addresses_pass(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file:///etc/passwd", "scheme 'file' is not allowed"),
        ("gopher://example.com:70/1", "scheme 'gopher' is not allowed"),
        ("ftp://example.com/x", "scheme 'ftp' is not allowed"),
        ("javascript:alert(1)", "scheme 'javascript' is not allowed"),
        ("http:///nohost", "it has no host"),
        ("", "it is not a URL"),
    ],
)
def test_parse_url_refuses_bad_schemes_and_hosts(url: str, reason: str) -> None:
    with pytest.raises(URLRefusedError, match=reason):
        parse_url(url)


def test_allowlist_entries() -> None:
    allow = Allowlist.from_entries(["Intranet.Local", ".corp.example", "10.1.0.0/16", "127.0.0.1"])
    assert allow.allows_host("intranet.local.")
    assert allow.allows_host("a.b.corp.example")
    assert not allow.allows_host("corp.example.evil.com")
    assert allow.allows_ip(ipaddress.ip_address("10.1.2.3"))
    assert allow.allows_ip(ipaddress.ip_address("127.0.0.1"))
    assert not allow.allows_ip(ipaddress.ip_address("127.0.0.2"))
    assert not allow.allows_ip(ipaddress.ip_address("10.2.0.1"))


def test_bad_allow_entry_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="neither a host name nor a valid CIDR"):
        WebSettings(allow=("10.0.0.0/33",))


# --------------------------------------------------------------------------------------------
# vet_url with an injected resolver


@pytest.mark.anyio
async def test_vet_url_resolves_and_pins_the_address() -> None:
    resolver = FakeResolver({"public.example": [PUBLIC_IP]})
    target = await vet_url(
        parse_url("https://public.example:8443/a?b=1"), allow=Allowlist(), resolver=resolver
    )
    assert target.ip == PUBLIC_IP
    assert str(target.connect_url) == f"https://{PUBLIC_IP}:8443/a?b=1"
    assert target.host_header == "public.example:8443"
    assert target.sni_hostname == "public.example"
    assert resolver.queries == ["public.example"]


@pytest.mark.anyio
async def test_vet_url_refuses_if_any_record_is_private() -> None:
    resolver = FakeResolver({"mixed.example": [PUBLIC_IP, "10.0.0.7"]})
    with pytest.raises(
        URLRefusedError, match=r"resolves to 10\.0\.0\.7: 10\.0\.0\.7 is a private address"
    ):
        await vet_url(parse_url("http://mixed.example/"), allow=Allowlist(), resolver=resolver)


@pytest.mark.anyio
async def test_vet_url_dns_failure_is_a_fetch_error() -> None:
    with pytest.raises(WebFetchError, match=r"could not resolve host 'nowhere\.example'"):
        await vet_url(
            parse_url("http://nowhere.example/"), allow=Allowlist(), resolver=FakeResolver()
        )


@pytest.mark.anyio
async def test_allowlisted_host_name_passes_with_private_address() -> None:
    resolver = FakeResolver({"intranet.local": ["10.9.9.9"]})
    allow = Allowlist.from_entries(["intranet.local"])
    target = await vet_url(parse_url("http://intranet.local/x"), allow=allow, resolver=resolver)
    assert target.ip == "10.9.9.9"


# --------------------------------------------------------------------------------------------
# Refusals through the tool, with the network locked to loopback


def redirect_to(location: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/ok":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/plain")],
                }
            )
            await send({"type": "http.response.body", "body": b"public page"})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 302,
                "headers": [(b"location", location.encode())],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    return app


@asynccontextmanager
async def fake_internet(location: str) -> AsyncIterator[tuple[LoopbackOnlyTransport, FakeResolver]]:
    """A "public" host (public.example -> 93.184.216.34) played by a loopback server."""
    async with open_loopback_server(redirect_to(location)) as base_url:
        transport = LoopbackOnlyTransport(routes={PUBLIC_IP: base_url})
        resolver = FakeResolver(
            {
                "public.example": [PUBLIC_IP],
                "internal.example": ["10.0.0.5"],
                "metadata.example": ["169.254.169.254"],
                "localhost": ["127.0.0.1", "::1"],
            }
        )
        try:
            yield transport, resolver
        finally:
            await transport.aclose()


async def run_extract(urls: list[str], web: WebSettings) -> list[dict[str, Any]]:
    result = await web_extract({"urls": urls}, ToolRuntime(task_id="ssrf", web=web))
    return list(result["results"])


REFUSED = [
    ("http://127.0.0.1/", r"127\.0\.0\.1 is a loopback address"),
    ("http://127.0.0.1:8080/admin", r"127\.0\.0\.1 is a loopback address"),
    ("http://[::1]/", r"::1 is a loopback address"),
    ("http://10.0.0.1/", r"10\.0\.0\.1 is a private address"),
    ("http://169.254.169.254/latest/meta-data/", r"169\.254\.169\.254 is a link-local address"),
    ("http://[::ffff:169.254.169.254]/", r"embeds 169\.254\.169\.254"),
    ("http://internal.example/", r"host 'internal\.example' resolves to 10\.0\.0\.5: .* private"),
    ("http://metadata.example/", r"resolves to 169\.254\.169\.254: .* link-local"),
    ("http://localhost:9000/", r"resolves to 127\.0\.0\.1: .* loopback"),
    ("file:///etc/passwd", r"scheme 'file' is not allowed"),
    ("gopher://public.example:70/_GET", r"scheme 'gopher' is not allowed"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("url", "reason"), REFUSED)
async def test_ssrf_refused_before_any_connection(url: str, reason: str) -> None:
    async with fake_internet("/ok") as (transport, resolver):
        web = WebSettings(extract_backend="direct", transport=transport, resolver=resolver)
        [page] = await run_extract([url], web)
    assert page["content"] is None
    assert page["error"].startswith(f"refused to fetch {url!r}")
    assert re.search(reason, page["error"]), page["error"]
    assert transport.requests == []  # nothing was sent anywhere
    transport.assert_no_violations()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "location",
    [
        "http://10.0.0.1/secret",
        "http://169.254.169.254/latest/meta-data/",
        "http://internal.example/",
        "http://[::1]:8080/",
        "file:///etc/passwd",
    ],
)
async def test_public_url_redirecting_to_private_is_refused(location: str) -> None:
    async with fake_internet(location) as (transport, resolver):
        web = WebSettings(extract_backend="direct", transport=transport, resolver=resolver)
        [page] = await run_extract(["http://public.example/start"], web)
    assert page["content"] is None
    assert "refused to fetch" in page["error"]
    assert "redirect from 'http://public.example/start'" in page["error"]
    # Exactly one request went out: to the public host, routed to the loopback server.
    assert transport.requests == [f"http://{PUBLIC_IP}/start"]
    transport.assert_no_violations()


@pytest.mark.anyio
async def test_public_host_is_fetched_at_the_vetted_address_with_its_host_header() -> None:
    seen: list[dict[str, str]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": b"hello from the public web"})

    async with open_loopback_server(app) as base_url:
        transport = LoopbackOnlyTransport(routes={PUBLIC_IP: base_url})
        resolver = FakeResolver({"public.example": [PUBLIC_IP]})
        web = WebSettings(extract_backend="direct", transport=transport, resolver=resolver)
        [page] = await run_extract(["http://public.example/page"], web)
        await transport.aclose()
    assert page == {
        "url": "http://public.example/page",
        "title": None,
        "content": "hello from the public web",
        "error": None,
    }
    assert transport.requests == [f"http://{PUBLIC_IP}/page"]
    assert seen[0]["host"] == "public.example"
    transport.assert_no_violations()


@pytest.mark.anyio
async def test_https_fetch_keeps_the_host_name_for_tls() -> None:
    async with fake_internet("/ok") as (transport, resolver):
        web = WebSettings(extract_backend="direct", transport=transport, resolver=resolver)
        [page] = await run_extract(["https://public.example/ok"], web)
    assert page["content"] == "public page"
    # The connection targets the vetted IP, while TLS is told (and verifies) the host name.
    assert transport.requests == [f"https://{PUBLIC_IP}/ok"]
    assert transport.sni_hostnames == ["public.example"]
    transport.assert_no_violations()


@pytest.mark.anyio
async def test_safety_net_catches_a_connection_the_guard_let_through() -> None:
    # Deliberately open the guard for 10.0.0.0/8: the transport must still refuse to connect,
    # which is what keeps these tests safe even if the guard had a bug.
    transport = LoopbackOnlyTransport()
    web = WebSettings(
        extract_backend="direct",
        allow=("10.0.0.0/8",),
        transport=transport,
        resolver=FakeResolver(),
    )
    [page] = await run_extract(["http://10.0.0.1/"], web)
    await transport.aclose()
    assert "could not fetch" in page["error"] and "LoopbackOnlyTransport refused" in page["error"]
    assert transport.violations and "10.0.0.1:80" in transport.violations[0]
    with pytest.raises(AssertionError, match="non-loopback connections attempted"):
        transport.assert_no_violations()


@pytest.mark.anyio
async def test_provider_extract_also_refuses_internal_urls() -> None:
    provider = FakeWebProvider(
        "firecrawl", pages={"https://public.example/": ("Public", "# Public")}
    )
    async with open_loopback_server(provider) as base_url:
        transport = LoopbackOnlyTransport()
        web = WebSettings(
            firecrawl_api_key="fc-test",
            firecrawl_url=base_url,
            transport=transport,
            resolver=FakeResolver({"public.example": [PUBLIC_IP]}),
        )
        ok, internal = await run_extract(
            ["https://public.example/", "http://169.254.169.254/"], web
        )
        await transport.aclose()
    assert ok["content"] == "# Public"
    assert "169.254.169.254 is a link-local address" in internal["error"]
    # Only the public URL reached the provider.
    assert [r.json["url"] for r in provider.requests] == ["https://public.example/"]
    transport.assert_no_violations()


@pytest.mark.anyio
async def test_loopback_transport_refuses_host_names() -> None:
    transport = LoopbackOnlyTransport()
    request = httpx.Request("GET", "http://example.com/")
    with pytest.raises(httpx.ConnectError, match=r"refused a connection to example\.com:80"):
        await transport.handle_async_request(request)
    await transport.aclose()
    assert transport.violations
