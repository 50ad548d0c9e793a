"""One hostile page in the shared browser: Chromium's memory, and whether the sessions stay usable.

Session ``flood`` loads :data:`hermes_async.testing.hostile.POPUP_FLOOD_PAGE` (20 popups every
250 ms, each holding a few MB, and the page itself growing), session ``plain`` a small page. For
``--seconds`` (default 30) the PSS of every Chromium process below this one is sampled every
second; then each session takes a snapshot. Reported: PSS at start, peak and end, the pages the
flood session holds, and how long each snapshot took (or its error).

The page is loaded from this tree's kit by path, so the script runs against another tree's
browser code too (``PYTHONPATH=/other/tree``): the same page, before and after.

    PYTHONPATH=. .venv/bin/python bench/browser_popups.py [--seconds 30]

Needs the ``browser`` extra and a Chromium (``scripts/browser/install.sh``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser import chromium_pss_mb  # this folder's bench/browser.py

from hermes_async.tools.browser import BrowserManager, BrowserSettings

_KIT = Path(__file__).resolve().parent.parent / "hermes_async" / "testing" / "hostile.py"
PLAIN = (
    "<html><head><title>plain</title></head><body><h1>Hello</h1><a href='/x'>x</a></body></html>"
)


def _flood_page() -> str:
    spec = importlib.util.spec_from_file_location("_hostile_kit", _KIT)
    assert spec is not None and spec.loader is not None
    kit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit)
    page: str = kit.POPUP_FLOOD_PAGE
    return page


def _settings(flood: str) -> BrowserSettings:
    def handle(request: httpx.Request) -> httpx.Response:
        body = flood if request.url.path == "/flood" else PLAIN
        return httpx.Response(200, text=body, headers={"content-type": "text/html"})

    async def resolve(host: str, port: int) -> list[str]:
        return ["93.184.215.14"]  # public: the guard lets it through; the transport answers

    return BrowserSettings(
        transport=httpx.MockTransport(handle),
        resolver=resolve,
        idle_timeout=None,
        action_timeout=30.0,
    )


async def _snapshot(session: object) -> str:
    start = time.perf_counter()
    try:
        with anyio.fail_after(60):
            result = await session.snapshot()  # type: ignore[attr-defined]
    except Exception as exc:  # the measurement is what happened
        return f"{type(exc).__name__} after {time.perf_counter() - start:.1f} s"
    ok = "ok" if result.get("success") else f"failed: {str(result.get('error'))[:80]}"
    return f"{ok} in {time.perf_counter() - start:.2f} s"


async def main(seconds: float) -> None:
    async with BrowserManager(_settings(_flood_page())) as manager:
        plain = await manager.get("plain")
        assert (await plain.navigate("http://pages.test/plain"))["success"]
        start_mb = peak_mb = chromium_pss_mb()
        flood = await manager.get("flood")
        print("flood navigate:", (await flood.navigate("http://pages.test/flood")).get("success"))
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            await anyio.sleep(1.0)
            now_mb = chromium_pss_mb()
            peak_mb = max(peak_mb, now_mb)
            print(
                f"  t={time.perf_counter() - began:4.0f} s  Chromium PSS {now_mb:7.0f} MB",
                flush=True,
            )
        pages = len(getattr(flood, "_pages", []))
        end_mb = chromium_pss_mb()
        print(f"Chromium PSS: start {start_mb:.0f} MB, peak {peak_mb:.0f} MB, end {end_mb:.0f} MB")
        print(f"pages held by the flood session: {pages}")
        print("snapshot, plain session:", await _snapshot(plain))
        print("snapshot, flood session:", await _snapshot(flood))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    anyio.run(main, parser.parse_args().seconds)
