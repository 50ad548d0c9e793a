"""The browser toolset: the reference's ``browser_*`` tools in a real headless Chromium.

* :class:`BrowserManager` — one browser process, one context per rollout, behind the
  ``browser_sessions`` limiter; released explicitly, on idle and at exit; restarted after a
  crash (:class:`BrowserUnavailableError` for the sessions it took with it).
* :data:`TOOLS` — ``browser_navigate``, ``browser_snapshot``, ``browser_click``,
  ``browser_type``, ``browser_scroll``, ``browser_back``, ``browser_press``,
  ``browser_get_images``, ``browser_vision``, ``browser_console`` (toolset ``browser``).
* :class:`BrowserSettings` — executable, SSRF allowlist, timeouts, caps (``from_env``).
* :func:`context_browser_navigate` / :func:`context_browser_snapshot` — what ``ToolContext``'s
  browser methods run.

Safety: every request the page makes goes through the SSRF guard of the web tools (vetted,
address-pinned, capped); Chromium cannot resolve or reach anything by itself. See
:mod:`hermes_async.tools.browser.settings` and :mod:`hermes_async.tools.browser._network`.

Needs the ``browser`` extra (Playwright) and a Chromium executable (Debian's ``chromium``; never
downloaded). This package imports without them; the tools are then not offered, and opening a
manager is a :class:`~hermes_async.errors.ConfigError` that says what to install. Playwright
is asyncio-only.
"""

from __future__ import annotations

from hermes_async.tools.browser.context import context_browser_navigate, context_browser_snapshot
from hermes_async.tools.browser.errors import BrowserUnavailableError
from hermes_async.tools.browser.manager import (
    BROWSER_LIMITER_NAME,
    BrowserManager,
    BrowserManagerStatistics,
    current_browser_manager,
    open_browser_manager,
    use_browser_manager,
)
from hermes_async.tools.browser.settings import BrowserSettings, VisionSettings, find_chromium
from hermes_async.tools.browser.tools import BROWSER_TOOL_NAMES, TOOLS, browser_available

__all__ = (
    "BROWSER_LIMITER_NAME",
    "BROWSER_TOOL_NAMES",
    "TOOLS",
    "BrowserManager",
    "BrowserManagerStatistics",
    "BrowserSettings",
    "BrowserUnavailableError",
    "VisionSettings",
    "browser_available",
    "context_browser_navigate",
    "context_browser_snapshot",
    "current_browser_manager",
    "find_chromium",
    "open_browser_manager",
    "use_browser_manager",
)
