"""The browser tools against the real Chromium and pages served on loopback (allowlisted)."""

from __future__ import annotations

import json
import re

import anyio
import httpx
import pytest

from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tools.browser import (
    BrowserManager,
    VisionSettings,
    context_browser_navigate,
    context_browser_snapshot,
    use_browser_manager,
)
from hermes_async.tools.browser._vision import VISION_UNAVAILABLE
from hermes_async.tools.registry import ToolRuntime, dispatch
from tests.tools.browser.conftest import settings_for_tests
from tests.tools.browser.site import Page, Received, Site

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

HOME = """<title>Home</title>
<h1>Welcome</h1>
<p>Some intro text.</p>
<a href="/form">Contact form</a>
<img src="/logo.png" alt="Company logo">
<img src="data:image/png;base64,iVBORw0KGgo=" alt="inline">
<script>console.log('home loaded'); console.warn('careful');
setTimeout(() => { throw new Error('boom in a timer') }, 0);</script>
"""
FORM = """<title>Contact</title>
<h1>Contact us</h1>
<form action="/submit" method="post">
  <label>Name <input name="name"></label>
  <label>Email <input name="email" type="email"></label>
  <button type="submit">Send</button>
</form>"""
# A 1x1 transparent PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


def _thanks(request: Received) -> Page:
    fields = dict(pair.split("=", 1) for pair in request.body.decode().split("&") if pair)
    return Page(f"<title>Thanks</title><p>Thank you, {fields.get('name', '?')}!</p>")


def _serve_shop(site: Site) -> None:
    site.pages = {
        "/": Page(HOME),
        "/form": Page(FORM),
        "/submit": _thanks,
        "/logo.png": Page(PNG, content_type="image/png"),
        "/long": Page(
            "<title>Long</title>" + "".join(f"<p>para {i} " + "x" * 80 for i in range(400))
        ),
        "/tall": Page("<title>Tall</title><div style='height:5000px'>top</div><p>bottom</p>"),
    }


def _ref(snapshot: str, pattern: str) -> str:
    """The ``@eN`` of the first snapshot line matching ``pattern``."""
    for line in snapshot.splitlines():
        if re.search(pattern, line):
            match = re.search(r"\[ref=(e\d+)\]", line)
            assert match, line
            return "@" + match.group(1)
    raise AssertionError(f"no line matches {pattern!r} in:\n{snapshot}")


async def _call(runtime: ToolRuntime, name: str, **args: object) -> JSONObject:
    outcome = await dispatch(name, args, runtime)
    value = json.loads(outcome.content)
    assert isinstance(value, dict)
    return value


async def test_navigate_and_snapshot_with_stable_refs(manager: BrowserManager, site: Site) -> None:
    _serve_shop(site)
    runtime = ToolRuntime(task_id="t1", browsers=manager)
    nav = await _call(runtime, "browser_navigate", url=site.url("/"))
    assert nav == {"success": True, "url": site.url("/"), "title": "Home"}
    first = await _call(runtime, "browser_snapshot")
    assert first["success"] is True
    text = first["snapshot"]
    assert 'heading "Welcome"' in text and "Some intro text." in text
    link = _ref(text, r'link "Contact form"')
    assert first["element_count"] >= 4
    # The same element keeps its ref in a later snapshot (compact or full).
    again = await _call(runtime, "browser_snapshot", full=True)
    assert _ref(again["snapshot"], r'link "Contact form"') == link
    # The compact view drops unnamed containers; the full one keeps them.
    assert "- generic" in again["snapshot"] and "- generic" not in text


async def test_click_a_link_type_into_a_form_submit_and_go_back(
    manager: BrowserManager, site: Site
) -> None:
    _serve_shop(site)
    runtime = ToolRuntime(task_id="t-form", browsers=manager)
    await _call(runtime, "browser_navigate", url=site.url("/"))
    home = (await _call(runtime, "browser_snapshot"))["snapshot"]
    clicked = await _call(runtime, "browser_click", ref=_ref(home, "Contact form"))
    assert clicked == {"success": True, "clicked": _ref(home, "Contact form")}
    form = (await _call(runtime, "browser_snapshot"))["snapshot"]
    assert 'heading "Contact us"' in form
    name, email = _ref(form, r'textbox "Name"'), _ref(form, r'textbox "Email"')
    typed = await _call(runtime, "browser_type", ref=name, text="Ada Lovelace")
    assert typed == {"success": True, "typed": "Ada Lovelace", "element": name}
    # Refs are accepted without the "@" too; typing replaces what was there.
    await _call(runtime, "browser_type", ref=email[1:], text="wrong@example.com")
    await _call(runtime, "browser_type", ref=email, text="ada@example.com")
    await _call(runtime, "browser_click", ref=_ref(form, r'button "Send"'))
    done = (await _call(runtime, "browser_snapshot"))["snapshot"]
    assert "Thank you, Ada+Lovelace!" in done
    posted = [r for r in site.received if r.path == "/submit"]
    assert len(posted) == 1 and posted[0].method == "POST"
    assert b"email=ada%40example.com" in posted[0].body
    back = await _call(runtime, "browser_back")
    assert back == {"success": True, "url": site.url("/form")}


