"""The browser tools (toolset ``browser``): the reference's names, schemas and result shapes.

A lost browser raises ``BrowserUnavailableError``: the model is told, and a rollout of the
rollout core ends as ``infra``, as with a lost sandbox. The tools are offered only with
Playwright and a Chromium (:func:`browser_available`); under trio they raise
``AsyncBackendError``. Results and differences from the reference: docs/architecture.md,
"The browser tools' results".
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from hermes_async._asynclib import require_asyncio
from hermes_async.errors import ConfigError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.browser._vision import VISION_UNAVAILABLE, VisionError, analyze_screenshot
from hermes_async.tools.browser.errors import BrowserUnavailableError
from hermes_async.tools.browser.manager import BrowserManager, current_browser_manager
from hermes_async.tools.browser.settings import find_chromium
from hermes_async.tools.registry import Tool, ToolRuntime
from hermes_async.tools.toolsets import TOOLSETS

if TYPE_CHECKING:
    from hermes_async.tools.browser.session import BrowserSession

__all__ = ("BROWSER_TOOL_NAMES", "TOOLS", "browser_available")

#: The toolset's tools, in the reference's order (the ``browser`` toolset's own tools; it
#: adds ``web_search``).
BROWSER_TOOL_NAMES: tuple[str, ...] = tuple(
    name for name in TOOLSETS["browser"].tools if name.startswith("browser_")
)

#: What the model sees when the rollout has no browser manager.
_NO_MANAGER_MESSAGE = (
    "Browser tools are not available in this rollout: no BrowserManager is configured (the "
    "environment opens one with `open_browser_manager()` or passes ToolRuntime(browsers=...))"
)


def browser_available() -> bool:
    """Whether the browser tools can run: Playwright installed and a Chromium found."""
    try:
        if importlib.util.find_spec("playwright") is None:
            return False
    except (ImportError, ValueError):  # a stubbed-out module (sys.modules[...] = None)
        return False
    try:
        find_chromium()
    except ConfigError:
        return False
    return True


def _runtime_browser_manager(runtime: ToolRuntime) -> BrowserManager | None:
    """The manager the rollout's browser tools use: ``runtime.browsers``, else the current."""
    manager = getattr(runtime, "browsers", None)
    return manager if isinstance(manager, BrowserManager) else current_browser_manager()


def _failure(message: str) -> JSONObject:
    return {"success": False, "error": message}


async def _session(runtime: ToolRuntime) -> BrowserSession | None:
    require_asyncio(
        "the browser tools", "playwright", remedy="leave the 'browser' toolset out of trio runs"
    )
    manager = _runtime_browser_manager(runtime)
    if manager is None:
        return None
    return await manager.get(runtime.task_id)


