"""The web tools: ``web_search`` and ``web_extract`` (toolset ``web``), natively async over httpx.

Settings come from ``runtime.web``, else :meth:`WebSettings.from_env`. Direct fetches pass the
SSRF guard (:mod:`hermes_async.tools._ssrf`). A call's pages share a task group and the
``web`` limiter; every request has a deadline. Keys go only in request headers and are
redacted from every error and log line.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx

from hermes_async._exports import fixup_module_metadata
from hermes_async._net import default_ssl_context, redact_urls
from hermes_async.errors import ConfigError, ToolExecutionError
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.limits import NamedLimiter
from hermes_async.tools._html import cut_head_tail, html_to_text, is_html, is_text
from hermes_async.tools._ssrf import Allowlist, WebFetchError, parse_url, vet_url
from hermes_async.tools._web_fetch import NonClosingTransport, aclose_client, fetch_page
from hermes_async.tools._web_providers import (
    PageResult,
    ProviderError,
    extract_batch,
    redact,
    scrape_one,
    search,
)
from hermes_async.tools._web_settings import (
    PROVIDER_KEY_ENV,
    PROVIDER_ORDER,
    SummarizerSettings,
    WebSettings,
)
from hermes_async.tools.registry import Tool, ToolRuntime

__all__ = (
    "TOOLS",
    "WEB_EXTRACT_TOOL",
    "WEB_LIMITER_NAME",
    "WEB_SEARCH_TOOL",
    "SummarizerSettings",
    "WebSettings",
    "web_extract",
    "web_search",
)

logger = logging.getLogger(__name__)

#: URLs read per ``web_extract`` call (the reference's schema ``maxItems`` and handler slice).
_MAX_EXTRACT_URLS = 5
#: Name of the shared limiter the tools use when ``runtime.limits`` defines it.
WEB_LIMITER_NAME = "web"
#: HTML longer than this is converted in a worker thread instead of on the event loop (measured
#: with trafilatura on the 2-core dev machine: ~30 ms for 580 KB, ~150 ms for 2.3 MB of HTML).
_THREAD_CONVERT_CHARS = 256_000

#: Name of the limiter bounding HTML-conversion worker threads (the only threads web tools use).
CONVERT_LIMITER_NAME = "html_convert"
#: Its default size: conversions are CPU-bound, more threads than cores only queue in the GIL.
DEFAULT_CONVERT_THREADS = 2
_META_CHARSET = re.compile(rb"""<meta[^>]+charset=["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)

WEB_SEARCH_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "The search query to look up on the web"}
    },
    "required": ["query"],
}

WEB_EXTRACT_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "urls": {
            "type": "array",
            "items": {"type": "string"},
            "description": f"List of URLs to extract content from (max {_MAX_EXTRACT_URLS} URLs "
            "per call)",
            "maxItems": _MAX_EXTRACT_URLS,
        }
    },
    "required": ["urls"],
}


def _settings(runtime: ToolRuntime) -> WebSettings:
    return runtime.web if runtime.web is not None else WebSettings.from_env()


def _no_provider_message() -> str:
    keys = ", ".join(PROVIDER_KEY_ENV[p] for p in PROVIDER_ORDER)
    return f"no web provider is configured; set one of {keys} (or FIRECRAWL_API_URL)"


@asynccontextmanager
async def _client(settings: WebSettings) -> AsyncIterator[httpx.AsyncClient]:
    """One client per tool call for providers and the summarizer, closed shielded and bounded."""
    injected = settings.transport is not None
    client = httpx.AsyncClient(
        transport=NonClosingTransport(settings.transport) if settings.transport else None,
        timeout=httpx.Timeout(settings.request_timeout),
        trust_env=settings.trust_env and not injected,
        verify=default_ssl_context(),
    )
    try:
        yield client
    finally:
        await aclose_client(client, "close a web-tool client")


def _limiter(runtime: ToolRuntime, settings: WebSettings) -> NamedLimiter | anyio.CapacityLimiter:
    try:
        return runtime.limits[WEB_LIMITER_NAME]
    except KeyError:
        return anyio.CapacityLimiter(settings.max_concurrent_fetches)


def _convert_limiter(runtime: ToolRuntime) -> anyio.CapacityLimiter:
    """Worker threads for converting large HTML pages (over 256 000 characters): CPU-bound.

    The environment's ``html_convert`` limiter, else one with :data:`DEFAULT_CONVERT_THREADS`.
    """
    try:
        return runtime.limits[CONVERT_LIMITER_NAME].capacity_limiter
    except KeyError:
        return runtime.limits.add(CONVERT_LIMITER_NAME, DEFAULT_CONVERT_THREADS).capacity_limiter


# --------------------------------------------------------------------------------------------
# web_search


