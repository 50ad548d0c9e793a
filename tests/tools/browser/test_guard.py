"""Acceptance: with the default guard, nothing the page does reaches loopback or private hosts.

The "allowed host" is ``shop.test``: the guard's resolver seam maps it to the loopback site and
the allowlist names it (a public host stand-in; the real network is closed here). A second
loopback server, ``counting``, counts every TCP connection it accepts; every test ends with
that count at 0. Chromium resolves nothing itself (``MAP * ~NOTFOUND``), so even a request that
escaped the route handler could not connect; these tests check both layers at once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest

from hermes_async.jsontypes import JSONObject
from hermes_async.tools.browser import BrowserManager
from hermes_async.tools.registry import ToolRuntime, dispatch
from tests.tools.browser.conftest import fake_resolver, settings_for_tests
from tests.tools.browser.site import Page, Site

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

SETTLE_SECONDS = 1.5


@pytest.fixture
async def guarded(browser_engine: str, site: Site) -> AsyncIterator[BrowserManager]:
    """A manager with the default guard: only the name ``shop.test`` is allowed."""
    resolver = fake_resolver(
        {
            "shop.test": ["127.0.0.1"],
            "localhost": ["127.0.0.1"],
            "internal.test": ["127.0.0.1"],
            "metadata.test": ["169.254.169.254"],
        }
    )
    async with BrowserManager(settings_for_tests(allow=("shop.test",), resolver=resolver)) as m:
        yield m


async def _call(runtime: ToolRuntime, name: str, **args: object) -> JSONObject:
    value = json.loads((await dispatch(name, args, runtime)).content)
    assert isinstance(value, dict)
    return value


async def test_navigation_to_loopback_metadata_and_private_addresses_is_refused(
    guarded: BrowserManager, site: Site, counting: Site
) -> None:
    site.pages = {"/": Page("<title>Shop</title><h1>Shop</h1>")}
    runtime = ToolRuntime(task_id="nav", browsers=guarded)
    p = counting.port
    refused = {
        f"http://127.0.0.1:{p}/": "loopback",
        f"http://localhost:{p}/": "loopback",
        f"http://internal.test:{p}/": "loopback",
        f"http://[::1]:{p}/": "loopback",
        f"http://[::ffff:127.0.0.1]:{p}/": "loopback",
        "http://169.254.169.254/latest/meta-data/": "link-local",
        "http://metadata.test/": "link-local",
        "http://10.1.2.3/": "private",
        "http://192.168.0.1/": "private",
        "http://0.0.0.0:80/": "",
        "file:///etc/passwd": "scheme",
    }
    for url, reason in refused.items():
        result = await _call(runtime, "browser_navigate", url=url)
        assert result["success"] is False, url
        assert result["error"].startswith("Blocked: refused"), result
        assert reason in result["error"], (url, result)
    # The allowed host works, and the page stays where it was after each refusal.
    ok = await _call(runtime, "browser_navigate", url=f"http://shop.test:{site.port}/")
    assert ok == {"success": True, "url": f"http://shop.test:{site.port}/", "title": "Shop"}
    assert counting.connections == 0
    assert [r.path for r in site.received] == ["/"]


async def test_a_page_on_an_allowed_host_cannot_embed_or_fetch_loopback(
    guarded: BrowserManager, site: Site, counting: Site
) -> None:
    target = f"http://127.0.0.1:{counting.port}"
    named = f"http://localhost:{counting.port}"
    page = f"""<title>Sneaky</title><h1>Sneaky</h1>
<img src="{target}/img.png"><script src="{named}/x.js"></script>
<link rel="stylesheet" href="{target}/s.css"><link rel="preconnect" href="{target}">
<link rel="dns-prefetch" href="{named}"><link rel="prefetch" href="{target}/pf">
<style>body {{ background: url({target}/bg.png) }} @import url({target}/i.css);</style>
<iframe src="{target}/frame"></iframe><video src="{target}/v.mp4" autoplay muted></video>
<a href="{target}/ping" ping="{target}/ping2" target="_blank" id="a">x</a>
<script>
  fetch("{target}/fetch").catch(() => console.log("fetch refused"));
  fetch("{named}/fetch2", {{mode: "no-cors"}}).catch(() => {{}});
  const x = new XMLHttpRequest(); x.open("GET", "{target}/xhr"); x.send();
  navigator.sendBeacon("{target}/beacon", "data");
  try {{ new EventSource("{target}/events") }} catch (e) {{}}
  try {{ new WebSocket("ws://127.0.0.1:{counting.port}/ws") }} catch (e) {{}}
  const code = `fetch("{target}/worker").catch(() => {{}});
    try {{ new WebSocket("ws://127.0.0.1:{counting.port}/wws") }} catch (e) {{}}`;
  new Worker(URL.createObjectURL(new Blob([code])));
  const img = new Image(); img.src = "{target}/js-img";
  document.getElementById("a").click();