async def test_press_enter_submits_and_unknown_refs_and_keys_are_model_errors(
    manager: BrowserManager, site: Site
) -> None:
    _serve_shop(site)
    runtime = ToolRuntime(task_id="t-press", browsers=manager)
    await _call(runtime, "browser_navigate", url=site.url("/form"))
    form = (await _call(runtime, "browser_snapshot"))["snapshot"]
    await _call(runtime, "browser_type", ref=_ref(form, 'textbox "Name"'), text="Grace")
    await _call(runtime, "browser_click", ref=_ref(form, 'textbox "Name"'))
    assert await _call(runtime, "browser_press", key="Enter") == {
        "success": True,
        "pressed": "Enter",
    }
    assert "Thank you, Grace!" in (await _call(runtime, "browser_snapshot"))["snapshot"]
    unknown = await _call(runtime, "browser_click", ref="@e999")
    assert unknown["success"] is False and "Unknown ref '@e999'" in unknown["error"]
    bad_key = await _call(runtime, "browser_press", key="NoSuchKey")
    assert bad_key["success"] is False and "Failed to press NoSuchKey" in bad_key["error"]


async def test_console_messages_page_errors_and_clear(manager: BrowserManager, site: Site) -> None:
    _serve_shop(site)
    runtime = ToolRuntime(task_id="t-console", browsers=manager)
    await _call(runtime, "browser_navigate", url=site.url("/"))
    await _call(runtime, "browser_snapshot")  # gives the timer a moment to throw
    console = await _call(runtime, "browser_console")
    assert console["success"] is True
    messages = [(m["type"], m["text"], m["source"]) for m in console["console_messages"]]
    assert ("log", "home loaded", "console") in messages
    assert ("warning", "careful", "console") in messages
    assert console["total_messages"] == len(console["console_messages"])
    assert any("boom in a timer" in e["message"] for e in console["js_errors"])
    assert console["total_errors"] == len(console["js_errors"]) >= 1
    await _call(runtime, "browser_console", clear=True)
    empty = await _call(runtime, "browser_console")
    assert empty["total_messages"] == 0 and empty["total_errors"] == 0


async def test_images_scroll_and_long_snapshots(manager: BrowserManager, site: Site) -> None:
    _serve_shop(site)
    runtime = ToolRuntime(task_id="t-img", browsers=manager)
    await _call(runtime, "browser_navigate", url=site.url("/"))
    images = await _call(runtime, "browser_get_images")
    assert images == {
        "success": True,
        "images": [{"src": site.url("/logo.png"), "alt": "Company logo", "width": 1, "height": 1}],
        "count": 1,
    }
    await _call(runtime, "browser_navigate", url=site.url("/tall"))
    session = await manager.get("t-img")
    assert await _call(runtime, "browser_scroll", direction="down") == {
        "success": True,
        "scrolled": "down",
    }
    page = session._pages[-1]
    assert await page.evaluate("window.scrollY") > 500
    await _call(runtime, "browser_scroll", direction="up")
    assert await page.evaluate("window.scrollY") == 0
    # The schema's enum stops a bad direction in the dispatcher; the session checks it too.
    assert "error" in await _call(runtime, "browser_scroll", direction="sideways")
    assert (await session.scroll("sideways"))["success"] is False
    await _call(runtime, "browser_navigate", url=site.url("/long"))
    long = await _call(runtime, "browser_snapshot")
    assert long["snapshot"].endswith("\n\n[... content truncated ...]")
    assert len(long["snapshot"]) <= 8_000 + len("\n\n[... content truncated ...]")


