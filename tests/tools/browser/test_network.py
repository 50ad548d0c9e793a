"""serve_request with fake Playwright routes: every answer goes through the guarded fetcher.

No browser here: the route and request are doubles recording what the handler did, the site is
the loopback test server. The handler is plain anyio + httpx, so it runs on both backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hermes_async.tools._ssrf import Allowlist
from hermes_async.tools._web_fetch import HopResponse
from hermes_async.tools._web_settings import WebSettings
from hermes_async.tools.browser._network import (
    RequestOutcome,
    browser_headers,
    serve_request,
    upstream_headers,
)
from tests.tools.browser.conftest import fake_resolver
from tests.tools.browser.site import Page, Received, Site

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"debug": True}), id="asyncio"),
        pytest.param(("trio", {}), id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    return request.param  # type: ignore[no-any-return]


@dataclass
class FakeRequest:
    url: str
    method: str = "GET"
    post_data_buffer: bytes | None = None
    resource_type: str = "image"
    navigation: bool = False
    headers: dict[str, str] = field(default_factory=lambda: {"user-agent": "test-browser"})

    def is_navigation_request(self) -> bool:
        return self.navigation

    async def all_headers(self) -> dict[str, str]:
        return dict(self.headers)


@dataclass
class FakeRoute:
    log: list[str]
    fulfilled: dict[str, object] | None = None
    aborted: str | None = None
    continued: bool = False

    async def fulfill(self, *, status: int, headers: dict[str, str], body: bytes | str) -> None:
        self.log.append("fulfill")
        self.fulfilled = {"status": status, "headers": headers, "body": body}

    async def abort(self, error_code: str) -> None:
        self.log.append("abort")
        self.aborted = error_code

    async def continue_(self) -> None:
        self.log.append("continue")
        self.continued = True


RESOLVER = fake_resolver({"shop.test": ["127.0.0.1"], "localhost": ["127.0.0.1"]})


async def _serve(
    request: FakeRequest, *, allow: tuple[str, ...] = ("shop.test",), **settings: object
) -> tuple[FakeRoute, RequestOutcome, list[str]]:
    log: list[str] = []
    route = FakeRoute(log)
    values: dict[str, object] = {"resolver": RESOLVER, "fetch_timeout": 5.0, **settings}
    web = WebSettings(**values)  # type: ignore[arg-type]

    def record(outcome: RequestOutcome) -> None:
        log.append(f"record:{outcome.disposition}")

    outcome = await serve_request(
        route,
        request,
        settings=web,
        allow=Allowlist.from_entries(allow),
        timeout=web.fetch_timeout,
        record=record,
    )
    return route, outcome, log


def test_header_filters() -> None:
    up = upstream_headers(
        {
            "Host": "x",
            "Cookie": "a=1",
            "Connection": "keep-alive",
            "Accept-Encoding": "br",
            "Content-Length": "3",
            "User-Agent": "ua",
        }
    )
    assert up == {"Cookie": "a=1", "User-Agent": "ua"}
    response = HopResponse(
        url="http://x/",
        status=200,
        reason="OK",
        headers=(
            ("Content-Type", "text/html"),
            ("Set-Cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("Vary", "Accept"),
            ("Vary", "Cookie"),
            ("Content-Encoding", "gzip"),
            ("Content-Length", "10"),
        ),
        body=b"",
        truncated=False,
    )
    assert browser_headers(response) == {
        "content-type": "text/html",
        "set-cookie": "a=1\nb=2",
        "vary": "Accept, Cookie",
    }


async def test_a_subresource_is_fetched_and_fulfilled_with_its_headers(site: Site) -> None:
    site.pages = {
        "/img": Page(b"PNG", content_type="image/png", headers=(("Set-Cookie", "k=v"),)),
    }
    route, outcome, log = await _serve(
        FakeRequest(f"http://shop.test:{site.port}/img", headers={"Cookie": "s=1", "Host": "evil"})
    )
    assert outcome == RequestOutcome(f"http://shop.test:{site.port}/img", "fulfilled", False)
    assert log == ["record:fulfilled", "fulfill"]
    assert route.fulfilled is not None and route.fulfilled["status"] == 200
    assert route.fulfilled["body"] == b"PNG"
    headers = route.fulfilled["headers"]
    assert isinstance(headers, dict) and headers["set-cookie"] == "k=v"
    [received] = site.received
    assert received.headers["host"] == f"shop.test:{site.port}"  # pinned, named host kept
    assert received.headers["cookie"] == "s=1"
    assert received.headers["accept-encoding"] == "identity"


async def test_a_form_post_goes_upstream_with_its_body(site: Site) -> None:
    site.pages = {"/submit": lambda r: Page(f"got {r.method} {r.body.decode()}")}
    route, _, _ = await _serve(
        FakeRequest(
            f"http://shop.test:{site.port}/submit",
            method="POST",
            post_data_buffer=b"name=Ada",
            navigation=True,
            resource_type="document",
        )
    )
    assert route.fulfilled is not None and route.fulfilled["body"] == b"got POST name=Ada"


async def test_loopback_is_refused_before_any_connection(site: Site) -> None:
    site.pages = {"/": Page("secret")}
    for url in (site.url("/"), f"http://localhost:{site.port}/"):
        route, outcome, log = await _serve(FakeRequest(url))
        assert route.aborted == "blockedbyclient"
        assert outcome.disposition == "blocked" and "loopback" in (outcome.detail or "")
        assert log == ["record:blocked", "abort"]  # recorded before the route is handled
    assert site.connections == 0


async def test_a_subresource_redirect_is_followed_and_each_hop_vetted(site: Site) -> None:
    site.pages = {
        "/a": Page("", status=302, headers=(("Location", "/b"),)),
        "/b": Page(b"final", content_type="text/plain"),
        "/evil": Page("", status=302, headers=(("Location", site.url("/b")),)),
    }
    route, outcome, _ = await _serve(FakeRequest(f"http://shop.test:{site.port}/a"))
    assert route.fulfilled is not None and route.fulfilled["body"] == b"final"
    route, outcome, _ = await _serve(FakeRequest(f"http://shop.test:{site.port}/evil"))
    assert route.aborted == "blockedbyclient"
    assert "redirect from" in (outcome.detail or "") and "loopback" in (outcome.detail or "")
    assert [r.path for r in site.received] == ["/a", "/b", "/evil"]


async def test_a_navigation_redirect_becomes_a_redirect_page(site: Site) -> None:
    site.pages = {
        "/login": Page(
            "", status=303, headers=(("Location", "/home?x=<1>"), ("Set-Cookie", "sid=9"))
        ),
        "/to-loopback": Page("", status=302, headers=(("Location", site.url("/")),)),
    }
    nav = {"navigation": True, "resource_type": "document"}
    route, outcome, _ = await _serve(FakeRequest(f"http://shop.test:{site.port}/login", **nav))  # type: ignore[arg-type]
    target = f"http://shop.test:{site.port}/home?x=%3C1%3E"
    assert outcome.disposition == "redirected" and outcome.location == target
    assert route.fulfilled is not None and route.fulfilled["status"] == 200
    headers = route.fulfilled["headers"]
    assert isinstance(headers, dict)
    assert headers["refresh"] == f"0;url={target}" and headers["set-cookie"] == "sid=9"
    assert "location" not in headers
    body = route.fulfilled["body"]
    assert isinstance(body, str) and 'http-equiv="refresh"' in body
    # A navigation redirected to a refused address is refused before the page is served.
    route, outcome, _ = await _serve(
        FakeRequest(f"http://shop.test:{site.port}/to-loopback", **nav)  # type: ignore[arg-type]
    )
    assert route.aborted == "blockedbyclient" and route.fulfilled is None
    assert "redirect from" in (outcome.detail or "")
    assert [r.path for r in site.received] == ["/login", "/to-loopback"]


async def test_a_307_post_navigation_keeps_method_and_body(site: Site) -> None:
    def echo(r: Received) -> Page:
        return Page(f"{r.method} {r.body.decode()}")

    site.pages = {"/old": Page("", status=307, headers=(("Location", "/new"),)), "/new": echo}
    route, outcome, _ = await _serve(
        FakeRequest(
            f"http://shop.test:{site.port}/old",
            method="POST",
            post_data_buffer=b"q=1",
            navigation=True,
            resource_type="document",
        )
    )
    assert outcome.disposition == "fulfilled"
    assert route.fulfilled is not None and route.fulfilled["body"] == b"POST q=1"


async def test_size_caps_and_timeouts(site: Site) -> None:
    site.pages = {"/big": Page(b"x" * 5000, content_type="text/plain"), "/slow": Page("", delay=3)}
    route, outcome, _ = await _serve(
        FakeRequest(f"http://shop.test:{site.port}/big"), max_body_bytes=1000
    )
    assert route.aborted == "failed" and "max_body_bytes" in (outcome.detail or "")
    doc = FakeRequest(
        f"http://shop.test:{site.port}/big", resource_type="document", navigation=True
    )
    route, outcome, _ = await _serve(doc, max_body_bytes=1000)
    assert route.fulfilled is not None and route.fulfilled["body"] == b"x" * 1000
    route, outcome, _ = await _serve(
        FakeRequest(f"http://shop.test:{site.port}/slow"), fetch_timeout=0.5
    )
    assert route.aborted == "timedout" and "longer than 0.5 seconds" in (outcome.detail or "")


async def test_local_schemes_continue_and_others_are_refused() -> None:
    route, outcome, _ = await _serve(FakeRequest("data:text/plain,hi"))
    assert route.continued and outcome.disposition == "fulfilled"
    route, outcome, _ = await _serve(FakeRequest("file:///etc/passwd"))
    assert route.aborted == "blockedbyclient" and "scheme 'file'" in (outcome.detail or "")
