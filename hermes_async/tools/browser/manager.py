"""BrowserManager: one Chromium per manager, one browser context per rollout.

Each session lives in a task of the manager's task group and holds a ``browser_sessions``
slot for its whole life; releases are shielded and bounded; a browser crash marks its sessions
unavailable. Asyncio only (Playwright). Design: docs/decisions/022-browser-sessions.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from hermes_async._asynclib import require_asyncio
from hermes_async._cleanup import bounded_cleanup, cleanup_scope
from hermes_async._current import Current
from hermes_async._resource import AsyncResource
from hermes_async.errors import ConfigError
from hermes_async.limits import Limits, NamedLimiter
from hermes_async.tools._lifetimes import Lifetime, Lifetimes
from hermes_async.tools.browser._network import ROUTE_ABORT_GRACE_SECONDS
from hermes_async.tools.browser.errors import BrowserUnavailableError, target_closed
from hermes_async.tools.browser.settings import (
    INSTALL_HINT,
    BrowserSettings,
    chromium_args,
    find_chromium,
    launch_environment,
)

if TYPE_CHECKING:
    from playwright.async_api import Browser, Playwright

    from hermes_async.tools.browser.session import BrowserSession, SessionCounters

__all__ = (
    "BROWSER_LIMITER_NAME",
    "BrowserManager",
    "BrowserManagerStatistics",
    "context_options",
    "current_browser_manager",
    "import_playwright",
    "launch_browser",
    "open_browser_manager",
    "stop_browser",
    "use_browser_manager",
)

logger = logging.getLogger(__name__)

#: Name of the limiter bounding open browser contexts (added to ``Limits`` under this name).
BROWSER_LIMITER_NAME = "browser_sessions"

_COMPONENT = "the browser tools (BrowserManager)"
_REMEDY = "leave the 'browser' toolset out of trio runs"


@dataclass(frozen=True, slots=True)
class BrowserManagerStatistics:
    """A snapshot of a manager.

    Attributes:
        pending: Sessions waiting for a slot or being opened.
        unavailable: Sessions lost in a crash and not released yet.
        closed: Browser contexts closed; equals ``created`` once every session is released.
        browser_launches: Browser processes started (1 + restarts after crashes).
        open_contexts: Contexts the browser reports open.
        requests_fulfilled: Page requests answered through the guard.
        requests_blocked: Page requests the SSRF guard refused.
    """

    sessions: int
    pending: int
    unavailable: int
    created: int
    closed: int
    reaped: int
    create_failures: int
    browser_launches: int
    browser_crashes: int
    driver_restarts: int
    open_contexts: int
    requests_fulfilled: int
    requests_blocked: int
    requests_failed: int
    websockets_refused: int


class _Host:
    """One ``task_id``'s session as its host task runs it (phases: waiting, creating, open,
    closing, closed)."""

    __slots__ = (
        "closed",
        "closing",
        "crashed",
        "error",
        "generation",
        "phase",
        "ready",
        "reason",
        "scope",
        "session",
        "task_id",
    )

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.phase = "waiting"
        self.ready = anyio.Event()
        self.closing = anyio.Event()
        self.closed = anyio.Event()
        self.session: BrowserSession | None = None
        self.error: BrowserUnavailableError | None = None
        self.crashed = False
        self.scope: anyio.CancelScope | None = None
        self.generation = 0
        self.reason: str | None = None


class BrowserManager(AsyncResource):
    """Own one browser process and the browser sessions of many rollouts.

    ``settings`` default to :meth:`BrowserSettings.from_env`. The ``browser_sessions`` limiter is
    ``limiter``, else taken from ``limits`` or added to it with ``settings.max_sessions`` slots.
    """

    def __init__(
        self,
        settings: BrowserSettings | None = None,
        *,
        limits: Limits | None = None,
        limiter: NamedLimiter | anyio.CapacityLimiter | None = None,
    ) -> None:
        self.settings = settings if settings is not None else BrowserSettings.from_env()
        if limiter is None:
            if limits is not None:
                try:
                    limiter = limits[BROWSER_LIMITER_NAME]
                except KeyError:
                    limiter = limits.add(BROWSER_LIMITER_NAME, self.settings.max_sessions)
            else:
                limiter = NamedLimiter(BROWSER_LIMITER_NAME, self.settings.max_sessions)
        self.limiter: NamedLimiter | anyio.CapacityLimiter = limiter
        self.executable: str | None = None
        self._state = "unopened"
        self._tg: TaskGroup | None = None
        idle = self.settings.idle_timeout
        self._lifetimes: Lifetimes[_Host] = Lifetimes(
            "browser session",
            self._close_host,
            logger,
            idle_timeout=math.inf if idle is None else idle,
            reap_interval=self.settings.reap_interval,
            reapable=self._reapable,
        )
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._generation = 0
        self._launch_lock = anyio.Lock()
        self._counters: SessionCounters | None = None
        self._created = self._closed = self._create_failures = 0
        self._launches = self._crashes = self._driver_restarts = 0

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<BrowserManager [{self._state} | {s.sessions} open, {s.pending} pending, "
            f"{s.unavailable} unavailable]>"
        )

    @property
    def release_timeout(self) -> float:
        """The bound of one :meth:`release`: finish a creation, then close."""
        s = self.settings
        return s.create_timeout + ROUTE_ABORT_GRACE_SECONDS + s.close_timeout + 1

    # ----------------------------------------------------------------------------------------
    # lifecycle

    async def __aenter__(self) -> Self:
        """Start the Playwright driver, the browser and the idle reaper.

        Raises:
            AsyncBackendError: Not under asyncio.
            ConfigError: Playwright is missing, no Chromium is found, or it does not start.

        **Cancellation**: whatever was started is stopped (shielded, bounded).
        """
        require_asyncio(_COMPONENT, "playwright", remedy=_REMEDY)
        if self._state != "unopened":
            raise RuntimeError(f"BrowserManager cannot be entered twice (state: {self._state})")
        self.executable = find_chromium(self.settings.executable_path)
        async_playwright = import_playwright()
        from hermes_async.tools.browser.session import SessionCounters

        self._counters = SessionCounters()
        self._state = "open"
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            with anyio.fail_after(self.settings.launch_timeout):
                self._playwright = await async_playwright().start()
            try:
                await self._launch()
            except Exception as exc:
                raise ConfigError(
                    f"could not start the browser {self.executable!r}: {_describe(exc)}; "
                    f"{INSTALL_HINT}"
                ) from exc
            await self._lifetimes.start(self._tg)
        except BaseException:
            self._state = "closing"
            self._tg.cancel_scope.cancel("browser manager failed to start")
            await self._tg.__aexit__(None, None, None)
            await self._shutdown("the manager failed to start")
            self._state = "closed"
            raise
        return self

    async def aclose(self) -> None:
        """Release every session, stop the reaper, close the browser and driver. Idempotent.

        Must run in the task that entered the manager.

        **Cancellation**: every step is shielded and bounded.
        """
        if self._state in ("unopened", "closing", "closed"):
            return
        self._state = "closing"
        self._lifetimes.stop()
        assert self._tg is not None
        try:
            await self.release_all(reason="the browser manager is closing")
        finally:
            self._tg.cancel_scope.cancel("the browser manager is closing")
            try:
                # Every session task is cancelled, and each one's cleanup is bounded on its own.
                await self._tg.__aexit__(None, None, None)
            finally:
                await self._shutdown("the browser manager is closing")
                self._state = "closed"

    async def _shutdown(self, reason: str) -> None:
        browser, self._browser = self._browser, None
        playwright, self._playwright = self._playwright, None
        await stop_browser(browser, playwright, self.settings.close_timeout, reason)

    async def _launch(self) -> None:
        assert self._playwright is not None and self.executable is not None
        browser = await launch_browser(self._playwright, self.settings, self.executable)
        self._generation += 1
        generation = self._generation
        browser.on("disconnected", lambda _browser: self._on_disconnected(generation))
        self._browser = browser
        self._launches += 1

    def _on_disconnected(self, generation: int) -> None:
        if generation != self._generation or self._browser is None or self._state != "open":
            return  # an older browser, or our own close
        self._browser = None
        self._crashes += 1
        lost = 0
        for lifetime in self._lifetimes.entries.values():
            entry = lifetime.value
            if entry is None or entry.generation != generation:
                continue
            if entry.phase not in ("creating", "open"):
                continue
            lifetime.last_used = anyio.current_time()  # a lost session is forgotten from now
            error = BrowserUnavailableError(
                "the browser (or its Playwright driver) crashed or was killed, and this "
                "rollout's browser session (page, cookies, history) was lost; the next rollout "
                "gets a fresh browser",
                task_id=entry.task_id,
            )
            entry.error = error
            entry.crashed = True
            if entry.session is not None:
                entry.session.dead = error
            entry.reason = "the browser went away"
            entry.closing.set()
            lost += 1
        logger.warning(
            "the browser (launch %d) went away; %d session(s) lost; the next session starts a "
            "new browser",
            generation,
            lost,
        )

    async def _ensure_browser(self, failed: int | None = None) -> tuple[Browser, int]:
        """The browser to open a context in, (re)launched when needed.

        ``failed``: the launch a context could not open on (its sessions fail, the driver restarts).
        """
        from playwright.async_api import Error as PlaywrightError

        async with self._launch_lock:
            if self._browser is not None and (
                failed == self._generation or not self._browser.is_connected()
            ):
                self._on_disconnected(self._generation)
                if failed is not None:
                    await self._restart_driver()
            if self._browser is None:
                if self._state != "open":
                    raise BrowserUnavailableError("the browser manager is closing")
                try:
                    await self._launch()
                except (TimeoutError, PlaywrightError) as exc:
                    raise BrowserUnavailableError(
                        f"could not restart the browser after a crash: {_describe(exc)}"
                    ) from exc
            assert self._browser is not None
            return self._browser, self._generation

    async def _restart_driver(self) -> None:
        """Replace a Playwright driver that went away (bounded; the old one is stopped first)."""
        from playwright.async_api import async_playwright

        old, self._playwright = self._playwright, None
        if old is not None:
            await bounded_cleanup(
                "stop the failed Playwright driver",
                old.stop,
                timeout=self.settings.close_timeout,
                reason="the driver went away",
                log=logger,
            )
        logger.warning("restarting the Playwright driver")
        with anyio.fail_after(self.settings.launch_timeout):
            self._playwright = await async_playwright().start()
        self._driver_restarts += 1

    def _check_open(self, task_id: str) -> None:
        if self._state != "open":
            hint = (
                "use `async with BrowserManager(...) as manager:`"
                if self._state == "unopened"
                else "it has been closed"
            )
            raise BrowserUnavailableError(
                f"the BrowserManager is not open ({self._state}); {hint}", task_id=task_id
            )

    # ----------------------------------------------------------------------------------------
    # sessions

    async def get(self, task_id: str) -> BrowserSession:
        """The browser session of ``task_id``, opened on first use (bounded by ``create_timeout``).

        Raises:
            ValueError: ``task_id`` is not a non-empty string.
            BrowserUnavailableError: Not open, the context failed, or lost in a crash.

        **Cancellation**: only the wait is abandoned; the session is kept for ``task_id``.
        """
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"task_id must be a non-empty string, got {task_id!r}")
        require_asyncio(_COMPONENT, "playwright", remedy=_REMEDY)
        self._check_open(task_id)
        lifetime, new = self._lifetimes.claim(task_id)
        if new:
            # The session lives in a task of the manager (its requests' task group with it):
            # the caller only waits for it.
            self._lifetimes.settle(lifetime, _Host(task_id))
            assert self._tg is not None
            self._tg.start_soon(self._host, lifetime, name=f"browser session {task_id!r}")
        entry = lifetime.value
        assert entry is not None
        await entry.ready.wait()
        if entry.phase == "open" and entry.error is None and entry.session is not None:
            lifetime.last_used = anyio.current_time()
            return entry.session
        if entry.error is not None:
            raise BrowserUnavailableError(entry.error.message, task_id=task_id) from entry.error
        raise BrowserUnavailableError(
            "the browser session was released while it was being opened", task_id=task_id
        )

    async def _host(self, lifetime: Lifetime[_Host]) -> None:
        """The life of one session, in the manager's task group (never raises but cancels)."""
        entry = lifetime.value
        assert entry is not None
        try:
            with anyio.CancelScope() as scope:
                entry.scope = scope
                if entry.closing.is_set():
                    return
                async with self.limiter:
                    if entry.closing.is_set():
                        return
                    entry.phase = "creating"
                    await self._run_session(lifetime, entry)
        except Exception as exc:  # a bug or an unexpected Playwright error: contained here
            logger.warning("browser session of %r failed", entry.task_id, exc_info=True)
            if entry.error is None:
                entry.error = BrowserUnavailableError(
                    f"the browser session failed: {_describe(exc)}", task_id=entry.task_id
                )
        finally:
            entry.phase = "closed"
            entry.ready.set()
            entry.closed.set()
            # A crashed session stays as a tombstone until released; anything else that ends
            # without a release (a failed open, the manager closing) is forgotten, so the next
            # get() starts over.
            if not entry.crashed:
                self._lifetimes.forget(lifetime)

    async def _run_session(self, lifetime: Lifetime[_Host], entry: _Host) -> None:
        from playwright.async_api import Error as PlaywrightError

        from hermes_async.tools.browser.session import BrowserSession

        settings = self.settings
        try:
            with anyio.fail_after(settings.create_timeout):
                browser, generation = await self._ensure_browser()
                try:
                    context = await browser.new_context(**context_options(settings))
                except PlaywrightError as exc:
                    if not (target_closed(exc) or not browser.is_connected()):
                        raise
                    # The browser, or the driver behind it, is gone (a dead driver sends no
                    # "disconnected" event): restart what is needed and try once more.
                    browser, generation = await self._ensure_browser(failed=generation)
                    context = await browser.new_context(**context_options(settings))
        except (TimeoutError, PlaywrightError, BrowserUnavailableError) as exc:
            self._create_failures += 1
            entry.error = BrowserUnavailableError(
                f"could not open a browser context: {_describe(exc)}", task_id=entry.task_id
            )
            return
        self._created += 1
        entry.generation = generation
        assert self._counters is not None
        try:
            async with anyio.create_task_group() as requests:
                session = BrowserSession(
                    entry.task_id,
                    context,
                    requests,
                    settings=settings,
                    counters=self._counters,
                    usage=lifetime,
                )
                entry.session = session
                try:
                    with anyio.fail_after(settings.create_timeout):
                        await session._setup()
                except (TimeoutError, PlaywrightError) as exc:
                    self._create_failures += 1
                    if entry.error is None:
                        entry.error = BrowserUnavailableError(
                            f"could not open a browser page: {_describe(exc)}",
                            task_id=entry.task_id,
                        )
                if entry.error is None and not entry.closing.is_set():
                    entry.phase = "open"
                    entry.ready.set()
                    await entry.closing.wait()
                entry.phase = "closing"
                if session.dead is None:  # a stale reference must not act on a closed page
                    session.dead = BrowserUnavailableError(
                        f"this browser session was closed ({entry.reason or 'released'}); "
                        "get the rollout's session again for a fresh one",
                        task_id=entry.task_id,
                    )
                requests.cancel_scope.cancel(entry.reason or "the browser session is closing")
        finally:
            with cleanup_scope(
                f"close the browser context of {entry.task_id!r}",
                settings.close_timeout,
                reason=entry.reason,
                log=logger,
            ):
                try:
                    await context.close()
                except PlaywrightError:  # the browser is already gone: nothing left to close
                    logger.debug("closing the context of %r failed", entry.task_id, exc_info=True)
            self._closed += 1

    def _begin_close(self, entry: _Host, reason: str) -> None:
        entry.reason = entry.reason or reason
        entry.closing.set()
        if entry.phase == "waiting" and entry.scope is not None:
            entry.scope.cancel(reason)

    async def release(self, task_id: str, *, reason: str = "released") -> None:
        """Close ``task_id``'s session. Idempotent; never raises (logged).

        Also forgets a session lost in a crash, so the ``task_id`` can start over.

        **Cancellation**: runs shielded, bounded by :attr:`release_timeout`.
        """
        await self._lifetimes.release(task_id, reason=reason)

    async def _close_host(self, lifetime: Lifetime[_Host], interrupted: bool, reason: str) -> None:
        """How a session closes: its host task is told, and waited for (bounded)."""
        entry = lifetime.value
        if entry is None:
            return
        self._begin_close(entry, reason)
        with cleanup_scope(
            f"release the browser session of {lifetime.key!r}",
            self.release_timeout,
            reason=reason,
            log=logger,
        ):
            await entry.closed.wait()

    def request_release(self, task_id: str, *, reason: str = "release requested") -> None:
        """Queue a release of ``task_id`` (synchronous); the exit waits for it."""
        self._lifetimes.request_release(task_id, reason=reason)

    async def release_all(self, *, reason: str = "release all") -> None:
        """Release every session, concurrently.

        **Cancellation**: each release is shielded and bounded.
        """
        await self._lifetimes.release_all(reason=reason)

    @contextlib.asynccontextmanager
    async def session(self, task_id: str) -> AsyncIterator[BrowserSession]:
        """``get(task_id)`` for the block, released when it exits.

        **Cancellation**: the release is shielded and bounded, as :meth:`release`.
        """
        try:
            yield await self.get(task_id)
        finally:
            await self.release(task_id, reason="session block exited")

    async def reap_idle(self) -> int:
        """Release sessions unused for ``idle_timeout`` (busy ones are not idle); return how many.

        **Cancellation**: releases already started complete (shielded, bounded).
        """
        return await self._lifetimes.reap_idle()

    async def _reapable(self, lifetime: Lifetime[_Host]) -> bool:
        """Idle means open (not still waiting for a slot), or lost in a crash."""
        entry = lifetime.value
        assert entry is not None
        return entry.phase == "open" or (entry.crashed and entry.phase == "closed")

    # ----------------------------------------------------------------------------------------
    # introspection

    def _hosts(self) -> list[_Host]:
        return [h for h in (e.value for e in self._lifetimes.entries.values()) if h is not None]

    def __contains__(self, task_id: object) -> bool:
        lifetime = self._lifetimes.entries.get(task_id) if isinstance(task_id, str) else None
        return (
            lifetime is not None and lifetime.value is not None and lifetime.value.phase == "open"
        )

    def task_ids(self) -> list[str]:
        """Task ids with an open session."""
        return [h.task_id for h in self._hosts() if h.phase == "open"]

    def statistics(self) -> BrowserManagerStatistics:
        """A snapshot of counts."""
        entries = self._hosts()
        counters = self._counters
        browser = self._browser
        return BrowserManagerStatistics(
            sessions=sum(e.phase == "open" for e in entries),
            pending=sum(e.phase in ("waiting", "creating") for e in entries),
            unavailable=sum(e.crashed for e in entries),
            created=self._created,
            closed=self._closed,
            reaped=self._lifetimes.reaped,
            create_failures=self._create_failures,
            browser_launches=self._launches,
            browser_crashes=self._crashes,
            driver_restarts=self._driver_restarts,
            open_contexts=len(browser.contexts) if browser is not None else 0,
            requests_fulfilled=counters.fulfilled if counters else 0,
            requests_blocked=counters.blocked if counters else 0,
            requests_failed=counters.failed if counters else 0,
            websockets_refused=counters.websockets_refused if counters else 0,
        )


