"""One rollout's browser: a Playwright context, its page, and the browser tools' operations.

Every request goes through the SSRF-guarded fetcher; one operation runs at a time. A failure
the model causes is a ``{"success": false, "error": ...}`` result; a crashed browser or page
raises :class:`~hermes_async.tools.browser.manager.BrowserUnavailableError`. Requires the
``browser`` extra; only the manager imports this module. Design: docs/decisions/041.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup
from playwright.async_api import (
    BrowserContext,
    CDPSession,
    ConsoleMessage,
    Error as PlaywrightError,
    Page,
    Request,
    Route,
    TimeoutError as PlaywrightTimeoutError,
)

from hermes_async.jsontypes import JSONObject
from hermes_async.tools._lifetimes import Lifetime
from hermes_async.tools._ssrf import Allowlist, URLRefusedError, WebFetchError, parse_url, vet_url
from hermes_async.tools.browser._network import RequestOutcome, abort_quietly, serve_request
from hermes_async.tools.browser._snapshot import RefTable, compact_snapshot, cut_snapshot
from hermes_async.tools.browser.errors import BrowserUnavailableError, target_closed

if TYPE_CHECKING:
    from hermes_async.tools.browser.settings import BrowserSettings

__all__ = ("BrowserSession", "SessionCounters")

logger = logging.getLogger(__name__)

#: What ``Runtime.getHeapUsage`` reports that a page's scripts hold (typed arrays live in the
#: backing stores, outside V8's heap).
_HEAP_PARTS = ("usedSize", "embedderHeapUsedSize", "backingStorageSize")
#: anyio deadline over Playwright's own timeout, so Playwright reports the timeout itself.
_OPERATION_SLACK_SECONDS = 5.0
#: Refused popups a standalone session holds for its next operation to close. Past it a popup
#: is left to the context (closed with the session): a flooding page cannot grow the list.
_MAX_REFUSED_WAITING = 64
#: Characters of one console message or page error kept.
MAX_MESSAGE_CHARS = 2_000
#: Characters of console output one ``browser_console`` result carries at most (the newest
#: messages and errors are kept; the result says how many older ones were left out).
MAX_CONSOLE_RESULT_CHARS = 20_000
#: Characters of a URL or title in a result.
_MAX_URL_CHARS = 2_000
#: Images ``browser_get_images`` lists at most, and characters of one ``src`` kept.
MAX_IMAGES = 100
_MAX_SRC_CHARS = 300
#: After a click or key press, how long to wait for a navigation it started to finish loading.
SETTLE_TIMEOUT_SECONDS = 5.0
#: After a failed navigation, how long to wait for Chromium's error page to commit.
ERROR_PAGE_WAIT_SECONDS = 3.0
#: ``goto`` attempts when a navigation is interrupted by a late one of the browser's own.
_NAVIGATION_ATTEMPTS = 3
#: After a click or key press, how long a navigation it started may take to reach the network.
NAVIGATION_START_WINDOW_SECONDS = 0.25

_BOT_PATTERNS = (
    "access denied",
    "access to this page has been denied",
    "blocked",
    "bot detected",
    "verification required",
    "please verify",
    "are you a robot",
    "captcha",
    "cloudflare",
    "ddos protection",
    "checking your browser",
    "just a moment",
    "attention required",
)
_API_PREFIX = re.compile(r"^[A-Za-z]+\.[A-Za-z_]+: ")
_IMAGES_JS = f"""() => [...document.images]
  .filter(img => img.src && !img.src.startsWith('data:'))
  .slice(0, {MAX_IMAGES})
  .map(img => ({{src: img.src.slice(0, {_MAX_SRC_CHARS}), alt: img.alt || '',
                width: img.naturalWidth, height: img.naturalHeight}}))"""


class SessionCounters:
    """Request counters shared by the sessions of one manager."""

    __slots__ = (
        "blocked",
        "failed",
        "fulfilled",
        "heap_resets",
        "pages_refused",
        "websockets_refused",
    )

    def __init__(self) -> None:
        self.fulfilled = 0
        self.blocked = 0
        self.failed = 0
        self.websockets_refused = 0
        self.pages_refused = 0
        self.heap_resets = 0


def _short(exc: BaseException) -> str:
    """The first line of a Playwright error, without its ``Page.goto:`` prefix, capped."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _API_PREFIX.sub("", text)[:500]


