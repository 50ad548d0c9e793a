"""Provider adapters (Firecrawl, Tavily, Exa) against a fake provider on loopback.

Each adapter is checked for its request shape (path, auth header, body), its result mapping,
and its 4xx / 5xx / timeout / unreachable paths, with the API key never showing in a result or
a log line. The transport refuses any non-loopback destination.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from hermes_async.testing.fake_web import FakeResolver, FakeWebProvider, LoopbackOnlyTransport
from hermes_async.testing.http import open_loopback_server
from hermes_async.tools._web_settings import WebSettings
from hermes_async.tools.registry import ToolRegistry, ToolRuntime, dispatch
from hermes_async.tools.web import TOOLS, web_extract, web_search

pytestmark = pytest.mark.anyio

KEYS = {
    "firecrawl": "fc-SECRET-1234567890",
    "tavily": "tvly-SECRET-abcdef",
    "exa": "exa-SECRET-zyxwvu",
}
PROVIDERS = ["firecrawl", "tavily", "exa"]
PUBLIC = {"docs.example": ["93.184.216.34"], "blog.example": ["93.184.216.35"]}


def settings_for(
    provider: str, base_url: str, transport: LoopbackOnlyTransport, **kw: Any
) -> WebSettings:
    values: dict[str, Any] = {
        f"{provider}_api_key": KEYS[provider],
        f"{provider}_url": base_url,
        "transport": transport,
        "resolver": FakeResolver(PUBLIC),
    }
    values.update(kw)
    return WebSettings(**values)


@asynccontextmanager
async def fake(
    provider: str, **kw: Any
) -> AsyncIterator[tuple[FakeWebProvider, str, LoopbackOnlyTransport]]:
    app = FakeWebProvider(provider, **kw)  # type: ignore[arg-type]
    transport = LoopbackOnlyTransport()
    async with open_loopback_server(app) as base_url:
        try:
            yield app, base_url, transport
        finally:
            await transport.aclose()
    transport.assert_no_violations()


def runtime(web: WebSettings) -> ToolRuntime:
    return ToolRuntime(task_id="t", web=web)


def auth_ok(provider: str, headers: dict[str, str]) -> bool:
    if provider == "exa":
        return headers.get("x-api-key") == KEYS["exa"] and "authorization" not in headers
    return headers.get("authorization") == f"Bearer {KEYS[provider]}"


EXPECTED_SEARCH = {
    "firecrawl": ("/v2/search", {"query": "anyio trio", "limit": 5}),
    "tavily": ("/search", {"query": "anyio trio", "max_results": 5, "search_depth": "basic"}),
    "exa": (
        "/search",
        {
            "query": "anyio trio",
            "numResults": 5,
            "type": "auto",
            "contents": {"text": {"maxCharacters": 500}},
        },
    ),
}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_search_request_shape_and_result_mapping(provider: str) -> None:
    async with fake(provider) as (app, base, transport):
        result = await web_search(
            {"query": "  anyio trio "}, runtime(settings_for(provider, base, transport))
        )
    assert result == {
        "success": True,
        "data": {
            "web": [
                {
                    "title": "Result one",
                    "url": "https://one.example/",
                    "description": "First description",
                    "position": 1,
                },
                {
                    "title": "Result two",
                    "url": "https://two.example/",
                    "description": "Second description",
                    "position": 2,
                },
            ]
        },
    }
    [request] = app.requests
    path, body = EXPECTED_SEARCH[provider]
    assert (request.method, request.path, request.json) == ("POST", path, body)
    assert auth_ok(provider, dict(request.headers))


async def test_search_is_limited_to_five_results() -> None:
    hits = [(f"T{i}", f"https://r{i}.example/", f"d{i}") for i in range(8)]
    async with fake("exa", results=hits) as (_app, base, transport):
        result = await web_search({"query": "q"}, runtime(settings_for("exa", base, transport)))
    assert [r["position"] for r in result["data"]["web"]] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_401_error_names_the_key_variable_and_never_the_key(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"error": f"Invalid API key: {KEYS[provider]}"}  # a provider echoing the key back
    async with fake(provider, status=401, error_body=body) as (_app, base, transport):
        web = settings_for(provider, base, transport)
        searched = await web_search({"query": "q"}, runtime(web))
        extracted = await web_extract({"urls": ["https://docs.example/a"]}, runtime(web))
    env = {"firecrawl": "FIRECRAWL_API_KEY", "tavily": "TAVILY_API_KEY", "exa": "EXA_API_KEY"}[
        provider
    ]
    assert searched["error"].startswith(f"Error searching web: {provider} answered HTTP 401")
    assert f"check {env}" in searched["error"]
    assert "Invalid API key: [REDACTED]" in searched["error"]
    everything = json.dumps(searched) + json.dumps(extracted) + caplog.text
    assert KEYS[provider] not in everything
    assert "HTTP 401" in json.dumps(extracted)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_5xx_is_an_error_result(provider: str) -> None:
    async with fake(provider, status=503, error_body={"message": "upstream overloaded"}) as (
        _a,
        base,
        transport,
    ):
        result = await web_search({"query": "q"}, runtime(settings_for(provider, base, transport)))
    assert result == {
        "error": f"Error searching web: {provider} answered HTTP 503 for {EXPECTED_SEARCH[provider][0]}: upstream overloaded"
    }


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_timeout_is_an_error_result(provider: str) -> None:
    async with fake(provider, hang=True) as (app, base, transport):
        web = settings_for(provider, base, transport, request_timeout=0.3)
        result = await web_search({"query": "q"}, runtime(web))
    assert result["error"].startswith(f"Error searching web: {provider} did not answer")
    assert "within 0.3 seconds" in result["error"]
    assert len(app.requests) == 1


async def test_unreachable_provider_is_an_error_result() -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    transport = LoopbackOnlyTransport()
    web = settings_for("tavily", f"http://127.0.0.1:{port}", transport)
    result = await web_search({"query": "q"}, runtime(web))
    await transport.aclose()
    assert result["error"].startswith(
        f"Error searching web: could not reach tavily at http://127.0.0.1:{port}/search"
    )
    assert KEYS["tavily"] not in result["error"]


async def test_a_password_in_a_provider_url_never_shows_in_the_error() -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    transport = LoopbackOnlyTransport()
    web = settings_for("firecrawl", f"http://admin:pw-SECRET-42@127.0.0.1:{port}", transport)
    result = await web_search({"query": "q"}, runtime(web))
    await transport.aclose()
    assert result["error"].startswith(
        f"Error searching web: could not reach firecrawl at http://[REDACTED]@127.0.0.1:{port}/"
    )
    assert "pw-SECRET-42" not in result["error"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_extract_request_shape_and_mapping(provider: str) -> None:
    pages = {"https://docs.example/a": ("Doc A", "# A\n\nalpha text")}
    async with fake(provider, pages=pages) as (app, base, transport):
        result = await web_extract(
            {"urls": ["https://docs.example/a", "https://blog.example/missing"]},
            runtime(settings_for(provider, base, transport)),
        )
    first, second = result["results"]
    expected_title = None if provider == "tavily" else "Doc A"  # Tavily's extract has no title
    assert first == {
        "url": "https://docs.example/a",
        "title": expected_title,
        "content": "# A\n\nalpha text",
        "error": None,
    }
    assert second["url"] == "https://blog.example/missing"
    assert second["content"] is None and second["error"]
    assert all(auth_ok(provider, dict(r.headers)) for r in app.requests)
    if provider == "firecrawl":
        assert second["error"] == "the page answered HTTP 404"
        assert sorted((r.path, r.json["url"]) for r in app.requests) == [
            ("/v2/scrape", "https://blog.example/missing"),
            ("/v2/scrape", "https://docs.example/a"),
        ]
        assert app.requests[0].json["formats"] == ["markdown"]
    elif provider == "tavily":
        assert second["error"] == "tavily could not extract it: Failed to fetch url"
        [request] = app.requests
        assert request.path == "/extract"
        assert request.json["urls"] == ["https://docs.example/a", "https://blog.example/missing"]
    else:
        assert second["error"] == "exa could not fetch it: CRAWL_NOT_FOUND (HTTP 404)"
        [request] = app.requests
        assert (request.path, request.json) == (
            "/contents",
            {"urls": ["https://docs.example/a", "https://blog.example/missing"], "text": True},
        )


@pytest.mark.parametrize("provider", ["tavily", "exa"])
async def test_batch_extract_failure_is_a_call_error(provider: str) -> None:
    async with fake(provider, status=500, error_body={"error": "boom"}) as (_a, base, transport):
        result = await web_extract(
            {"urls": ["https://docs.example/a"]}, runtime(settings_for(provider, base, transport))
        )
    assert result["error"].startswith(f"Error extracting content: {provider} answered HTTP 500")


async def test_provider_content_is_cut_to_max_content_chars() -> None:
    pages = {"https://docs.example/long": ("Long", "x" * 10_000)}
    async with fake("firecrawl", pages=pages) as (_a, base, transport):
        web = settings_for("firecrawl", base, transport, max_content_chars=1000)
        result = await web_extract({"urls": ["https://docs.example/long"]}, runtime(web))
    content = result["results"][0]["content"]
    assert "9,000 characters omitted" in content
    assert len(content) < 1200


async def test_tools_dispatch_by_name() -> None:
    async with fake("tavily") as (_a, base, transport):
        outcome = await dispatch(
            "web_search",
            {"query": "q"},
            runtime(settings_for("tavily", base, transport)),
            registry=ToolRegistry(TOOLS),
        )
    assert outcome.error is None
    assert json.loads(outcome.content)["success"] is True


# --------------------------------------------------------------------------------------------
# Provider selection


async def test_first_configured_provider_wins_in_reference_order() -> None:
    async with fake("tavily") as (tavily, tavily_url, transport), fake("exa") as (exa, exa_url, _t):
        web = WebSettings(
            tavily_api_key=KEYS["tavily"],
            tavily_url=tavily_url,
            exa_api_key=KEYS["exa"],
            exa_url=exa_url,
            transport=transport,
        )
        await web_search({"query": "q"}, runtime(web))
        assert len(tavily.requests) == 1 and exa.requests == []
        forced = WebSettings(
            backend="exa",
            tavily_api_key=KEYS["tavily"],
            tavily_url=tavily_url,
            exa_api_key=KEYS["exa"],
            exa_url=exa_url,
            transport=transport,
        )
        await web_search({"query": "q"}, runtime(forced))
        assert len(exa.requests) == 1


async def test_self_hosted_firecrawl_needs_no_key() -> None:
    async with fake("firecrawl") as (app, base, transport):
        web = WebSettings(firecrawl_url=base, transport=transport)
        result = await web_search({"query": "q"}, runtime(web))
    assert result["success"] is True
    assert "authorization" not in app.requests[0].headers


async def test_no_provider_and_missing_key_errors() -> None:
    none = await web_search({"query": "q"}, runtime(WebSettings()))
    assert none == {
        "error": "Error searching web: no web provider is configured; set one of FIRECRAWL_API_KEY, "
        "TAVILY_API_KEY, EXA_API_KEY (or FIRECRAWL_API_URL)"
    }
    missing = await web_search({"query": "q"}, runtime(WebSettings(backend="tavily")))
    assert missing == {
        "error": "Error searching web: web backend 'tavily' is selected but TAVILY_API_KEY is not set"
    }
    empty = await web_search({"query": "  "}, runtime(WebSettings(tavily_api_key="k")))
    assert empty == {"error": "Error searching web: 'query' must be a non-empty string"}
