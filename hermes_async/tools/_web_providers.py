"""HTTP adapters for the search/extract providers: Firecrawl, Tavily and Exa.

Each turns one provider's shapes into the tools' shapes and decides no policy. A provider-wide
failure raises :class:`ProviderError`, secrets redacted; a per-URL failure is a
:class:`PageResult` error. Wire shapes: docs/architecture.md, "Web providers' wire shapes".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anyio
import httpx

from hermes_async._net import redact_url, redact_urls
from hermes_async.errors import ToolExecutionError
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.tools._web_settings import PROVIDER_KEY_ENV, Provider, WebSettings

__all__ = ("PageResult", "ProviderError", "extract_batch", "redact", "scrape_one", "search")

#: Characters of page text Exa is asked for per search hit (it becomes the description).
_EXA_SEARCH_TEXT_CHARS = 500
#: Characters of a provider's error body quoted in an error message.
_ERROR_DETAIL_CHARS = 300
_REDACTED = "[REDACTED]"


class ProviderError(ToolExecutionError):
    """A provider request failed as a whole.

    Args:
        provider: ``firecrawl``, ``tavily`` or ``exa``.
        message: What went wrong (already redacted).
        status: The HTTP status, when the provider answered.
    """

    def __init__(self, provider: Provider, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status


@dataclass(frozen=True, slots=True)
class PageResult:
    """One ``web_extract`` result (the reference's ``{"url", "title", "content", "error"}``)."""

    url: str
    title: str | None = None
    content: str | None = None
    error: str | None = None

    def to_json(self) -> JSONObject:
        """The result object shown to the model."""
        return {"url": self.url, "title": self.title, "content": self.content, "error": self.error}


def redact(text: str, secrets: Sequence[str]) -> str:
    """Replace every occurrence of each secret in ``text`` by ``[REDACTED]``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, _REDACTED)
    return text


def _headers(provider: Provider, settings: WebSettings) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    key = settings.api_key(provider)
    if key:
        if provider == "exa":
            headers["x-api-key"] = key
        else:
            headers["Authorization"] = f"Bearer {key}"
    return headers


def _error_detail(response: httpx.Response) -> str:
    try:
        body: JSON = response.json()
    except ValueError:
        text = response.text.strip()
        return " ".join(text.split())[:_ERROR_DETAIL_CHARS] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("error", "message", "detail"):
            value = body.get(key)
            if isinstance(value, dict):
                value = value.get("message") or value.get("error") or json.dumps(value)
            if value:
                return str(value)[:_ERROR_DETAIL_CHARS]
    return json.dumps(body)[:_ERROR_DETAIL_CHARS]


async def _post(
    client: httpx.AsyncClient,
    provider: Provider,
    settings: WebSettings,
    path: str,
    payload: JSONObject,
) -> JSONObject:
    """POST ``payload`` to the provider and return its JSON object, or raise ProviderError."""
    secrets = settings.secrets()
    url = settings.base_url(provider) + path
    shown = redact_url(url)
    timeout = settings.request_timeout
    try:
        with anyio.fail_after(timeout):
            response = await client.post(url, json=payload, headers=_headers(provider, settings))
    except TimeoutError:
        raise ProviderError(
            provider, f"{provider} did not answer {shown} within {timeout:g} seconds"
        ) from None
    except httpx.HTTPError as exc:
        detail = redact_urls(f"{type(exc).__name__}: {exc}")
        message = f"could not reach {provider} at {shown}: {detail}"
        raise ProviderError(provider, redact(message, secrets)) from None
    status = response.status_code
    if status >= 400:
        detail = redact(_error_detail(response), secrets)
        message = f"{provider} answered HTTP {status} for {path}: {detail}"
        if status in (401, 403):
            message += f" (check {PROVIDER_KEY_ENV[provider]})"
        elif status == 429:
            message += " (rate limited; retry later)"
        raise ProviderError(provider, message, status=status)
    try:
        data: JSON = response.json()
    except ValueError:
        raise ProviderError(
            provider, f"{provider} answered {path} with a body that is not JSON", status=status
        ) from None
    if not isinstance(data, dict):
        raise ProviderError(
            provider, f"{provider} answered {path} with JSON that is not an object", status=status
        )
    if data.get("success") is False:
        detail = redact(str(data.get("error") or "no reason given"), secrets)
        raise ProviderError(provider, f"{provider} reported failure for {path}: {detail}")
    return data


def _str(value: JSON) -> str:
    return value if isinstance(value, str) else ""


def _dicts(value: JSON) -> list[JSONObject]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


async def search(
    client: httpx.AsyncClient,
    settings: WebSettings,
    provider: Provider,
    query: str,
    limit: int,
) -> list[JSONObject]:
    """Search with ``provider``: ``[{"title", "url", "description", "position"}]``.

    Raises:
        ProviderError: The provider failed as a whole.

    **Cancellation**: safe to cancel; the request is abandoned and the connection dropped.
    """
    items: list[JSONObject]
    if provider == "firecrawl":
        data = await _post(
            client, provider, settings, "/v2/search", {"query": query, "limit": limit}
        )
        payload = data.get("data")
        items = _dicts(payload.get("web") if isinstance(payload, dict) else payload)
        descriptions = [_str(i.get("description")) or _str(i.get("snippet")) for i in items]
    elif provider == "tavily":
        data = await _post(
            client,
            provider,
            settings,
            "/search",
            {"query": query, "max_results": limit, "search_depth": "basic"},
        )
        items = _dicts(data.get("results"))
        descriptions = [_str(i.get("content")) for i in items]
    else:
        data = await _post(
            client,
            provider,
            settings,
            "/search",
            {
                "query": query,
                "numResults": limit,
                "type": "auto",
                "contents": {"text": {"maxCharacters": _EXA_SEARCH_TEXT_CHARS}},
            },
        )
        items = _dicts(data.get("results"))
        descriptions = []
        for item in items:
            highlights = item.get("highlights")
            if isinstance(highlights, list) and highlights:
                descriptions.append(" ".join(str(h) for h in highlights))
            else:
                descriptions.append(_str(item.get("summary")) or _str(item.get("text")))
    results: list[JSONObject] = []
    for index, (item, description) in enumerate(zip(items[:limit], descriptions, strict=False)):
        position = item.get("position")
        results.append(
            {
                "title": _str(item.get("title")),
                "url": _str(item.get("url")),
                "description": description,
                "position": position if isinstance(position, int) else index + 1,
            }
        )
    return results


async def scrape_one(client: httpx.AsyncClient, settings: WebSettings, url: str) -> PageResult:
    """Extract one page as Markdown through Firecrawl's scrape endpoint.

    Raises:
        ProviderError: Firecrawl failed as a whole for this request.

    **Cancellation**: safe to cancel; the request is abandoned.
    """
    data = await _post(
        client,
        "firecrawl",
        settings,
        "/v2/scrape",
        {"url": url, "formats": ["markdown"], "onlyMainContent": True},
    )
    doc = data.get("data")
    if not isinstance(doc, dict):
        return PageResult(url, error="firecrawl returned no document for this URL")
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    assert isinstance(metadata, dict)
    title = _str(metadata.get("title")) or None
    status = metadata.get("statusCode")
    if metadata.get("error"):
        return PageResult(url, title, error=f"firecrawl could not scrape it: {metadata['error']}")
    if isinstance(status, int) and status >= 400:
        return PageResult(url, title, error=f"the page answered HTTP {status}")
    markdown = doc.get("markdown")
    if not isinstance(markdown, str):
        return PageResult(url, title, error="firecrawl returned no markdown for this URL")
    return PageResult(url, title, markdown)


def _key(url: str) -> str:
    return url.strip().rstrip("/").lower()


def _by_url(items: Sequence[JSONObject], *fields: str) -> dict[str, JSONObject]:
    table: dict[str, JSONObject] = {}
    for item in items:
        for name in fields:
            value = item.get(name)
            if isinstance(value, str) and value:
                table.setdefault(_key(value), item)
    return table


async def extract_batch(
    client: httpx.AsyncClient,
    settings: WebSettings,
    provider: Provider,
    urls: Sequence[str],
) -> list[PageResult]:
    """Extract ``urls`` with one Tavily or Exa request; one :class:`PageResult` per URL, in order.

    Raises:
        ProviderError: The provider failed as a whole.

    **Cancellation**: safe to cancel; the request is abandoned.
    """
    results: list[PageResult] = []
    if provider == "tavily":
        data = await _post(
            client,
            provider,
            settings,
            "/extract",
            {"urls": list(urls), "extract_depth": "basic", "format": "markdown"},
        )
        found = _by_url(_dicts(data.get("results")), "url")
        failed = _by_url(_dicts(data.get("failed_results")), "url")
        for url in urls:
            if (item := found.get(_key(url))) is not None:
                content = item.get("raw_content")
                if isinstance(content, str):
                    results.append(PageResult(url, _str(item.get("title")) or None, content))
                    continue
            reason = failed.get(_key(url), {}).get("error") or "no content returned"
            results.append(PageResult(url, error=f"tavily could not extract it: {reason}"))
        return results
    if provider == "exa":
        data = await _post(
            client, provider, settings, "/contents", {"urls": list(urls), "text": True}
        )
        found = _by_url(_dicts(data.get("results")), "url", "id")
        statuses = _by_url(_dicts(data.get("statuses")), "id")
        for url in urls:
            status = statuses.get(_key(url), {})
            if status.get("status") == "error":
                error = status.get("error")
                detail: Mapping[str, JSON] = error if isinstance(error, dict) else {}
                tag = detail.get("tag") or "unknown error"
                code = detail.get("httpStatusCode")
                suffix = f" (HTTP {code})" if code else ""
                results.append(PageResult(url, error=f"exa could not fetch it: {tag}{suffix}"))
                continue
            item = found.get(_key(url))
            if item is not None and isinstance(item.get("text"), str):
                results.append(PageResult(url, _str(item.get("title")) or None, item["text"]))
            else:
                results.append(PageResult(url, error="exa returned no content for this URL"))
        return results
    raise ValueError(f"extract_batch does not handle provider {provider!r}")
