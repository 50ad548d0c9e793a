"""One hostile page against the shared browser: its session's pages and heap are bounded.

Issue 38, B1: a page on an allowed host that opened popups without end grew the shared Chromium
by gigabytes and made every rollout's ``browser_snapshot`` time out. The page here is the kit's
(:data:`hermes_async.testing.hostile.POPUP_FLOOD_PAGE`).
"""

from __future__ import annotations

import anyio
import pytest

from hermes_async.testing.hostile import POPUP_FLOOD_PAGE
from hermes_async.tools.browser import BrowserManager
from hermes_async.tools.browser.session import _MAX_REFUSED_WAITING
from hermes_async.tools.browser.standalone import StandaloneBrowser
from tests.tools.browser.conftest import settings_for_tests
from tests.tools.browser.site import Page, Site

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

PLAIN = "<title>Plain</title><h1>Hello</h1><a href='/plain'>again</a>"
NEW_TAB = "<title>Links</title><a href='/plain' target='_blank'>open in a new tab</a>"
#: A page whose script keeps ~8 MB more of JavaScript heap every 100 ms.
GREEDY = """<title>Greedy</title><script>
const hold = []; setInterval(() => hold.push(new Float64Array(1 << 20).fill(1.5)), 100);
</script>"""


def live_pages(session: object) -> int:
    return sum(1 for p in session._pages if not p.is_closed())  # type: ignore[attr-defined]


async def test_popups_past_max_pages_are_closed_and_every_session_stays_usable(
    browser_engine: str, site: Site
) -> None:
    site.pages = {"/flood": Page(POPUP_FLOOD_PAGE), "/plain": Page(PLAIN)}
    settings = settings_for_tests(max_pages=3, max_session_heap_mb=4096)
    async with BrowserManager(settings) as manager:
        other = await manager.get("other")
        assert (await other.navigate(site.url("/plain")))["success"]
        flood = await manager.get("flood")
        assert (await flood.navigate(site.url("/flood")))["success"]
        counters = manager._counters
        assert counters is not None
        with anyio.fail_after(60):
            while counters.pages_refused < 20:
                assert live_pages(flood) <= 3
                await anyio.sleep(0.05)
        with anyio.fail_after(20):  # each within its action timeout, far below before
            assert (await other.snapshot())["success"]
            assert (await flood.snapshot())["success"]
        console = await flood.console()
        assert any("Blocked: a popup was closed" in m["text"] for m in console["console_messages"])
        assert (await flood.navigate(site.url("/plain")))["success"]


async def test_the_models_own_new_tab_replaces_the_oldest_page(
    browser_engine: str, site: Site
) -> None:
    site.pages = {"/links": Page(NEW_TAB), "/plain": Page(PLAIN)}
    async with BrowserManager(settings_for_tests(max_pages=2)) as manager:
        session = await manager.get("tabs")
        for _ in range(3):  # each click opens a tab; the session follows the newest
            assert (await session.navigate(site.url("/links")))["success"]
            snapshot = await session.snapshot()
            ref = next(
                line.split("[ref=")[1].split("]")[0]
                for line in snapshot["snapshot"].splitlines()
                if "open in a new tab" in line
            )
            assert (await session.click(f"@{ref}"))["success"]
            with anyio.fail_after(10):
                while "Hello" not in (await session.snapshot())["snapshot"]:
                    await anyio.sleep(0.05)
        assert live_pages(session) <= 2
        assert manager._counters is not None and manager._counters.pages_refused == 0


async def test_a_page_past_the_session_heap_bound_is_closed_and_the_session_goes_on(
    browser_engine: str, site: Site
) -> None:
    site.pages = {"/greedy": Page(GREEDY), "/plain": Page(PLAIN)}
    settings = settings_for_tests(max_session_heap_mb=64, memory_check_seconds=0.2)
    async with BrowserManager(settings) as manager:
        session = await manager.get("greedy")
        assert (await session.navigate(site.url("/greedy")))["success"]
        counters = manager._counters
        assert counters is not None
        with anyio.fail_after(60):
            while counters.heap_resets == 0:
                await anyio.sleep(0.1)
        console = await session.console()
        assert any("more than this session's 64 MB" in e["message"] for e in console["js_errors"])
        assert (await session.navigate(site.url("/plain")))["success"]
        assert (await session.snapshot())["success"]


async def test_a_standalone_session_closes_refused_popups_before_its_next_operation(
    browser_engine: str, site: Site
) -> None:
    # A standalone session has no task group to close them at once: they wait for its next call.
    site.pages = {"/flood": Page(POPUP_FLOOD_PAGE)}
    browser = StandaloneBrowser(settings_for_tests(max_pages=2))
    try:
        session = await browser.get("solo")
        assert (await session.navigate(site.url("/flood")))["success"]
        counters = session._counters
        with anyio.fail_after(60):  # more than it holds: the flood cannot grow the list
            while counters.pages_refused <= _MAX_REFUSED_WAITING:
                await anyio.sleep(0.05)
        waiting = list(session._refused_pages)
        assert len(waiting) == _MAX_REFUSED_WAITING
        assert not any(p.is_closed() for p in waiting)
        with anyio.fail_after(20):
            assert (await session.snapshot())["success"]
        assert all(p.is_closed() for p in waiting)
        assert live_pages(session) <= 2
    finally:
        await browser.aclose()
