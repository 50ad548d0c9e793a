"""The browser of a standalone ``ToolContext``: what ``StandaloneSandboxes`` is to its sandbox.

Made at the context's first browser call, closed with its sandbox; it holds no task, so it may
outlive that call. One Chromium, one context per task id, no reaper or crash recovery. An
unawaited ``ctx.cleanup()`` cannot close it: it warns, and the browser ends with this process.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from hermes_async._asynclib import require_asyncio
from hermes_async._cleanup import bounded_cleanup
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.browser.errors import BrowserUnavailableError
from hermes_async.tools.browser.manager import (
    _describe,
    context_options,
    import_playwright,
    launch_browser,
    stop_browser,
)
from hermes_async.tools.browser.settings import INSTALL_HINT, BrowserSettings, find_chromium

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Playwright

    from hermes_async.tools.browser.session import BrowserSession

__all__ = ("StandaloneBrowser",)

logger = logging.getLogger(__name__)


class StandaloneBrowser:
    """The private, task-free owner of a standalone context's browser sessions."""

    def __init__(self, settings: BrowserSettings | None = None) -> None:
        self.settings = settings if settings is not None else BrowserSettings.from_env()
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._sessions: dict[str, tuple[BrowserContext, BrowserSession]] = {}
        self._lock = anyio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{sorted(self._sessions)}"
        return f"<StandaloneBrowser {state}>"

    async def get(self, task_id: str) -> BrowserSession:
        """``task_id``'s session, the browser started and the page opened on first use.

        Raises:
            ConfigError: Playwright or Chromium is missing, or the browser does not start.
            SandboxError: The owner was closed.
            BrowserUnavailableError: The page could not be opened.

        **Cancellation**: whatever was started for this call is closed (shielded, bounded).
        """
        require_asyncio(
            "ToolContext's browser methods",
            "playwright",
            remedy="leave the browser out of trio runs",
        )
        async with self._lock:
            if self._closed:
                raise SandboxError(
                    "this ToolContext was cleaned up; build a new ToolContext(task_id)",
                    task_id=task_id,
                )
            if task_id in self._sessions:
                return self._sessions[task_id][1]
            browser = self._browser or await self._start()
            return await self._open(task_id, browser)

    async def _start(self) -> Browser:
        executable = find_chromium(self.settings.executable_path)
        async_playwright = import_playwright()
        try:
            with anyio.fail_after(self.settings.launch_timeout):
                self._playwright = await async_playwright().start()
            self._browser = await launch_browser(self._playwright, self.settings, executable)
        except BaseException as exc:
            await self._shutdown("the browser did not start")
            if isinstance(exc, Exception):
                raise ConfigError(
                    f"could not start the browser {executable!r}: {_describe(exc)}; {INSTALL_HINT}"
                ) from exc
            raise
        return self._browser

    async def _open(self, task_id: str, browser: Browser) -> BrowserSession:
        from hermes_async.tools.browser.session import BrowserSession, SessionCounters

        settings = self.settings
        context: BrowserContext | None = None
        try:
            with anyio.fail_after(settings.create_timeout):
                context = await browser.new_context(**context_options(settings))
                session = BrowserSession(
                    task_id, context, None, settings=settings, counters=SessionCounters()
                )
                await session._setup()
        except BaseException as exc:
            if context is not None:
                await bounded_cleanup(
                    f"close the browser context of {task_id!r}",
                    context.close,
                    timeout=settings.close_timeout,
                    log=logger,
                )
            if isinstance(exc, Exception):
                raise BrowserUnavailableError(
                    f"could not open a browser page: {_describe(exc)}", task_id=task_id
                ) from exc
            raise
        self._sessions[task_id] = (context, session)
        return session

    async def release(self, task_id: str) -> None:
        """Close ``task_id``'s page and context; idempotent, never raises.

        **Cancellation**: shielded, bounded by ``close_timeout``.
        """
        entry = self._sessions.pop(task_id, None)
        if entry is None:
            return
        context, session = entry
        if session.dead is None:
            session.dead = BrowserUnavailableError(
                "this browser session was closed", task_id=task_id
            )
        await bounded_cleanup(
            f"close the browser context of {task_id!r}",
            context.close,
            timeout=self.settings.close_timeout,
            log=logger,
        )

    async def aclose(self) -> None:
        """Close every session, the browser and the driver; later ``get`` calls fail. Idempotent.

        **Cancellation**: each step is shielded and bounded.
        """
        self._closed = True
        for task_id in list(self._sessions):
            await self.release(task_id)
        await self._shutdown("the ToolContext was cleaned up")

    def close_now(self) -> bool:
        """Refuse later ``get`` calls (a synchronous cleanup); ``True`` if a browser still runs
        (only :meth:`aclose` can close it)."""
        self._closed = True
        return self.open

    @property
    def open(self) -> bool:
        """Whether a browser (or its driver) is running."""
        return self._playwright is not None

    async def _shutdown(self, reason: str) -> None:
        browser, self._browser = self._browser, None
        playwright, self._playwright = self._playwright, None
        await stop_browser(browser, playwright, self.settings.close_timeout, reason)