def import_playwright() -> Any:
    """Playwright's ``async_playwright``, or a ``ConfigError`` saying what to install."""
    try:
        from playwright.async_api import async_playwright
    except ImportError as exc:
        raise ConfigError(
            "the browser tools need Playwright: `pip install 'hermes-async[browser]'` "
            "(then no `playwright install`: the browser is Debian's chromium)"
        ) from exc
    return async_playwright


async def stop_browser(
    browser: Browser | None, playwright: Playwright | None, timeout: float, reason: str
) -> None:
    """Close ``browser``, then stop the ``playwright`` driver; never raises.

    **Cancellation**: each step is shielded and bounded by ``timeout``.
    """
    if browser is not None:
        await bounded_cleanup(
            "close the browser", browser.close, timeout=timeout, reason=reason, log=logger
        )
    if playwright is not None:
        await bounded_cleanup(
            "stop the Playwright driver",
            playwright.stop,
            timeout=timeout,
            reason=reason,
            log=logger,
        )


async def launch_browser(
    playwright: Playwright, settings: BrowserSettings, executable: str
) -> Browser:
    """Launch the headless Chromium at ``executable`` (bounded).

    **Cancellation**: Playwright abandons the launch.
    """
    timeout = settings.launch_timeout
    with anyio.fail_after(timeout + 5):
        return await playwright.chromium.launch(
            executable_path=executable,
            args=chromium_args(settings),
            headless=True,
            chromium_sandbox=settings.chromium_sandbox,
            timeout=timeout * 1000,
            handle_sigint=False,
            handle_sigterm=False,
            handle_sighup=False,
            env=launch_environment(),
        )