async def web_search(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    """Search the web with the configured provider (the ``web_search`` handler).

    Returns:
        ``{"success": true, "data": {"web": [{"title", "url", "description", "position"}]}}``,
        or ``{"error": "Error searching web: ..."}``.

    **Cancellation**: the provider request is abandoned, the client closed (shielded, bounded),
    and the cancellation propagates.
    """
    try:
        settings = _settings(runtime)
    except ConfigError as exc:
        return {"error": f"Error searching web: {exc.message}"}
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return {"error": "Error searching web: 'query' must be a non-empty string"}
    provider = settings.provider()
    if provider is None:
        return {"error": f"Error searching web: {_no_provider_message()}"}
    if not settings.is_configured(provider):
        return {
            "error": f"Error searching web: web backend {provider!r} is selected but "
            f"{PROVIDER_KEY_ENV[provider]} is not set"
        }
    async with _client(settings) as client:
        try:
            results = await search(client, settings, provider, query.strip(), settings.search_limit)
        except ProviderError as exc:
            logger.warning("web_search via %s failed: %s", provider, exc.message)
            return {"error": f"Error searching web: {exc.message}"}
    return {"success": True, "data": {"web": results}}


# --------------------------------------------------------------------------------------------
# web_extract


def _decode(body: bytes, charset: str | None, html: bool) -> str:
    encoding = charset
    if encoding is None and html:
        match = _META_CHARSET.search(body[:4096])
        if match is not None:
            encoding = match.group(1).decode("ascii", "replace")
    try:
        return body.decode(encoding or "utf-8", errors="replace")
    except (LookupError, UnicodeError):  # unknown, or not a text codec ("rot13", "idna")
        return body.decode("utf-8", errors="replace")


async def _direct_page(
    url: str, settings: WebSettings, allow: Allowlist, threads: anyio.CapacityLimiter
) -> PageResult:
    page = await fetch_page(url, settings, allow=allow)
    media_type = page.media_type
    looks_html = not media_type and page.body.lstrip()[:15].lower().startswith(
        (b"<!doctype", b"<html")
    )
    if is_html(media_type) or looks_html:
        text = _decode(page.body, page.charset, html=True)
        convert = functools.partial(
            html_to_text, text, url=page.url, extractor=settings.html_extractor
        )
        if len(text) > _THREAD_CONVERT_CHARS:
            title, content = await anyio.to_thread.run_sync(convert, limiter=threads)
        else:
            title, content = convert()
    elif is_text(media_type) or (not media_type and b"\x00" not in page.body[:1024]):
        title, content = None, _decode(page.body, page.charset, html=False)
    else:
        shown = media_type or "binary data without a content type"
        return PageResult(
            url,
            error=f"unsupported content type {shown!r} at {page.url!r}: web_extract reads "
            "HTML and text pages only",
        )
    if page.truncated:
        content += (
            f"\n\n[page truncated: only the first {settings.max_body_bytes:,} bytes were "
            "downloaded (max_body_bytes)]"
        )
    return PageResult(url, title, content)


async def _summarize(
    client: httpx.AsyncClient, summarizer: SummarizerSettings, page: PageResult, content: str
) -> str:
    text, _ = cut_head_tail(content, summarizer.max_input_chars)
    prompt = (
        "Summarize the following web page for an AI agent that is working on a task. Keep every "
        "concrete fact, number, name, date, code snippet and instruction; drop navigation and "
        f"boilerplate. Answer in at most {summarizer.max_output_chars} characters.\n\n"
        f"URL: {page.url}\nTitle: {page.title or '(none)'}\n\n{text}"
    )
    headers = {"Authorization": f"Bearer {summarizer.api_key}"} if summarizer.api_key else {}
    with anyio.fail_after(summarizer.timeout):
        response = await client.post(
            summarizer.base_url.rstrip("/") + "/chat/completions",
            json={
                "model": summarizer.model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0.2,
                "max_tokens": max(256, summarizer.max_output_chars // 3),
            },
            headers=headers,
        )
    response.raise_for_status()
    data: JSON = response.json()
    summary = data["choices"][0]["message"]["content"]
    if not isinstance(summary, str) or not summary.strip():
        raise ValueError("the summarizer returned an empty message")
    summary = summary.strip()[: summarizer.max_output_chars]
    return f"[Summary of a {len(content):,}-character page]\n\n{summary}"


async def _finish(page: PageResult, settings: WebSettings, client: httpx.AsyncClient) -> PageResult:
    """Summarize or cut a page's content to the configured size."""
    content = page.content
    if content is None:
        return page
    summarizer = settings.summarizer
    if summarizer is not None and len(content) >= summarizer.min_chars:
        try:
            summary = await _summarize(client, summarizer, page, content)
        except (TimeoutError, httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            detail = redact(redact_urls(f"{type(exc).__name__}: {exc}"), settings.secrets())
            logger.warning(
                "web_extract: summarizer failed for %s (%s); cutting instead", page.url, detail
            )
        else:
            return PageResult(page.url, page.title, summary, page.error)
    cut, _ = cut_head_tail(content, settings.max_content_chars)
    return PageResult(page.url, page.title, cut, page.error)


def _error(url: str, exc: Exception, settings: WebSettings) -> PageResult:
    message = exc.message if isinstance(exc, ToolExecutionError | ConfigError) else str(exc)
    return PageResult(url, error=redact(message, settings.secrets()))


async def web_extract(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    """Read up to 5 pages concurrently, through the provider or directly (``web_extract``).

    Long content is cut (head + tail) or summarized.

    Returns:
        ``{"results": [{"url", "title", "content", "error"}, ...]}`` in the order of ``urls``;
        ``{"error": "Error extracting content: ..."}`` when nothing can be attempted.

    **Cancellation**: every page task is cancelled, responses and clients closed (shielded,
    bounded). A page already in a worker thread finishes converting first (~0.2 s at most).
    """
    try:
        settings = _settings(runtime)
    except ConfigError as exc:
        return {"error": f"Error extracting content: {exc.message}"}
    raw_urls = args.get("urls")
    if isinstance(raw_urls, str):
        raw_urls = [raw_urls]
    if not isinstance(raw_urls, list) or not raw_urls:
        return {"error": "Error extracting content: 'urls' must be a non-empty list of URLs"}
    urls = [str(u).strip() for u in raw_urls[:_MAX_EXTRACT_URLS]]
    provider = settings.extract_provider()
    if provider is not None and not settings.is_configured(provider):
        return {
            "error": f"Error extracting content: web backend {provider!r} is selected but "
            f"{PROVIDER_KEY_ENV[provider]} is not set"
        }
    allow = Allowlist.from_entries(settings.allow)
    limiter = _limiter(runtime, settings)
    threads = _convert_limiter(runtime)
    pages: list[PageResult] = [PageResult(u, error="not attempted") for u in urls]

    async with _client(settings) as client:

        async def direct(index: int) -> None:
            async with limiter:
                try:
                    page = await _direct_page(urls[index], settings, allow, threads)
                except (ToolExecutionError, ConfigError) as exc:
                    pages[index] = _error(urls[index], exc, settings)
                    return
                pages[index] = await _finish(page, settings, client)

        async def vet(index: int) -> None:
            try:
                await vet_url(parse_url(urls[index]), allow=allow, resolver=settings.resolver)
            except WebFetchError as exc:
                pages[index] = _error(urls[index], exc, settings)
            else:
                pages[index] = PageResult(urls[index])

        async def scrape(index: int) -> None:
            async with limiter:
                try:
                    page = await scrape_one(client, settings, urls[index])
                except ProviderError as exc:
                    pages[index] = _error(urls[index], exc, settings)
                    return
                pages[index] = await _finish(page, settings, client)

        async def finish(index: int) -> None:
            async with limiter:
                pages[index] = await _finish(pages[index], settings, client)

        if provider is None:
            async with anyio.create_task_group() as tg:
                for i in range(len(urls)):
                    tg.start_soon(direct, i)
            return {"results": [p.to_json() for p in pages]}

        # Through a provider: the provider fetches, but a URL naming an internal address is
        # still refused here (a self-hosted provider could otherwise reach the private network).
        async with anyio.create_task_group() as tg:
            for i in range(len(urls)):
                tg.start_soon(vet, i)
        ok = [i for i, p in enumerate(pages) if p.error is None]
        if provider == "firecrawl":
            async with anyio.create_task_group() as tg:
                for i in ok:
                    tg.start_soon(scrape, i)
        elif ok:
            try:
                batch = await extract_batch(client, settings, provider, [urls[i] for i in ok])
            except ProviderError as exc:
                logger.warning("web_extract via %s failed: %s", provider, exc.message)
                return {"error": f"Error extracting content: {exc.message}"}
            for i, page in zip(ok, batch, strict=True):
                pages[i] = page
            async with anyio.create_task_group() as tg:
                for i in ok:
                    tg.start_soon(finish, i)
    return {"results": [p.to_json() for p in pages]}


# --------------------------------------------------------------------------------------------
# Registration


def _env_settings() -> WebSettings | None:
    try:
        return WebSettings.from_env()
    except ConfigError as exc:
        logger.warning("web tools not offered: %s", exc.message)
        return None


def _search_available() -> bool:
    settings = _env_settings()
    return settings is not None and settings.search_available()


def _extract_available() -> bool:
    settings = _env_settings()
    return settings is not None and settings.extract_available()


WEB_SEARCH_TOOL = Tool(
    name="web_search",
    description=(
        "Search the web for information on any topic. Returns up to 5 results, each with a "
        "title, URL and short description. Use web_extract to read a result in full."
    ),
    parameters=WEB_SEARCH_PARAMETERS,
    handler=web_search,
    toolset="web",
    available=_search_available,
)

WEB_EXTRACT_TOOL = Tool(
    name="web_extract",
    description=(
        f"Extract the readable content (Markdown) of up to {_MAX_EXTRACT_URLS} web pages, fetched "
        "in parallel. Long pages are shortened. Returns one result per URL with its title, "
        "content, and an error if the page could not be read."
    ),
    parameters=WEB_EXTRACT_PARAMETERS,
    handler=web_extract,
    toolset="web",
    available=_extract_available,
)

#: The tools this module registers in the built-in registry.
TOOLS: tuple[Tool, ...] = (WEB_SEARCH_TOOL, WEB_EXTRACT_TOOL)


fixup_module_metadata(__name__, globals())
