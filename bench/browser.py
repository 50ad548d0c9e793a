"""Browser sessions: one Chromium with a context per rollout, vs a browser per rollout.

* **ours**: :class:`hermes_async.tools.browser.BrowserManager` — one Chromium process, one
  browser context (+ one page) per session, every request through the SSRF-guarded fetcher.
* **baseline** (the reference's design: agent-browser started a browser daemon per session):
  one Chromium launched per session (same flags, same guarded request handler), closed with it.

For each N (default 1, 16, 64) N sessions are opened at once, each navigates to a small page
and takes a snapshot, then all are released at once; this repeats ``--rounds`` times. Reported:
create latency (``get`` -> context and page ready; baseline: launch -> page ready) and close
latency (``release``; baseline: ``browser.close``) p50/p99, and peak memory of the browser
processes (PSS summed over Chromium's processes while all N are open, sampled every 0.2 s),
total and per session. Pages come from an in-process httpx transport behind the guard (no
network). Ratios are baseline/ours from the same run (machines are noisy; absolute numbers mean
little). Run with ``.venv/bin/python bench/browser.py [--sizes 1 16 64] [--rounds 3]``; the
baseline runs up to ``--baseline-max`` sessions (launching 64 browsers on a small machine
measures the machine, not the design).

Needs the ``browser`` extra and a Chromium (``scripts/browser/install.sh``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from hermes_async.tools._ssrf import Allowlist
from hermes_async.tools.browser import BrowserManager, BrowserSettings, find_chromium
from hermes_async.tools.browser._network import serve_request
from hermes_async.tools.browser.settings import chromium_args, launch_environment

PAGE = (
    "<!doctype html><title>Bench</title><h1>Benchmark page</h1>"
    + "".join(f"<p>Paragraph {i} with a <a href='/p{i}'>link</a>.</p>" for i in range(30))
    + "<form><input aria-label=q><button>Go</button></form>"
)
URL = "http://bench.test/"


def _transport() -> httpx.AsyncBaseTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=PAGE, headers={"content-type": "text/html"})

    return httpx.MockTransport(handle)


async def _resolve(host: str, port: int) -> list[str]:
    return ["93.184.215.14"]  # a public address: the guard lets it through; the transport answers


def _settings(n: int) -> BrowserSettings:
    return BrowserSettings(
        transport=_transport(),
        resolver=_resolve,
        max_sessions=max(1, n),
        idle_timeout=None,
        create_timeout=120.0,
        close_timeout=60.0,
    )


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out


def chromium_pss_mb() -> float:
    """PSS of every Chromium process below this one, in MB."""
    total = 0
    todo = _children(os.getpid())
    while todo:
        pid = todo.pop()
        todo.extend(_children(pid))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
            if not os.path.basename(argv0).startswith((b"chromium", b"chrome")):
                continue
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            continue
    return total / 1024


def _pct(data: list[float], q: float) -> float:
    data = sorted(data)
    return data[min(len(data) - 1, max(0, math.ceil(q * len(data)) - 1))] if data else 0.0


@dataclass
class Result:
    create: list[float] = field(default_factory=list)
    close: list[float] = field(default_factory=list)
    peak_mb: float = 0.0
    seconds: float = 0.0

    def row(self, label: str, n: int) -> str:
        return (
            f"{label:>8} N={n:<3} create p50 {_pct(self.create, 0.5) * 1e3:7.0f} ms  "
            f"p99 {_pct(self.create, 0.99) * 1e3:7.0f} ms | close p50 "
            f"{_pct(self.close, 0.5) * 1e3:6.0f} ms  p99 {_pct(self.close, 0.99) * 1e3:6.0f} ms | "
            f"peak {self.peak_mb:7.0f} MB ({self.peak_mb / n:5.1f} MB/session) | "
            f"{self.seconds:5.1f} s"
        )


async def _sampling(result: Result, body: Callable[[], Awaitable[None]]) -> None:
    done = anyio.Event()

    async def sample() -> None:
        while not done.is_set():
            result.peak_mb = max(result.peak_mb, chromium_pss_mb())
            await anyio.sleep(0.2)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sample)
        try:
            await body()
        finally:
            done.set()


async def _ours_round(manager: BrowserManager, n: int, tag: str, result: Result) -> None:
    async def one(i: int) -> None:
        t0 = time.perf_counter()
        session = await manager.get(f"{tag}-{i}")
        result.create.append(time.perf_counter() - t0)
        assert (await session.navigate(URL))["success"]
        assert (await session.snapshot())["element_count"] > 30

    async def release(i: int) -> None:
        t0 = time.perf_counter()
        await manager.release(f"{tag}-{i}")
        result.close.append(time.perf_counter() - t0)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    result.peak_mb = max(result.peak_mb, chromium_pss_mb())
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(release, i)


async def run_ours(n: int, rounds: int) -> Result:
    result = Result()
    start = time.perf_counter()
    async with BrowserManager(_settings(n)) as manager:
        async with manager.session("warm-up") as warm:  # the first context pays one-off costs
            await warm.navigate(URL)
        for r in range(rounds):
            await _sampling(result, lambda r=r: _ours_round(manager, n, f"r{r}", result))
        assert manager.statistics().open_contexts == 0
    result.seconds = time.perf_counter() - start
    return result


async def _baseline_round(
    playwright: Any, n: int, settings: BrowserSettings, result: Result
) -> None:
    web = settings.fetch_settings()
    allow = Allowlist.from_entries(())
    executable = find_chromium()
    browsers: list[Any] = []

    async def route(route: Any, request: Any) -> None:
        await serve_request(route, request, settings=web, allow=allow, timeout=20.0)

    async def one() -> None:
        t0 = time.perf_counter()
        browser = await playwright.chromium.launch(
            executable_path=executable,
            args=chromium_args(settings),
            chromium_sandbox=False,
            env=launch_environment(),
        )
        browsers.append(browser)
        context = await browser.new_context(service_workers="block")
        await context.route("**/*", route)
        page = await context.new_page()
        result.create.append(time.perf_counter() - t0)
        await page.goto(URL)
        await page.aria_snapshot(mode="ai")

    async def close(browser: Any) -> None:
        t0 = time.perf_counter()
        await browser.close()
        result.close.append(time.perf_counter() - t0)

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    result.peak_mb = max(result.peak_mb, chromium_pss_mb())
    async with anyio.create_task_group() as tg:
        for browser in browsers:
            tg.start_soon(close, browser)


async def run_baseline(n: int, rounds: int) -> Result:
    from playwright.async_api import async_playwright

    result = Result()
    settings = _settings(n)
    start = time.perf_counter()
    playwright = await async_playwright().start()
    try:
        for _ in range(rounds):
            await _sampling(result, lambda: _baseline_round(playwright, n, settings, result))
    finally:
        await playwright.stop()
    result.seconds = time.perf_counter() - start
    return result


async def main(sizes: list[int], rounds: int, baseline_max: int) -> None:
    print(f"chromium: {find_chromium()}  cpus: {os.cpu_count()}  rounds: {rounds}")
    for n in sizes:
        ours = await run_ours(n, rounds)
        print(ours.row("ours", n), flush=True)
        if n <= baseline_max:
            base = await run_baseline(n, rounds)
            print(base.row("baseline", n), flush=True)
            print(
                f"{'ratio':>8} N={n:<3} create p50 x{_pct(base.create, 0.5) / _pct(ours.create, 0.5):.1f}"
                f"  close p50 x{_pct(base.close, 0.5) / max(_pct(ours.close, 0.5), 1e-9):.1f}"
                f"  peak memory x{base.peak_mb / max(ours.peak_mb, 1e-9):.1f} (baseline/ours)",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-max", type=int, default=16)
    args = parser.parse_args()
    if sys.platform != "linux":
        sys.exit("bench/browser.py reads /proc: Linux only")
    anyio.run(main, args.sizes, args.rounds, args.baseline_max, backend="asyncio")
