"""Every request the page makes, answered through the SSRF-guarded fetcher.

The context routes ``**/*`` to :func:`serve_request`: the request is vetted and fetched by
:func:`hermes_async.tools._web_fetch.fetch` (every hop vetted, the connection pinned to the
vetted address, the body capped) and the browser gets the response with ``route.fulfill``;
whatever the guard refuses is aborted with ``blockedbyclient``, whatever fails on the network
with ``failed``/``timedout``. Chromium itself resolves nothing (``--host-resolver-rules=MAP *
~NOTFOUND``), so this handler is the page's only way out.

Redirects: a *subresource* redirect is followed here, hop by hop (each hop vetted), and the final
response is fulfilled for the original URL. A *navigation* that answers 3xx gets a small
"redirect page" instead: the 3xx response's headers (its ``Set-Cookie`` included, attributed to
the right origin) with ``Refresh: 0;url=<target>`` and the matching ``<meta http-equiv=refresh>``,
so Chromium starts a new navigation to the target, which comes through this handler again and
is vetted like the first (a target the guard refuses is refused *before* the page is served,
with "redirect from ..." in the reason). Chromium replaces the redirect page's history entry,
and ``Refresh`` navigations are ``GET``, as a 301/302/303 redirect of a form ``POST`` is; a
307/308 of a ``POST`` keeps its method and body and is followed here instead. Why not a plain
fulfilled 3xx: Chromium would follow it itself, outside interception, and fail at the resolver;
and Playwright's private ``redirectNavigationRequest`` (what its HAR replay uses) leaves an
unhandled promise rejection in the driver when the redirected navigation fails, which kills the
driver under Node's default ``--unhandled-rejections=throw``.

``data:``/``blob:`` URLs need no network and continue; any other non-http(s) scheme is refused.
Header handling, decided in :func:`upstream_headers` / :func:`browser_headers` (pure): the
browser's request headers go upstream minus hop-by-hop ones (``Host``, ``Accept-Encoding`` are
set by the fetcher); the response goes back minus the framing headers that no longer describe
the (decoded, re-framed) body.
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
        url: The request's URL.
        disposition: ``fulfilled``, ``redirected`` (a navigation answered by a redirect page),
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
    with cleanup_scope("abort an intercepted request", ROUTE_ABORT_GRACE_SECONDS, log=logger):
        try:
            await route.abort(error_code)
        except Exception:  # handled already, or the page/context/browser is gone: nothing to do
            logger.debug("route.abort failed", exc_info=True)


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

    The route is always handled when this returns; if it raises (cancellation included), the
    caller aborts it. ``record`` is called with the outcome *before* the route is handled, so
    whoever waits on the navigation (a ``goto``) finds the reason of a refusal, or the redirect
    page, already recorded when it wakes up.

    Args:
        route: Playwright's ``Route``.
        request: Its ``Request``.
        settings: Fetch caps, transport and resolver.
        allow: Hosts and networks let through on purpose.
        timeout: Deadline of the whole exchange (all hops and the body).
        record: Called with the outcome just before the route is fulfilled or aborted.

    Returns:
        What was done, for the session's records.

    **Cancellation**: the upstream request is abandoned (its response and client closed,
    shielded and bounded); the route is left to the caller to abort.
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