async def test_vision_unavailable_without_a_model_and_answers_with_one(
    browser_engine: str, site: Site
) -> None:
    _serve_shop(site)
    async with BrowserManager(settings_for_tests()) as manager:
        runtime = ToolRuntime(task_id="v", browsers=manager)
        await _call(runtime, "browser_navigate", url=site.url("/"))
        assert await _call(runtime, "browser_vision", question="what?") == {
            "success": False,
            "error": VISION_UNAVAILABLE,
        }
    seen: list[JSONObject] = []

    def vision_server(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        assert request.headers["authorization"] == "Bearer sk-vision"
        return httpx.Response(
            200, json={"choices": [{"message": {"content": "A page that says Welcome."}}]}
        )

    vision = VisionSettings(
        base_url="http://vision.test/v1",
        model="tiny-vlm",
        api_key="sk-vision",
        transport=httpx.MockTransport(vision_server),
    )
    async with BrowserManager(settings_for_tests(vision=vision)) as manager:
        runtime = ToolRuntime(task_id="v", browsers=manager)
        await _call(runtime, "browser_navigate", url=site.url("/"))
        answer = await _call(runtime, "browser_vision", question="What does it say?")
    assert answer == {"success": True, "analysis": "A page that says Welcome."}
    content = seen[0]["messages"][0]["content"]
    assert "What does it say?" in content[0]["text"]
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")


async def test_tools_find_the_current_manager_and_report_a_missing_one(
    manager: BrowserManager, site: Site
) -> None:
    _serve_shop(site)
    runtime = ToolRuntime(task_id="cur")
    missing = await _call(runtime, "browser_navigate", url=site.url("/"))
    assert missing["success"] is False and "no BrowserManager" in missing["error"]
    with use_browser_manager(manager):
        assert (await _call(runtime, "browser_navigate", url=site.url("/")))["success"] is True
        # The reward's ToolContext functions reach the same session (same page).
        snap = await context_browser_snapshot("cur")
        assert 'heading "Welcome"' in snap["snapshot"]
        nav = await context_browser_navigate("cur", site.url("/form"))
    assert nav["title"] == "Contact"
    snap = await context_browser_snapshot("cur", manager=manager)
    assert 'heading "Contact us"' in snap["snapshot"]


async def test_sessions_are_isolated_and_limited_by_the_named_limiter(
    browser_engine: str, site: Site
) -> None:
    site.pages = {
        "/set": Page("<title>set</title>", headers=(("Set-Cookie", "who=alice; Path=/"),)),
        "/who": lambda r: Page(f"<title>{r.headers.get('cookie', 'nobody')}</title>"),
    }
    limits = Limits(browser_sessions=2)
    async with BrowserManager(settings_for_tests(), limits=limits) as manager:
        assert manager.limiter is limits["browser_sessions"]
        a = await manager.get("a")
        b = await manager.get("b")
        await a.navigate(site.url("/set"))
        assert (await a.navigate(site.url("/who")))["title"] == "who=alice"
        assert (await b.navigate(site.url("/who")))["title"] == "nobody"
        assert limits["browser_sessions"].statistics().in_use == 2
        assert manager.statistics().open_contexts == 2
        await manager.release("a")
        assert limits["browser_sessions"].statistics().in_use == 1
        assert manager.statistics().open_contexts == 1
        # A new session for "a" starts clean.
        again = await manager.get("a")
        assert (await again.navigate(site.url("/who")))["title"] == "nobody"


async def test_downloads_are_refused_and_service_workers_never_registered(
    manager: BrowserManager, site: Site
) -> None:
    site.pages = {
        "/": Page(
            "<title>sw</title><script>navigator.serviceWorker.register('/sw.js')"
            ".catch(() => {})</script>"
        ),
        "/sw.js": Page("self.onfetch = () => {}", content_type="text/javascript"),
        "/file.zip": Page(
            b"PK\x03\x04",
            content_type="application/zip",
            headers=(("Content-Disposition", "attachment; filename=f.zip"),),
        ),
    }
    runtime = ToolRuntime(task_id="dl", browsers=manager)
    assert (await _call(runtime, "browser_navigate", url=site.url("/")))["success"]
    download = await _call(runtime, "browser_navigate", url=site.url("/file.zip"))
    assert download["success"] is False and "downloads are disabled" in download["error"]
    assert "/sw.js" not in [r.path for r in site.received]


def test_console_results_keep_the_newest_entries_within_the_budget() -> None:
    pytest.importorskip("playwright")
    from hermes_async.tools.browser.session import _newest_within

    entries: list[JSONObject] = [{"text": f"{i:03d}" + "x" * 96} for i in range(50)]
    kept = _newest_within(entries, "text", 1_000)
    assert [e["text"][:3] for e in kept] == [f"{i:03d}" for i in range(40, 50)]
    assert _newest_within(entries, "text", 10) == []


async def test_tool_context_browser_methods_use_the_rollouts_session(
    manager: BrowserManager, site: Site
) -> None:
    from hermes_async.agent import ToolContext

    _serve_shop(site)
    runtime = ToolRuntime(task_id="ctx", browsers=manager)
    assert (await _call(runtime, "browser_navigate", url=site.url("/")))["success"] is True
    ctx = ToolContext("ctx", browsers=manager)
    snap = await ctx.browser_snapshot()
    assert 'heading "Welcome"' in snap["snapshot"]  # the page the model's tool opened
    nav = await ctx.browser_navigate(site.url("/form"))
    assert nav["title"] == "Contact"
    assert manager.statistics().open_contexts == 1
    await ctx.cleanup()  # releases the browser session with the sandbox
    assert manager.statistics().sessions == 0
    with anyio.fail_after(10):  # the context itself closes in its session's task
        while manager.statistics().open_contexts:
            await anyio.sleep(0.05)
