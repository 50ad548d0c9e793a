"""What ``ToolContext.browser_navigate`` / ``browser_snapshot`` run: the rollout's own session.

Reward code reaches the session the model used (same page, cookies, history), as in the
reference. The functions take the manager explicitly or use the current one. The tools'
result dicts are returned, ``{"success": false}`` included; a missing manager, a lost
browser, trio and cancellation are raised.
"""

from __future__ import annotations

from hermes_async._asynclib import require_asyncio
from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.browser.manager import BrowserManager, current_browser_manager
from hermes_async.tools.browser.standalone import StandaloneBrowser

__all__ = ("context_browser_navigate", "context_browser_snapshot")


def _manager(
    task_id: str, manager: BrowserManager | StandaloneBrowser | None
) -> BrowserManager | StandaloneBrowser:
    require_asyncio(
        "ToolContext's browser methods", "playwright", remedy="leave the browser out of trio runs"
    )
    chosen = manager if manager is not None else current_browser_manager()
    if chosen is None:
        raise SandboxError(
            "ToolContext has no BrowserManager: pass it explicitly or run inside "
            "`async with open_browser_manager(...):` (or `with use_browser_manager(m):`)",
            task_id=task_id,
        )
    return chosen


async def context_browser_navigate(
    task_id: str, url: str, *, manager: BrowserManager | StandaloneBrowser | None = None
) -> JSONObject:
    """Navigate the rollout's page to ``url``; the ``browser_navigate`` result dict.

    Raises:
        SandboxError: No manager was given and none is current.
        BrowserUnavailableError: The rollout's browser session was lost.

    **Cancellation**: the navigation is abandoned; the session stays usable.
    """
    session = await _manager(task_id, manager).get(task_id)
    return await session.navigate(url)


async def context_browser_snapshot(
    task_id: str, full: bool = False, *, manager: BrowserManager | StandaloneBrowser | None = None
) -> JSONObject:
    """The rollout page's accessibility snapshot; the ``browser_snapshot`` result dict.

    Raises:
        SandboxError: No manager was given and none is current.
        BrowserUnavailableError: The rollout's browser session was lost.

    **Cancellation**: nothing to clean up.
    """
    session = await _manager(task_id, manager).get(task_id)
    return await session.snapshot(full=full)
