"""Every request the page makes, answered through the SSRF-guarded fetcher.

Chromium resolves nothing itself, so :func:`serve_request` is the page's only way out: it
fetches through :func:`hermes_async.tools._web_fetch.fetch` and fulfils or aborts. A
navigation's redirect becomes a ``Refresh`` page so the target is vetted as a new navigation.
Why: docs/decisions/028-browser-network.md.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import httpx

from hermes_async._cleanup import cleanup_scope
from hermes_async.tools._ssrf import Allowlist, URLRefusedError, WebFetchError, parse_url, vet_url
from hermes_async.tools._web_fetch import HopResponse, fetch
from hermes_async.tools._web_settings import WebSettings

__all__ = (
    "ROUTE_ABORT_GRACE_SECONDS",
    "RequestOutcome",
    "abort_quietly",
    "browser_headers",
    "serve_request",
    "upstream_headers",
)

logger = logging.getLogger(__name__)

#: Bound on one ``route.abort`` during cleanup (a local round trip to the driver).
ROUTE_ABORT_GRACE_SECONDS = 2.0

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "accept-encoding",
        "content-length",
    }
)
# The fetcher decodes content codings and the browser re-frames the body it is given.
_NOT_FORWARDED_BACK = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"}
)
_NO_NETWORK_SCHEMES = ("data:", "blob:", "about:")

#: What happened to one request (for statistics and for explaining a failed navigation).
Disposition = Literal["fulfilled", "redirected", "blocked", "failed"]


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What :func:`serve_request` did with one request.

    Attributes:
        disposition: ``fulfilled``, ``redirected`` (a navigation given a redirect page),
            ``blocked`` (refused by the guard) or ``failed``.
        detail: Why it was blocked or failed.
        location: The redirect target, for ``redirected``.
    """

    url: str
    disposition: Disposition
    navigation: bool
    detail: str | None = None
    location: str | None = None


def upstream_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The browser's request headers to send upstream (hop-by-hop ones dropped)."""
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}


def browser_headers(response: HopResponse) -> dict[str, str]:
    """The response headers to fulfil with: framing dropped, repeated names joined."""
    out: dict[str, str] = {}
    for name, value in response.headers:
        key = name.lower()
        if key in _NOT_FORWARDED_BACK:
            continue
        if key in out:
            out[key] += ("\n" if key == "set-cookie" else ", ") + value
        else:
            out[key] = value
    return out


async def abort_quietly(route: Any, error_code: str = "failed") -> None:
    """Abort ``route``, ignoring a route already handled or gone.

    **Cancellation**: runs shielded for at most :data:`ROUTE_ABORT_GRACE_SECONDS`.
    """
    aborted = False
    with cleanup_scope("abort an intercepted request", ROUTE_ABORT_GRACE_SECONDS, log=logger):
        try:
            await route.abort(error_code)
            aborted = True
        except Exception:  # handled already, or the page/context/browser is gone: nothing to do
            logger.debug("route.abort failed", exc_info=True)
    if not aborted:
        # Playwright's dispatch task waits until the route is handled, and an abort that failed
        # or timed out never tells it: settle it without sending the request anywhere.
        inner = getattr(route, "_impl_obj", route)  # the public Route wraps Playwright's own
        settle = getattr(inner, "_report_handled", None)
        if callable(settle) and getattr(inner, "_handling_promise", None) is not None:
            settle(True)


def _redirect_page(response: HopResponse, target: str) -> tuple[dict[str, str], str]:
    """Headers and body that make Chromium navigate to ``target`` (see the module docstring)."""
    headers = {
        k: v
        for k, v in browser_headers(response).items()
        if k not in ("location", "refresh", "content-type", "content-security-policy")
    }
    headers["refresh"] = f"0;url={target}"
    headers["content-type"] = "text/html; charset=utf-8"
    body = (
        "<!doctype html><title>Redirecting</title>"
        f'<meta http-equiv="refresh" content="0;url={html.escape(target, quote=True)}">'
    )
    return headers, body


async def serve_request(
    route: Any,
    request: Any,
    *,
    settings: WebSettings,
    allow: Allowlist,
    timeout: float,
    record: Callable[[RequestOutcome], None] | None = None,
) -> RequestOutcome:
    """Answer one intercepted request through the guarded fetcher (fulfil or abort).

    ``timeout`` bounds the whole exchange; ``record`` gets the outcome just before the route is
    handled. If this raises, the caller aborts the route.

    **Cancellation**: the upstream request is abandoned (shielded, bounded close).
    """
    url: str = request.url
    navigation = bool(request.is_navigation_request())

    def done(outcome: RequestOutcome) -> RequestOutcome:
        if record is not None:
            record(outcome)
        return outcome

    if url.startswith(_NO_NETWORK_SCHEMES):
        outcome = done(RequestOutcome(url, "fulfilled", navigation))
        await route.continue_()
        return outcome
    method: str = request.method
    body: bytes | None = request.post_data_buffer
    try:
        headers = upstream_headers(await request.all_headers())
        with anyio.fail_after(timeout):
            response = await fetch(
                method,
                url,
                headers=headers,
                content=body,
                settings=settings,
                allow=allow,
                follow_redirects=not navigation,
            )
            location = response.location
            target = None
            if navigation and location is not None:
                target = str(httpx.URL(url).join(location))
                if response.status in (307, 308) and method.upper() not in ("GET", "HEAD"):
                    # A method-preserving redirect of a form post: follow it here.
                    try:
                        response = await fetch(
                            method,
                            target,
                            headers=headers,
                            content=body,
                            settings=settings,
                            allow=allow,
                        )
                    except URLRefusedError as exc:
                        raise URLRefusedError(
                            exc.url, f"redirect from {url!r}: {exc.reason}"
                        ) from None
                    target = None
                else:
                    try:
                        await vet_url(parse_url(target), allow=allow, resolver=settings.resolver)
                    except URLRefusedError as exc:
                        raise URLRefusedError(
                            exc.url, f"redirect from {url!r}: {exc.reason}"
                        ) from None
    except URLRefusedError as exc:
        detail = f"refused {exc.url!r}: {exc.reason}"
        outcome = done(RequestOutcome(url, "blocked", navigation, detail))
        await route.abort("blockedbyclient")
        return outcome
    except TimeoutError:
        detail = f"{url!r} took longer than {timeout:g} seconds (fetch_timeout)"
        outcome = done(RequestOutcome(url, "failed", navigation, detail))
        await route.abort("timedout")
        return outcome
    except (httpx.InvalidURL, ValueError) as exc:
        detail = f"{url!r} redirected to a bad URL: {exc}"
        outcome = done(RequestOutcome(url, "failed", navigation, detail))
        await route.abort("failed")
        return outcome
    except WebFetchError as exc:
        outcome = done(RequestOutcome(url, "failed", navigation, exc.message))
        await route.abort("failed")
        return outcome
    if target is not None:
        redirect_headers, page = _redirect_page(response, target)
        outcome = done(RequestOutcome(url, "redirected", navigation, location=target))
        await route.fulfill(status=200, headers=redirect_headers, body=page)
        return outcome
    if response.truncated and request.resource_type != "document":
        detail = (
            f"{url!r} is larger than {settings.max_body_bytes:,} bytes (max_body_bytes); refused"
        )
        outcome = done(RequestOutcome(url, "failed", navigation, detail))
        await route.abort("failed")
        return outcome
    outcome = done(RequestOutcome(url, "fulfilled", navigation))
    await route.fulfill(
        status=response.status, headers=browser_headers(response), body=response.body
    )
    return outcome