def _handler(
    operation: Callable[[BrowserSession, JSONObject], Awaitable[JSONObject]],
) -> Callable[[JSONObject, ToolRuntime], Awaitable[JSONObject]]:
    async def handle(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
        session = await _session(runtime)
        if session is None:
            return _failure(_NO_MANAGER_MESSAGE)
        return await operation(session, args)

    return handle


async def _navigate(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.navigate(str(args["url"]))


async def _snapshot(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.snapshot(full=bool(args.get("full", False)))


async def _click(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.click(str(args["ref"]))


async def _type(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.type(str(args["ref"]), str(args["text"]))


async def _scroll(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.scroll(str(args["direction"]))


async def _back(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.back()


async def _press(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.press(str(args["key"]))


async def _images(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.images()


async def _console(session: BrowserSession, args: JSONObject) -> JSONObject:
    return await session.console(clear=bool(args.get("clear", False)))


async def _vision(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    require_asyncio(
        "the browser tools", "playwright", remedy="leave the 'browser' toolset out of trio runs"
    )
    manager = _runtime_browser_manager(runtime)
    if manager is None:
        return _failure(_NO_MANAGER_MESSAGE)
    vision = manager.settings.vision
    if vision is None:
        return _failure(VISION_UNAVAILABLE)
    session = await manager.get(runtime.task_id)
    try:
        png = await session.screenshot()
    except BrowserUnavailableError:
        raise
    except Exception as exc:  # Playwright's error (not imported here: the extra is optional)
        return _failure(f"Failed to take screenshot: {str(exc).strip().splitlines()[0][:500]}")
    try:
        analysis = await analyze_screenshot(vision, str(args["question"]), png)
    except VisionError as exc:
        return _failure(f"Error during vision analysis: {exc}")
    return {"success": True, "analysis": analysis}


def _object(properties: JSONObject, required: list[str]) -> JSONObject:
    return {"type": "object", "properties": properties, "required": required}


_NAVIGATE = Tool(
    "browser_navigate",
    "Navigate to a URL in the browser. Initializes the session and loads the page. Must be "
    "called before other browser tools. For simple information retrieval, prefer web_search or "
    "web_extract (faster, cheaper). Use browser tools when you need to interact with a page "
    "(click, fill forms, dynamic content).",
    _object(
        {
            "url": {
                "type": "string",
                "description": "The URL to navigate to (e.g., 'https://example.com')",
            }
        },
        ["url"],
    ),
    _handler(_navigate),
    "browser",
    available=browser_available,
)
_SNAPSHOT = Tool(
    "browser_snapshot",
    "Get a text-based snapshot of the current page's accessibility tree. Returns interactive "
    "elements with ref IDs (like @e1, @e2) for browser_click and browser_type. full=false "
    "(default): compact view with interactive elements. full=true: complete page content. "
    "Snapshots over 8000 chars are truncated. Requires browser_navigate first.",
    _object(
        {
            "full": {
                "type": "boolean",
                "description": "If true, returns complete page content. If false (default), "
                "returns compact view with interactive elements only.",
                "default": False,
            }
        },
        [],
    ),
    _handler(_snapshot),
    "browser",
    available=browser_available,
)
_CLICK = Tool(
    "browser_click",
    "Click on an element identified by its ref ID from the snapshot (e.g., '@e5'). The ref IDs "
    "are shown in square brackets in the snapshot output. Requires browser_navigate and "
    "browser_snapshot to be called first.",
    _object(
        {
            "ref": {
                "type": "string",
                "description": "The element reference from the snapshot (e.g., '@e5', '@e12')",
            }
        },
        ["ref"],
    ),
    _handler(_click),
    "browser",
    available=browser_available,
)
_TYPE = Tool(
    "browser_type",
    "Type text into an input field identified by its ref ID. Clears the field first, then "
    "types the new text. Requires browser_navigate and browser_snapshot to be called first.",
    _object(
        {
            "ref": {
                "type": "string",
                "description": "The element reference from the snapshot (e.g., '@e3')",
            },
            "text": {"type": "string", "description": "The text to type into the field"},
        },
        ["ref", "text"],
    ),
    _handler(_type),
    "browser",
    available=browser_available,
)
_SCROLL = Tool(
    "browser_scroll",
    "Scroll the page in a direction. Use this to reveal more content that may be below or "
    "above the current viewport. Requires browser_navigate to be called first.",
    _object(
        {
            "direction": {
                "type": "string",
                "enum": ["up", "down"],
                "description": "Direction to scroll",
            }
        },
        ["direction"],
    ),
    _handler(_scroll),
    "browser",
    available=browser_available,
)
_BACK = Tool(
    "browser_back",
    "Navigate back to the previous page in browser history. Requires browser_navigate to be "
    "called first.",
    _object({}, []),
    _handler(_back),
    "browser",
    available=browser_available,
)
_PRESS = Tool(
    "browser_press",
    "Press a keyboard key. Useful for submitting forms (Enter), navigating (Tab), or keyboard "
    "shortcuts. Requires browser_navigate to be called first.",
    _object(
        {
            "key": {
                "type": "string",
                "description": "Key to press (e.g., 'Enter', 'Tab', 'Escape', 'ArrowDown')",
            }
        },
        ["key"],
    ),
    _handler(_press),
    "browser",
    available=browser_available,
)
_IMAGES = Tool(
    "browser_get_images",
    "Get a list of all images on the current page with their URLs and alt text. Useful for "
    "finding images to analyze with the vision tool. Requires browser_navigate to be called "
    "first.",
    _object({}, []),
    _handler(_images),
    "browser",
    available=browser_available,
)
_VISION = Tool(
    "browser_vision",
    "Take a screenshot of the current page and analyze it with vision AI. Use this when you "
    "need to visually understand what's on the page - especially useful for CAPTCHAs, visual "
    "verification challenges, complex layouts, or when the text snapshot doesn't capture "
    "important visual information. Requires browser_navigate to be called first.",
    _object(
        {
            "question": {
                "type": "string",
                "description": "What you want to know about the page visually. Be specific "
                "about what you're looking for.",
            }
        },
        ["question"],
    ),
    _vision,
    "browser",
    available=browser_available,
)
_CONSOLE = Tool(
    "browser_console",
    "Get browser console output and JavaScript errors from the current page. Returns "
    "console.log/warn/error/info messages and uncaught JS exceptions. Use this to detect silent "
    "JavaScript errors, failed API calls, and application warnings. Requires browser_navigate "
    "to be called first.",
    _object(
        {
            "clear": {
                "type": "boolean",
                "default": False,
                "description": "If true, clear the message buffers after reading",
            }
        },
        [],
    ),
    _handler(_console),
    "browser",
    available=browser_available,
)

#: The built-in browser tools, registered by ``hermes_async.tools.registry``.
TOOLS: tuple[Tool, ...] = (
    _NAVIGATE,
    _SNAPSHOT,
    _CLICK,
    _TYPE,
    _SCROLL,
    _BACK,
    _PRESS,
    _IMAGES,
    _VISION,
    _CONSOLE,
)