</script>"""
    site.pages = {"/": Page(page)}
    runtime = ToolRuntime(task_id="embed", browsers=guarded)
    result = await _call(runtime, "browser_navigate", url=f"http://shop.test:{site.port}/")
    assert result["success"] is True, result
    await anyio.sleep(SETTLE_SECONDS)
    assert counting.connections == 0
    console = await _call(runtime, "browser_console")
    blocked = [m["text"] for m in console["console_messages"] if m["source"] == "network"]
    assert any(f"{target}/fetch" in m and "loopback" in m for m in blocked), blocked
    assert any("WebSocket" in m for m in blocked), blocked
    stats = guarded.statistics()
    assert stats.requests_blocked >= 5
    assert stats.websockets_refused >= 1


async def test_a_script_navigation_and_a_form_post_to_loopback_are_refused(
    guarded: BrowserManager, site: Site, counting: Site
) -> None:
    target = f"http://127.0.0.1:{counting.port}"
    site.pages = {
        "/": Page(
            "<title>Start</title><form id=f method=post action="
            f"'{target}/steal'><input name=a value=1></form>"
            "<button onclick=\"document.getElementById('f').submit()\">post</button>"
            f"<button onclick=\"location.href='{target}/go'\">go</button>"
            f"<button onclick=\"window.open('{target}/popup')\">open</button>"
        )
    }
    runtime = ToolRuntime(task_id="js-nav", browsers=guarded)
    for name in ("post", "go", "open"):
        await _call(runtime, "browser_navigate", url=f"http://shop.test:{site.port}/")
        snapshot = (await _call(runtime, "browser_snapshot"))["snapshot"]
        line = next(line for line in snapshot.splitlines() if f'button "{name}"' in line)
        ref = "@" + line.split("[ref=")[1].split("]")[0]
        assert (await _call(runtime, "browser_click", ref=ref))["success"] is True
    await anyio.sleep(SETTLE_SECONDS)
    assert counting.connections == 0
    assert guarded.statistics().requests_blocked >= 3


async def test_a_redirect_from_an_allowed_host_to_loopback_is_refused(
    guarded: BrowserManager, site: Site, counting: Site
) -> None:
    target = f"http://127.0.0.1:{counting.port}/admin"
    site.pages = {
        "/go": Page("", status=302, headers=(("Location", target),)),
        "/go-named": Page(
            "", status=307, headers=(("Location", f"http://localhost:{counting.port}/"),)
        ),
        "/hop": Page("", status=301, headers=(("Location", "/go"),)),
        "/img-redirect": Page("", status=302, headers=(("Location", target + ".png"),)),
        "/page": Page("<title>Images</title><h1>Images</h1><img src='/img-redirect'>"),
        "/fine": Page("", status=303, headers=(("Location", "/page"),)),
    }
    runtime = ToolRuntime(task_id="redirect", browsers=guarded)
    origin = f"http://shop.test:{site.port}"
    for path in ("/go", "/go-named", "/hop"):
        result = await _call(runtime, "browser_navigate", url=origin + path)
        assert result["success"] is False, result
        assert "redirect from" in result["error"] and "loopback" in result["error"], result
    # A redirect that stays on the allowed host is followed (the page URL is the final one),
    # and a subresource redirected to loopback is refused.
    fine = await _call(runtime, "browser_navigate", url=origin + "/fine")
    assert fine == {"success": True, "url": origin + "/page", "title": "Images"}
    await anyio.sleep(0.5)
    assert counting.connections == 0
    console = await _call(runtime, "browser_console")
    assert any(
        "redirect from" in m["text"] and "/img-redirect" in m["text"]
        for m in console["console_messages"]
    ), console


async def test_webrtc_cannot_send_udp_or_tcp_to_loopback(
    guarded: BrowserManager, site: Site, counting: Site
) -> None:
    async with await anyio.create_udp_socket(local_host="127.0.0.1") as udp:
        udp_port = udp.extra(anyio.abc.SocketAttribute.local_port)
        packets = 0

        async def count_udp() -> None:
            nonlocal packets
            async for _ in udp:
                packets += 1

        site.pages = {
            "/": Page(
                "<title>rtc</title><script>"
                "const pc = new RTCPeerConnection({iceServers: ["
                f"{{urls: 'stun:127.0.0.1:{udp_port}'}},"
                f"{{urls: 'turn:127.0.0.1:{counting.port}?transport=tcp', username: 'u', "
                "credential: 'p'}]});"
                "pc.createDataChannel('x');"
                "pc.createOffer().then(o => pc.setLocalDescription(o));"
                "</script>"
            )
        }
        async with anyio.create_task_group() as tg:
            tg.start_soon(count_udp)
            runtime = ToolRuntime(task_id="rtc", browsers=guarded)
            await _call(runtime, "browser_navigate", url=f"http://shop.test:{site.port}/")
            await anyio.sleep(2.5)
            tg.cancel_scope.cancel("done counting")
    assert packets == 0
    assert counting.connections == 0
