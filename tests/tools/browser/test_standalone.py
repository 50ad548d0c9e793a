"""A standalone ``ToolContext(task_id)``'s browser methods, as reference reward code calls them.

Issue #34: ``ToolContext(task_id).browser_navigate(url)`` with no manager failed with
"ToolContext has no BrowserManager" while the terminal methods worked standalone. Now the
context owns a browser as it owns its sandbox, and closes both on cleanup.
"""

from __future__ import annotations

import gc

import anyio
import pytest

from hermes_async.agent import ToolContext
from hermes_async.errors import SandboxError
from hermes_async.tools.browser import current_browser_manager
from tests.tools.browser.procs import browser_processes
from tests.tools.browser.site import Page, Site

pytestmark = [pytest.mark.anyio, pytest.mark.browser]


@pytest.fixture
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_BROWSER_ALLOW", "127.0.0.1")  # the test site's address


async def _gone(before: set[int]) -> None:
    with anyio.fail_after(15):
        while set(browser_processes()) - before:
            await anyio.sleep(0.05)


async def test_a_standalone_context_browses_and_closes_its_browser(
    browser_engine: str, site: Site, loopback_allowed: None
) -> None:
    site.pages = {
        "/": Page('<title>Home</title><h1>Welcome</h1><a href="/next">Next</a>'),
        "/next": Page("<title>Next</title><p>Thank you</p>"),
    }
    before = set(browser_processes())
    assert current_browser_manager() is None
    ctx = ToolContext("solo-browser")  # no manager of any kind, as reference reward code does
    nav = await ctx.browser_navigate(site.url("/"))
    assert nav["success"] is True and nav["title"] == "Home"
    snap = await ctx.browser_snapshot()
    assert 'heading "Welcome"' in snap["snapshot"]  # the same page, between calls
    assert (await ctx.browser_navigate(site.url("/next")))["title"] == "Next"
    assert len(set(browser_processes()) - before) == 1
    await ctx.cleanup()
    await _gone(before)
    with pytest.raises(SandboxError, match="this ToolContext was cleaned up"):
        await ctx.browser_navigate(site.url("/"))
    assert set(browser_processes()) - before == set()  # nothing started again


async def test_unawaited_cleanup_of_a_standalone_browser_warns_and_aclose_closes_it(
    browser_engine: str, site: Site, loopback_allowed: None
) -> None:
    site.pages = {"/": Page("<title>Home</title>")}
    before = set(browser_processes())
    async with ToolContext("solo-browser-2") as ctx:
        assert (await ctx.browser_navigate(site.url("/")))["success"] is True
        with pytest.warns(RuntimeWarning, match=r"not awaited: its browser cannot be closed"):
            ctx.cleanup()  # reference style, no await: a browser needs one
            gc.collect()
        with pytest.raises(SandboxError, match="cleaned up"):  # as the sandbox: refused now
            await ctx.browser_snapshot()
    await _gone(before)  # the block's exit closed it