def _is_error_page(url: str) -> bool:
    return url.startswith("chrome-error:")


def _main_frame_page(request: Request) -> int | None:
    """``id`` of the page whose main frame makes this navigation request, else ``None``."""
    if not request.is_navigation_request():
        return None
    try:
        frame = request.frame
    except PlaywrightError:  # a service worker's request: no frame
        return None
    return id(frame.page) if frame.parent_frame is None else None


def _newest_within(entries: list[JSONObject], key: str, budget: int) -> list[JSONObject]:
    """The newest ``entries`` whose ``key`` texts fit in ``budget`` characters, oldest first."""
    kept: list[JSONObject] = []
    for entry in reversed(entries):
        budget -= len(str(entry.get(key, "")))
        if budget < 0:
            break
        kept.append(entry)
    kept.reverse()
    return kept


def _failure(message: str) -> JSONObject:
    return {"success": False, "error": message}


class BrowserSession:
    """The browser context of one rollout (created by the manager; do not construct directly).

    Attributes:
        dead: Set when the browser or the page crashed; every later operation raises it.
    """

    def __init__(
        self,
        task_id: str,
        context: BrowserContext,
        requests: TaskGroup | None,
        *,
        settings: BrowserSettings,
        counters: SessionCounters,
        usage: Lifetime[Any] | None = None,
    ) -> None:
        self.task_id = task_id
        # The manager's record of this rollout: its busy count and last use are the reaper's.
        self._usage: Lifetime[Any] = usage if usage is not None else Lifetime(task_id)
        self.dead: BrowserUnavailableError | None = None
        self._context = context
        self._requests = requests
        self._settings = settings
        self._counters = counters
        self._fetch = settings.fetch_settings()
        self._allow = Allowlist.from_entries(settings.allow)
        self._request_slots = anyio.CapacityLimiter(settings.max_requests_per_session)
        self._lock = anyio.Lock()
        self._pages: list[Page] = []
        # A click or key press of the model may open one page past max_pages (a new tab).
        self._may_open_page = False
        self._heap_probes: dict[int, CDPSession] = {}  # id(page) -> its CDP session
        self._refused_pages: list[Page] = []  # standalone: closed before the next operation
        self._refs = RefTable()
        keep = settings.console_max_messages
        self._console: collections.deque[JSONObject] = collections.deque(maxlen=keep)
        self._errors: collections.deque[JSONObject] = collections.deque(maxlen=keep)
        # (sequence number, outcome, id of the page whose main frame navigated, if it was one)
        self._refused: collections.deque[tuple[int, RequestOutcome, int | None]] = (
            collections.deque(maxlen=64)
        )
        self._redirected_from: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._redirect_pages: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._navigation_redirects = 0
        self._seq = 0
        # Per page (by id): main-frame navigation requests seen, ``load`` events fired; what a
        # click or key press waits on (see :meth:`_settle`). ``_activity`` is set, and replaced,
        # whenever either count (or ``_seq``) moves.
        self._navigations: collections.Counter[int] = collections.Counter()
        self._loads: collections.Counter[int] = collections.Counter()
        self._activity = anyio.Event()

    @property
    def busy(self) -> int:
        """Operations in flight (the idle reaper leaves busy sessions alone)."""
        return self._usage.busy

    @property
    def last_used(self) -> float:
        return self._usage.last_used

    def __repr__(self) -> str:
        state = "dead" if self.dead else "open"
        return f"<BrowserSession {self.task_id!r} {state}, {len(self._pages)} page(s)>"

    # ----------------------------------------------------------------------------------------
    # setup and the request path

    async def _setup(self) -> None:
        """Route the context's requests and WebSockets, open the first page."""
        self._context.on("page", self._on_page)
        await self._context.route("**/*", self._on_route)
        await self._context.route_web_socket("**/*", self._on_websocket)
        await self._context.new_page()  # _on_page records it
        if self._requests is not None:  # standalone: no task to watch with (see _page)
            self._requests.start_soon(self._watch_heap, name=f"heap of {self.task_id!r}")

    def _on_page(self, page: Page) -> None:
        self._pages = [p for p in self._pages if not p.is_closed()]
        if len(self._pages) >= self._settings.max_pages and not self._may_open_page:
            # Runs in Playwright's dispatch: the close is handed to the session's task group.
            self._counters.pages_refused += 1
            self._console.append(
                {
                    "type": "error",
                    "text": f"Blocked: a popup was closed: this session keeps at most "
                    f"{self._settings.max_pages} pages open",
                    "source": "browser",
                }
            )
            self._close_soon(page)
            return
        self._may_open_page = False
        self._pages.append(page)
        page.on("console", self._on_console)
        page.on("pageerror", self._on_page_error)
        page.on("crash", self._on_crash)
        page.on("load", self._on_load)

    def _on_load(self, page: Page) -> None:
        self._loads[id(page)] += 1
        self._touch()

    def _touch(self) -> None:
        self._activity.set()
        self._activity = anyio.Event()

    def _progress(self, page: Page) -> tuple[int, int, int]:
        """Where ``page`` stands: navigations started, loads fired, refusals recorded."""
        key = id(page)
        return self._navigations[key], self._loads[key], self._seq

    def _on_console(self, message: ConsoleMessage) -> None:
        self._console.append(
            {"type": message.type, "text": message.text[:MAX_MESSAGE_CHARS], "source": "console"}
        )

    def _on_page_error(self, error: Any) -> None:
        self._errors.append({"message": str(error)[:MAX_MESSAGE_CHARS], "source": "exception"})

    def _on_crash(self, page: Page) -> None:
        if self.dead is None:
            self.dead = BrowserUnavailableError(
                "the browser page of this rollout crashed (renderer out of memory or killed); "
                "its state is gone",
                task_id=self.task_id,
            )

    async def _on_route(self, route: Route, request: Request) -> None:
        # Runs in Playwright's dispatch task: hand the work to this session's task group and
        # return at once. A closing session takes no new work: the request is refused.
        page_key = _main_frame_page(request)
        if page_key is not None:
            self._navigations[page_key] += 1
            self._touch()
        if self._requests is None:  # standalone: this Playwright task carries it (bounded)
            await self._serve(route, request)
            return
        try:
            self._requests.start_soon(self._serve, route, request)
        except RuntimeError:
            await abort_quietly(route, "aborted")

    async def _serve(self, route: Route, request: Request) -> None:
        handled = False
        try:
            async with self._request_slots:
                left = self._settings.max_redirects - self._navigation_redirects
                if request.is_navigation_request() and left <= 0:
                    # A redirect loop handed back to the browser: refuse the next hop.
                    self._navigation_redirects = 0
                    self._record(
                        RequestOutcome(
                            request.url,
                            "failed",
                            True,
                            f"too many redirects (more than {self._settings.max_redirects}, "
                            "the max_redirects setting)",
                        ),
                        _main_frame_page(request),
                    )
                    await route.abort("failed")
                    handled = True
                    return
                page_key = _main_frame_page(request)
                await serve_request(
                    route,
                    request,
                    settings=self._fetch,
                    allow=self._allow,
                    timeout=self._settings.fetch_timeout,
                    record=lambda outcome: self._record(outcome, page_key),
                )
                handled = True
        except Exception:  # a page/context that went away mid-request; the route is aborted
            logger.debug("serving %s for %r failed", request.url, self.task_id, exc_info=True)
        finally:
            if not handled:
                await abort_quietly(route)

    def _record(self, outcome: RequestOutcome, page_key: int | None = None) -> None:
        if outcome.disposition == "redirected" and outcome.location is not None:
            self._navigation_redirects += 1
            self._redirect_pages[outcome.url] = outcome.location
            self._redirected_from[outcome.location] = outcome.url
            for table in (self._redirect_pages, self._redirected_from):
                while len(table) > 32:
                    table.popitem(last=False)
            return
        if outcome.navigation:
            self._navigation_redirects = 0
        if outcome.disposition == "fulfilled":
            self._counters.fulfilled += 1
            return
        detail = outcome.detail or outcome.url
        origin = self._redirected_from.get(outcome.url)
        if origin is not None and outcome.navigation and "redirect from" not in detail:
            detail = f"redirect from {origin!r}: {detail}"
        if outcome.disposition == "blocked":
            self._counters.blocked += 1
        else:
            self._counters.failed += 1
        self._seq += 1
        refused = RequestOutcome(outcome.url, outcome.disposition, outcome.navigation, detail)
        self._refused.append((self._seq, refused, page_key))
        self._touch()
        label = "Blocked by the SSRF guard" if outcome.disposition == "blocked" else "Failed"
        self._console.append(
            {"type": "error", "text": f"{label}: {detail}"[:MAX_MESSAGE_CHARS], "source": "network"}
        )

    async def _on_websocket(self, websocket: Any) -> None:
        # Not connected upstream (no guarded WebSocket client here): refused, and recorded.
        self._counters.websockets_refused += 1
        self._console.append(
            {
                "type": "error",
                "text": f"Blocked by the SSRF guard: WebSocket {websocket.url[:500]!r} (WebSockets "
                "are disabled in the browser tools)",
                "source": "network",
            }
        )
        await websocket.close(code=1008, reason="WebSockets are disabled")

    # ----------------------------------------------------------------------------------------
    # bounds: pages and heap

    @contextmanager
    def _may_open(self) -> Iterator[None]:
        """During the block, one new page may pass ``max_pages`` (the model's new tab)."""
        self._may_open_page = True
        try:
            yield
        finally:
            self._may_open_page = False

    def _close_soon(self, page: Page) -> None:
        if self._requests is None:
            if len(self._refused_pages) < _MAX_REFUSED_WAITING:
                self._refused_pages.append(page)
            return
        # A closing session takes no new work (RuntimeError): its context closes the page.
        with contextlib.suppress(RuntimeError):
            self._requests.start_soon(self._close_page, page)

    async def _close_page(self, page: Page) -> None:
        with anyio.move_on_after(self._settings.close_timeout):
            try:
                await page.close()
            except PlaywrightError:
                logger.debug("closing a page of %r failed", self.task_id, exc_info=True)

    async def _watch_heap(self) -> None:
        """Measure the pages' heap every ``memory_check_seconds``; reset them past the bound."""
        limit = self._settings.max_session_heap_mb * 2**20
        while self.dead is None:
            await anyio.sleep(self._settings.memory_check_seconds)
            used = await self._heap_bytes()
            if used > limit:
                await self._reset_pages(used)

    async def _heap_bytes(self) -> int:
        """The memory the open pages' scripts hold (docs/decisions/041)."""
        total = 0
        pages = [p for p in self._pages if not p.is_closed()]
        for key in set(self._heap_probes) - {id(p) for p in pages}:
            del self._heap_probes[key]
        for page in pages:
            with anyio.move_on_after(1.0):
                try:
                    probe = self._heap_probes.get(id(page))
                    if probe is None:
                        probe = await self._context.new_cdp_session(page)
                        self._heap_probes[id(page)] = probe
                    usage = await probe.send("Runtime.getHeapUsage")
                    total += sum(int(usage.get(key, 0)) for key in _HEAP_PARTS)
                except PlaywrightError:  # the page went away meanwhile
                    self._heap_probes.pop(id(page), None)
        return total

    async def _reset_pages(self, used: int) -> None:
        """Close every page and open a blank one (under the lock)."""
        limit = self._settings.max_session_heap_mb
        async with self._lock:
            pages, self._pages = self._pages, []
            self._heap_probes.clear()
            for page in pages:
                await self._close_page(page)
            self._counters.heap_resets += 1
            message = (
                f"The page used {used / 2**20:.0f} MB of JavaScript memory, more than this "
                f"session's {limit} MB: its pages were closed and the browser is on a blank page"
            )
            self._errors.append({"message": message, "source": "browser"})
            logger.warning("browser session %r: %s", self.task_id, message)
            with anyio.move_on_after(self._settings.create_timeout):
                try:
                    await self._context.new_page()
                except PlaywrightError:  # the next operation opens one (see _page)
                    logger.debug("opening a page for %r failed", self.task_id, exc_info=True)

    # ----------------------------------------------------------------------------------------
    # operation plumbing

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise BrowserUnavailableError(self.dead.message, task_id=self.task_id)

    def _unavailable(self, exc: BaseException) -> BrowserUnavailableError | None:
        """The error to raise if ``exc`` means the browser or the page is gone."""
        if self.dead is not None:
            return BrowserUnavailableError(self.dead.message, task_id=self.task_id)
        browser = self._context.browser
        if target_closed(exc) or (browser is not None and not browser.is_connected()):
            return BrowserUnavailableError(
                f"the browser went away during the operation ({_short(exc)})",
                task_id=self.task_id,
            )
        return None

    async def _page(self) -> Page:
        """The newest open page; refused and extra pages beyond ``max_pages`` are closed first."""
        refused, self._refused_pages = self._refused_pages, []
        if refused:  # at once, not one close_timeout each: this runs under the call's deadline
            async with anyio.create_task_group() as tg:
                for page in refused:
                    tg.start_soon(self._close_page, page)
        self._pages = [p for p in self._pages if not p.is_closed()]
        while len(self._pages) > self._settings.max_pages:
            await self._close_page(self._pages.pop(0))
        if not self._pages:  # the page closed itself (window.close()): open a fresh one
            await self._context.new_page()
        return self._pages[-1]

    @asynccontextmanager
    async def _operation(self, timeout: float) -> AsyncIterator[Page]:
        """Hold the session for one operation: alive check, lock, busy mark, deadline."""
        with self._in_use():
            async with self._lock:
                self._check_alive()
                with anyio.fail_after(timeout + _OPERATION_SLACK_SECONDS):
                    try:
                        yield await self._page()
                    except PlaywrightError as exc:
                        gone = self._unavailable(exc)
                        if gone is not None:
                            raise gone from exc
                        raise

    @contextmanager
    def _in_use(self) -> Iterator[None]:
        """Mark the session busy for the block; its end counts as the last use."""
        self._check_alive()
        with self._usage.in_use():
            yield

    def _model_error(self, what: str, exc: PlaywrightError) -> JSONObject:
        gone = self._unavailable(exc)
        if gone is not None:
            raise gone from exc
        if isinstance(exc, PlaywrightTimeoutError):
            return _failure(f"{what}: timed out ({_short(exc)})")
        return _failure(f"{what}: {_short(exc)}")

    async def _settle(self, page: Page, before: tuple[int, int, int]) -> None:
        """Let a navigation started by a click or key press finish loading (bounded).

        ``before`` is :meth:`_progress` taken before the action; docs/decisions/041 says why
        the load state alone is not enough.
        """
        navigations, loads, seq = before
        with anyio.move_on_after(NAVIGATION_START_WINDOW_SECONDS):
            while self._progress(page)[0] == navigations:
                await self._activity.wait()
        if self._progress(page)[0] == navigations:
            return  # the action started no navigation
        with anyio.move_on_after(SETTLE_TIMEOUT_SECONDS):
            while self._progress(page)[1] == loads and self._seq == seq:
                await self._activity.wait()
        if self._seq != seq:
            await self._settle_failure(page)
            return
        try:
            await page.wait_for_load_state("load", timeout=SETTLE_TIMEOUT_SECONDS * 1000)
        except PlaywrightError as exc:
            if self._unavailable(exc) is not None:
                raise
        await self._follow_redirects(page, SETTLE_TIMEOUT_SECONDS)

    async def _follow_redirects(self, page: Page, timeout: float) -> None:
        """Wait out redirect pages (:mod:`._network`): at most ``max_redirects`` hops."""
        for _ in range(self._settings.max_redirects + 1):
            current = page.url
            if current not in self._redirect_pages:
                return

            def moved_on(url: str, current: str = current) -> bool:
                return url != current

            try:
                await page.wait_for_url(moved_on, wait_until="load", timeout=timeout * 1000)
            except PlaywrightError as exc:
                if self._unavailable(exc) is not None:
                    raise
                if not isinstance(exc, PlaywrightTimeoutError):
                    await self._settle_failure(page)  # the target failed: its error page lands
                return

    @staticmethod
    def _refused_failure(detail: str) -> JSONObject:
        if detail.startswith("refused "):
            return _failure(f"Blocked: {detail}")
        return _failure(f"Navigation failed: {detail}")

    def _refusal_since(self, mark: int, page: Page) -> str | None:
        """Why the last main-frame navigation of ``page`` after ``mark`` was refused, if it was."""
        for seq, outcome, page_key in reversed(self._refused):
            if seq > mark and page_key == id(page):
                return outcome.detail
        return None

    async def _settle_failure(self, page: Page) -> None:
        """Wait briefly for Chromium's error page to commit after a failed navigation."""
        try:
            await page.wait_for_url(
                _is_error_page, wait_until="load", timeout=ERROR_PAGE_WAIT_SECONDS * 1000
            )
        except PlaywrightError as exc:
            if self._unavailable(exc) is not None:
                raise

    # ----------------------------------------------------------------------------------------
    # the operations (one per tool)

    async def navigate(self, url: str) -> JSONObject:
        """Load ``url`` (``browser_navigate``); a title like a bot wall adds
        ``bot_detection_warning``.

        **Cancellation**: the navigation is abandoned (the page may keep loading); the session
        stays usable.
        """
        with self._in_use():  # busy from the first await: resolving the host is part of it
            return await self._navigate(url)

    async def _navigate(self, url: str) -> JSONObject:
        try:
            await vet_url(parse_url(url), allow=self._allow, resolver=self._settings.resolver)
        except URLRefusedError as exc:
            return _failure(
                f"Blocked: refused {exc.url!r}: {exc.reason}. The browser only loads public "
                "http(s) addresses (an operator can allow internal hosts with "
                "BrowserSettings.allow / HERMES_BROWSER_ALLOW)"
            )
        except WebFetchError as exc:
            return _failure(f"Navigation failed: {exc.message}")
        timeout = self._settings.navigation_timeout
        async with self._operation(timeout) as page:
            mark = self._seq
            for attempt in range(_NAVIGATION_ATTEMPTS):
                try:
                    await page.goto(url.strip(), wait_until="load", timeout=timeout * 1000)
                    await self._follow_redirects(page, timeout)
                    break
                except PlaywrightError as exc:
                    gone = self._unavailable(exc)
                    if gone is not None:
                        raise gone from exc
                    refusal = self._refusal_since(mark, page)
                    if (
                        refusal is None
                        and attempt < _NAVIGATION_ATTEMPTS - 1
                        and "interrupted by another navigation" in str(exc)
                    ):
                        # A late error page of an earlier failure (or a redirect page's own
                        # refresh) took over: let it land, go again.
                        await self._settle_failure(page)
                        continue
                    if not isinstance(exc, PlaywrightTimeoutError):
                        await self._settle_failure(page)
                    if refusal is not None:
                        return self._refused_failure(refusal)
                    if "Download is starting" in str(exc):
                        return _failure(
                            f"Navigation failed: {url!r} is a file download, and downloads are "
                            "disabled in the browser tools"
                        )
                    return self._model_error("Navigation failed", exc)
            if _is_error_page(page.url):  # a redirect target that failed
                refusal = self._refusal_since(mark, page) or f"could not load {url!r}"
                return self._refused_failure(refusal)
            title = await page.title()
            result: JSONObject = {
                "success": True,
                "url": page.url[:_MAX_URL_CHARS],
                "title": title[:500],
            }
        if any(pattern in title.lower() for pattern in _BOT_PATTERNS):
            result["bot_detection_warning"] = (
                f"Page title {title[:200]!r} suggests bot detection. The site may have blocked "
                "this request; try other pages first or a different site."
            )
        return result

    async def snapshot(self, full: bool = False) -> JSONObject:
        """The accessibility tree with ``[ref=eN]`` refs, cut at ``snapshot_max_chars``.

        Args:
            full: The whole tree; ``False`` drops unnamed layout containers.

        **Cancellation**: nothing to clean up.
        """
        timeout = self._settings.action_timeout
        async with self._operation(timeout) as page:
            try:
                raw = await page.aria_snapshot(mode="ai", timeout=timeout * 1000)
            except PlaywrightError as exc:
                return self._model_error("Failed to get snapshot", exc)
        text, count = self._refs.rewrite(raw)
        if not full:
            text = compact_snapshot(text)
        text = cut_snapshot(text, self._settings.snapshot_max_chars)
        return {"success": True, "snapshot": text, "element_count": count}

    def _locator(self, page: Page, ref: str) -> Any:
        page_ref = self._refs.resolve(ref)
        if page_ref is None:
            return None
        return page.locator(f"aria-ref={page_ref}")

    @staticmethod
    def _normal_ref(ref: str) -> str:
        ref = ref.strip()
        return ref if ref.startswith("@") else f"@{ref}"

    def _unknown_ref(self, ref: str) -> JSONObject:
        return _failure(
            f"Unknown ref {ref!r}: take a fresh browser_snapshot and use one of its [ref=eN] "
            "values (as '@eN')"
        )

    async def click(self, ref: str) -> JSONObject:
        """Click the element ``ref`` names (``browser_click``).

        **Cancellation**: the click may or may not have happened.
        """
        ref = self._normal_ref(ref)
        timeout = self._settings.action_timeout
        async with self._operation(
            timeout + NAVIGATION_START_WINDOW_SECONDS + 2 * SETTLE_TIMEOUT_SECONDS
        ) as page:
            locator = self._locator(page, ref)
            if locator is None:
                return self._unknown_ref(ref)
            before = self._progress(page)
            with self._may_open():
                try:
                    await locator.click(timeout=timeout * 1000)
                except PlaywrightError as exc:
                    return self._model_error(f"Failed to click {ref}", exc)
                await self._settle(page, before)
        return {"success": True, "clicked": ref}

    async def type(self, ref: str, text: str) -> JSONObject:
        """Clear the field ``ref`` names and type ``text`` into it (``browser_type``).

        **Cancellation**: the field may hold part of the text.
        """
        ref = self._normal_ref(ref)
        timeout = self._settings.action_timeout
        async with self._operation(timeout) as page:
            locator = self._locator(page, ref)
            if locator is None:
                return self._unknown_ref(ref)
            try:
                await locator.fill(text, timeout=timeout * 1000)
            except PlaywrightError as exc:
                return self._model_error(f"Failed to type into {ref}", exc)
        return {"success": True, "typed": text, "element": ref}

    async def scroll(self, direction: str) -> JSONObject:
        """Scroll the page up or down by most of a viewport (``browser_scroll``).

        **Cancellation**: nothing to clean up.
        """
        if direction not in ("up", "down"):
            return _failure(f"Invalid direction '{direction}'. Use 'up' or 'down'.")
        step = int(self._settings.viewport_height * 0.9) * (1 if direction == "down" else -1)
        timeout = self._settings.action_timeout
        async with self._operation(timeout) as page:
            try:
                await page.evaluate("(dy) => window.scrollBy(0, dy)", step)
            except PlaywrightError as exc:
                return self._model_error(f"Failed to scroll {direction}", exc)
        return {"success": True, "scrolled": direction}

    async def back(self) -> JSONObject:
        """Go back one page in the history (``browser_back``).

        **Cancellation**: the page may still be going back.
        """
        timeout = self._settings.navigation_timeout
        async with self._operation(timeout) as page:
            try:
                await page.go_back(wait_until="load", timeout=timeout * 1000)
            except PlaywrightError as exc:
                return self._model_error("Failed to go back", exc)
            return {"success": True, "url": page.url[:_MAX_URL_CHARS]}

    async def press(self, key: str) -> JSONObject:
        """Press a keyboard key in the page (``browser_press``).

        **Cancellation**: the key may or may not have been pressed.
        """
        timeout = self._settings.action_timeout
        async with self._operation(
            timeout + NAVIGATION_START_WINDOW_SECONDS + 2 * SETTLE_TIMEOUT_SECONDS
        ) as page:
            before = self._progress(page)
            with self._may_open():
                try:
                    await page.keyboard.press(key)
                except PlaywrightError as exc:
                    return self._model_error(f"Failed to press {key}", exc)
                await self._settle(page, before)
        return {"success": True, "pressed": key}

    async def images(self) -> JSONObject:
        """The page's images, at most :data:`MAX_IMAGES`, ``data:`` ones left out.

        **Cancellation**: nothing to clean up.
        """
        timeout = self._settings.action_timeout
        async with self._operation(timeout) as page:
            try:
                images = await page.evaluate(_IMAGES_JS)
            except PlaywrightError as exc:
                return self._model_error("Failed to get images", exc)
        if not isinstance(images, list):
            images = []
        return {"success": True, "images": images, "count": len(images)}

    async def console(self, clear: bool = False) -> JSONObject:
        """Console messages, page errors and refused requests (``browser_console``).

        At most :data:`MAX_CONSOLE_RESULT_CHARS`: the newest; ``omitted_older`` counts the rest.

        **Cancellation**: nothing to clean up.
        """
        self._check_alive()
        messages = _newest_within(list(self._console), "text", MAX_CONSOLE_RESULT_CHARS // 2)
        errors = _newest_within(list(self._errors), "message", MAX_CONSOLE_RESULT_CHARS // 2)
        omitted = len(self._console) - len(messages) + len(self._errors) - len(errors)
        if clear:
            self._console.clear()
            self._errors.clear()
        self._usage.last_used = anyio.current_time()
        result: JSONObject = {
            "success": True,
            "console_messages": messages,
            "js_errors": errors,
            "total_messages": len(messages),
            "total_errors": len(errors),
        }
        if omitted:
            result["omitted_older"] = omitted
        return result

    async def screenshot(self) -> bytes:
        """A PNG of the viewport (for ``browser_vision``).

        Raises:
            PlaywrightError: The screenshot failed (the caller reports it to the model).

        **Cancellation**: nothing to clean up.
        """
        timeout = self._settings.action_timeout
        async with self._operation(timeout) as page:
            return await page.screenshot(type="png", timeout=timeout * 1000)
