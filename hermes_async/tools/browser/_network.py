"""Every request the page makes, answered through the SSRF-guarded fetcher.

The context routes ``**/*`` to :func:`serve_request`: the request is vetted and fetched by
:func:`hermes_async.tools._web_fetch.fetch` (every hop vetted, the connection pinned to the
vetted address, the body capped) and the browser gets the response with ``route.fulfill``;
whatever the guard refuses is aborted with ``blockedbyclient``, whatever fails on the network
with ``failed``/``timedout``. Chromium itself resolves nothing (``--host-resolver-rules=MAP *
~NOTFOUND``), so this handler is the page's only way out.

Redirects: a *navigation* that answers 3xx is handed back to the browser as a redirect of the
navigation (Playwright's ``redirectNavigationRequest``, which Playwright's HAR replay uses), so
the page ends up at the new URL and the next hop comes through this handler again, vetted like
the first. A redirect of a *subresource* is followed here, hop by hop, and the final response is
fulfilled for the original URL (a fulfilled 3xx would be followed by Chromium outside
interception and fail at the resolver). Without Playwright's private hook (a future version),
navigations are followed here too and the page keeps its first URL.

``data:``/``blob:`` URLs need no network and continue; any other non-http(s) scheme is refused.
Header handling, decided in :func:`upstream_headers` / :func:`browser_headers` (pure): the
browser's request headers go upstream minus hop-by-hop ones (``Host``, ``Accept-Encoding`` are
set by the fetcher); the response goes back minus the framing headers that no longer describe
the (decoded, re-framed) body.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import httpx

from hermes_async.tools._ssrf import Allowlist, URLRefusedError, WebFetchError
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
        url: The request's URL.
        disposition: ``fulfilled``, ``redirected`` (a navigation handed back as a redirect),
            ``blocked`` (refused by the guard) or ``failed`` (network error, timeout, too
            large, too many redirects).
        navigation: Whether it was a navigation request.
        detail: Why it was blocked or failed (names the URL and the reason).
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
    """The response headers to fulfil with: framing dropped, repeated names joined.

    Playwright takes one string per name; ``Set-Cookie`` values are joined with newlines (its
    convention for several cookies), other repeated headers with ``", "``.
    """
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
    """Abort ``route`` (shielded, bounded), ignoring a route that is already handled or gone.

    **Cancellation**: runs shielded for at most :data:`ROUTE_ABORT_GRACE_SECONDS`.
    """
    with anyio.move_on_after(ROUTE_ABORT_GRACE_SECONDS, shield=True):
        try:
            await route.abort(error_code)
        except Exception:  # handled already, or the page/context/browser is gone: nothing to do
            logger.debug("route.abort failed", exc_info=True)


def _redirect_hook(route: Any) -> Callable[[str], Any] | None:
    impl = getattr(route, "_impl_obj", None)
    hook = getattr(impl, "_redirect_navigation_request", None)
    return hook if callable(hook) else None


async def serve_request(
    route: Any,
    request: Any,
    *,
    settings: WebSettings,
    allow: Allowlist,
    timeout: float,
) -> RequestOutcome:
    """Answer one intercepted request through the guarded fetcher (fulfil, redirect or abort).

    The route is always handled when this returns; if it raises (cancellation included), the
    caller aborts it.

    Args:
        route: Playwright's ``Route``.
        request: Its ``Request``.
        settings: Fetch caps, transport and resolver.
        allow: Hosts and networks let through on purpose.
        timeout: Deadline of the whole exchange (all hops and the body).

    Returns:
        What was done, for the session's records.

    **Cancellation**: the upstream request is abandoned (its response and client closed,
    shielded and bounded); the route is left to the caller to abort.
    """
    url: str = request.url
    navigation = bool(request.is_navigation_request())
    if url.startswith(_NO_NETWORK_SCHEMES):
        await route.continue_()
        return RequestOutcome(url, "fulfilled", navigation)
    hook = _redirect_hook(route) if navigation else None
    try:
        headers = upstream_headers(await request.all_headers())
        with anyio.fail_after(timeout):
            response = await fetch(
                request.method,
                url,
                headers=headers,
                content=request.post_data_buffer,
                settings=settings,
                allow=allow,
                follow_redirects=hook is None,
            )
    except URLRefusedError as exc:
        await route.abort("blockedbyclient")
        return RequestOutcome(url, "blocked", navigation, f"refused {exc.url!r}: {exc.reason}")
    except TimeoutError:
        await route.abort("timedout")
        detail = f"{url!r} took longer than {timeout:g} seconds (fetch_timeout_seconds)"
        return RequestOutcome(url, "failed", navigation, detail)
    except WebFetchError as exc:
        await route.abort("failed")
        return RequestOutcome(url, "failed", navigation, exc.message)
    location = response.location
    if hook is not None and location is not None:
        try:
            target = str(httpx.URL(url).join(location))
        except (httpx.InvalidURL, ValueError) as exc:
            await route.abort("failed")
            detail = f"{url!r} redirected to an invalid URL {location!r}: {exc}"
            return RequestOutcome(url, "failed", navigation, detail)
        await hook(target)
        return RequestOutcome(url, "redirected", navigation, location=target)
    if response.truncated and request.resource_type != "document":
        await route.abort("failed")
        detail = (
            f"{url!r} is larger than {settings.max_body_bytes:,} bytes (max_body_bytes); refused"
        )
        return RequestOutcome(url, "failed", navigation, detail)
    await route.fulfill(
        status=response.status, headers=browser_headers(response), body=response.body
    )
    return RequestOutcome(url, "fulfilled", navigation)
