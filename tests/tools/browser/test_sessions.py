"""Session lifecycle against the real browser: many rollouts, cancellation, idle, crashes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal

import anyio
import anyio.lowlevel
import pytest

from hermes_async.limits import Limits
from hermes_async.tools.browser import BrowserManager, BrowserUnavailableError
from hermes_async.tools.registry import ToolRuntime, dispatch
from tests.tools.browser.conftest import settings_for_tests
from tests.tools.browser.procs import browser_processes, children, read_bytes
from tests.tools.browser.site import Page, Site

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

PAGE = "<title>Task</title><h1>Task</h1><form><input aria-label=answer><button>ok</button></form>"


def _cmdline(pid: int) -> bytes:
    return read_bytes(f"/proc/{pid}/cmdline")


async def _wait_for(predicate: object, timeout: float = 10.0) -> bool:
    assert callable(predicate)
    with anyio.move_on_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)
        return True
    return False


# asyncio's debug mode records a stack for every future Playwright creates (one per protocol
# message) and logs every slow callback: on a loaded 2-core machine it multiplies this run's time
# while checking nothing more. The other browser tests run in debug mode.
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"debug": False})], ids=["asyncio"])
@pytest.mark.parametrize(
    "rollouts", [24, pytest.param(200, marks=[pytest.mark.slow, pytest.mark.timeout(480)])]
)
async def test_rollouts_half_cancelled_leave_nothing_open(
    browser_engine: str, site: Site, rollouts: int
) -> None:
    site.pages = {"/": Page(PAGE), "/slow": Page(PAGE, delay=0.3)}
    rng = random.Random(18)
    # Fewer slots than rollouts: some wait for one (and some of those are cancelled waiting).
    limits = Limits(browser_sessions=16)
    # Half the rollouts are cancelled, each at a random moment of a random step: waiting for a
    # slot or opening the context (get), loading the page, reading it, typing, releasing (seed
    # 18 draws every step at both sizes).
    steps = ("get", "navigate", "snapshot", "type", "release")
    cancel_in = {i: rng.choice(steps) for i in rng.sample(range(rollouts), rollouts // 2)}
    assert set(cancel_in.values()) == set(steps)
    outcomes: dict[str, int] = {"completed": 0, "cancelled": 0}
    counts: list[int] = []
    tasks_before = set(asyncio.all_tasks())
    start = anyio.current_time()

    async def rollout(manager: BrowserManager, i: int) -> None:
        task_id = f"rollout-{i}"
        step = cancel_in.get(i)

        def arm(scope: anyio.CancelScope, here: str) -> None:
            if step == here:
                scope.deadline = anyio.current_time() + rng.uniform(0.0, 0.3)

        try:
            with anyio.CancelScope() as scope:
                arm(scope, "get")
                session = await manager.get(task_id)
                arm(scope, "navigate")
                path = "/slow" if i % 5 == 0 else "/"
                result = await session.navigate(site.url(path))
                assert result["success"], result
                arm(scope, "snapshot")
                snapshot = await session.snapshot()
                assert 'heading "Task"' in snapshot["snapshot"]
                box = re.search(r'textbox "answer" \[ref=(e\d+)\]', snapshot["snapshot"])
                assert box is not None, snapshot
                arm(scope, "type")
                typed = await session.type("@" + box.group(1), f"answer {i}")
                assert typed["success"], typed
                arm(scope, "release")
                await manager.release(task_id)  # cancelled here: shielded, completes anyway
                await anyio.lowlevel.checkpoint()
                outcomes["completed"] += 1
            if scope.cancelled_caught:
                outcomes["cancelled"] += 1
        finally:
            await manager.release(task_id)

    async def sample(manager: BrowserManager, stop: anyio.Event) -> None:
        while not stop.is_set():
            counts.append(len(browser_processes()))
            await anyio.sleep(0.1)

    async with BrowserManager(settings_for_tests(), limits=limits) as manager:
        stop = anyio.Event()
        async with anyio.create_task_group() as outer:
            outer.start_soon(sample, manager, stop)
            async with anyio.create_task_group() as tg:
                for i in range(rollouts):
                    tg.start_soon(rollout, manager, i)
            stop.set()
        stats = manager.statistics()
        assert stats.open_contexts == 0
        assert stats.sessions == stats.pending == 0
        assert limits["browser_sessions"].statistics().in_use == 0
        assert stats.browser_launches == 1 and stats.browser_crashes == 0
        assert stats.closed == stats.created >= rollouts // 2
    elapsed = anyio.current_time() - start
    assert outcomes["completed"] + outcomes["cancelled"] == rollouts
    assert outcomes["completed"] >= rollouts - len(cancel_in)  # no uncancelled one failed
    assert outcomes["cancelled"] > 0
    assert min(counts) == max(counts) == 1, counts  # exactly one browser during the run
    assert await _wait_for(lambda: browser_processes() == [])

    # Nothing of the manager or Playwright keeps running.
    def leftover() -> set[asyncio.Task[object]]:
        return set(asyncio.all_tasks()) - tasks_before - {asyncio.current_task()}

    assert await _wait_for(lambda: not leftover(), timeout=30.0), [
        (t.get_name(), t.get_coro()) for t in leftover()
    ]
    print(f"\n{rollouts} rollouts ({outcomes}) in {elapsed:.1f} s")


async def test_a_route_whose_abort_fails_is_settled(
    browser_engine: str, site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Serving fails, then the abort fails too (as when the driver is slow or the page is going
    # away). Playwright's dispatch task for that route must still end: it waits until the route
    # is handled, and nothing told it.
    import playwright.async_api

    from hermes_async.tools.browser import session as session_module

    async def broken_serve(*args: object, **kwargs: object) -> None:
        raise RuntimeError("serving failed")

    async def broken_abort(self: object, error_code: str | None = None) -> None:
        raise playwright.async_api.Error("abort failed")

    monkeypatch.setattr(session_module, "serve_request", broken_serve)
    monkeypatch.setattr(playwright.async_api.Route, "abort", broken_abort)
    site.pages = {"/": Page(PAGE)}
    tasks_before = set(asyncio.all_tasks())
    async with BrowserManager(settings_for_tests(navigation_timeout=2.0)) as manager:
        session = await manager.get("broken")
        result = await session.navigate(site.url("/"))
        assert not result["success"]  # the request was never answered
        await manager.release("broken")

    def routes_pending() -> list[str]:
        left = set(asyncio.all_tasks()) - tasks_before - {asyncio.current_task()}
        return [name for t in left if "_on_route" in (name := repr(t.get_coro()))]

    assert await _wait_for(lambda: not routes_pending(), timeout=10.0), routes_pending()


async def test_release_is_idempotent_and_a_session_block_releases(
    manager: BrowserManager, site: Site
) -> None:
    site.pages = {"/": Page(PAGE)}
    async with manager.session("blk") as session:
        assert (await session.navigate(site.url("/")))["success"]
        assert "blk" in manager
    assert "blk" not in manager
    assert manager.statistics().open_contexts == 0
    await manager.release("blk")
    await manager.release("never-opened")
    with pytest.raises(ValueError, match="task_id must be a non-empty string"):
        await manager.get("")


async def test_a_cancelled_get_while_waiting_for_a_slot_leaks_nothing(
    browser_engine: str, site: Site
) -> None:
    site.pages = {"/": Page(PAGE)}
    async with BrowserManager(settings_for_tests(max_sessions=1)) as manager:
        first = await manager.get("first")
        with anyio.move_on_after(0.5) as scope:
            await manager.get("second")  # waits: the only slot is taken
        assert scope.cancelled_caught
        assert manager.statistics().pending == 1
        await manager.release("second")
        assert manager.statistics().pending == 0
        await manager.release("first")
        assert first.task_id == "first"
        assert manager.statistics().open_contexts == 0
        # The slot is free again.
        again = await manager.get("second")
        assert (await again.navigate(site.url("/")))["success"]


async def test_idle_sessions_are_reaped_busy_ones_are_not(browser_engine: str, site: Site) -> None:
    site.pages = {"/": Page(PAGE), "/slow": Page(PAGE, delay=2.0)}
    settings = settings_for_tests(idle_timeout=0.6, reap_interval_seconds=0.1)
    async with BrowserManager(settings) as manager:
        idle = await manager.get("idle")
        await idle.navigate(site.url("/"))
        # get() counts as a use and navigate() marks the session busy before its first
        # checkpoint, so nothing can reap "busy" in between, however slow the machine is.
        # (Getting both sessions first let a slow first navigation age "busy" past the idle
        # timeout before its own navigation began: a CI failure of stop 27.)
        busy = await manager.get("busy")
        await busy.navigate(site.url("/slow"))  # busy for 2 s, well over the idle timeout
        assert "busy" in manager
        assert await _wait_for(lambda: "idle" not in manager, timeout=5)
        assert manager.statistics().reaped >= 1
        with pytest.raises(BrowserUnavailableError):
            await idle.snapshot()  # the reaped session's page is gone
        assert await _wait_for(lambda: "busy" not in manager, timeout=5)
        assert await _wait_for(lambda: manager.statistics().open_contexts == 0)


async def test_a_killed_browser_fails_its_sessions_and_the_next_ones_get_a_fresh_one(
    browser_engine: str, site: Site
) -> None:
    site.pages = {"/": Page(PAGE), "/slow": Page(PAGE, delay=3.0)}
    async with BrowserManager(settings_for_tests()) as manager:
        a = await manager.get("a")
        b = await manager.get("b")
        await a.navigate(site.url("/"))
        [old_pid] = browser_processes()

        async def navigate_slowly() -> None:
            with pytest.raises(BrowserUnavailableError, match="browser"):
                await b.navigate(site.url("/slow"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(navigate_slowly)
            with anyio.fail_after(30):  # b's navigation is in flight: the page was asked for
                while not any(r.path == "/slow" for r in site.received):
                    await anyio.sleep(0.02)
            os.kill(old_pid, signal.SIGKILL)
        assert await _wait_for(lambda: manager.statistics().browser_crashes == 1)
        with pytest.raises(BrowserUnavailableError, match="crashed or was killed"):
            await a.snapshot()
        with pytest.raises(BrowserUnavailableError, match="crashed or was killed"):
            await manager.get("a")  # stays unavailable until released
        outcome = await dispatch("browser_snapshot", {}, ToolRuntime(task_id="a", browsers=manager))
        assert "BrowserUnavailableError" in json.loads(outcome.content)["error"]
        assert manager.statistics().unavailable == 2
        # A new rollout gets a fresh browser.
        c = await manager.get("c")
        assert (await c.navigate(site.url("/")))["success"]
        [new_pid] = browser_processes()
        assert new_pid != old_pid
        assert manager.statistics().browser_launches == 2
        # Released, the lost rollout starts over too.
        await manager.release("a")
        again = await manager.get("a")
        assert (await again.navigate(site.url("/")))["success"]
        await manager.release("b")
        assert manager.statistics().unavailable == 0
    assert await _wait_for(lambda: browser_processes() == [])


async def test_a_killed_driver_is_restarted_for_the_next_session(
    browser_engine: str, site: Site
) -> None:
    site.pages = {"/": Page(PAGE)}
    async with BrowserManager(settings_for_tests()) as manager:
        a = await manager.get("a")
        await a.navigate(site.url("/"))
        [driver] = [p for p in children(os.getpid()) if b"run-driver" in _cmdline(p)]
        os.kill(driver, signal.SIGKILL)
        with pytest.raises(BrowserUnavailableError):
            await a.snapshot()
        b = await manager.get("b")  # a fresh driver and browser
        assert (await b.navigate(site.url("/")))["success"]
        stats = manager.statistics()
        assert stats.driver_restarts == 1 and stats.browser_launches == 2
        assert len(browser_processes()) == 1
        with pytest.raises(BrowserUnavailableError, match="crashed or was killed"):
            await manager.get("a")
    assert await _wait_for(lambda: browser_processes() == [])