def context_options(settings: BrowserSettings) -> dict[str, Any]:
    """The options of every rollout's browser context (viewport; no service workers or
    downloads)."""
    return {
        "viewport": {"width": settings.viewport_width, "height": settings.viewport_height},
        "service_workers": "block",
        "accept_downloads": False,
    }


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first[:500]}" if first else type(exc).__name__


# --------------------------------------------------------------------------------------------
# the current manager

_CURRENT: Current[BrowserManager | None] = Current("hermes_async_browser_manager", None)


def current_browser_manager() -> BrowserManager | None:
    """The manager set by :func:`use_browser_manager` in this context, or ``None``."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_browser_manager(manager: BrowserManager) -> Iterator[BrowserManager]:
    """Make ``manager`` the current one for this context (and tasks started inside it)."""
    with _CURRENT.use(manager):
        yield manager


@contextlib.asynccontextmanager
async def open_browser_manager(
    settings: BrowserSettings | None = None,
    *,
    limits: Limits | None = None,
    limiter: NamedLimiter | anyio.CapacityLimiter | None = None,
) -> AsyncIterator[BrowserManager]:
    """Open a :class:`BrowserManager` and make it current for the block.

    **Cancellation**: on exit every session is released and the browser closed (shielded,
    bounded).
    """
    async with BrowserManager(settings, limits=limits, limiter=limiter) as manager:
        with use_browser_manager(manager):
            yield manager
