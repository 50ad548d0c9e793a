"""The browser toolset: the reference's ``browser_*`` tools in a real headless Chromium.

Every request the page makes goes through the web tools' SSRF guard. Needs the
``browser`` extra (Playwright, asyncio only) and a system Chromium; without them the
tools are not offered.
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
