"""The keyed-lifetime helper on its own: hand-over, releases, the janitor, the idle reaper."""

from __future__ import annotations

import logging

import anyio
import pytest
import trio.testing

from hermes_async.tools._lifetimes import Lifetime, Lifetimes

pytestmark = pytest.mark.anyio

LOG = logging.getLogger("tests.lifetimes")


class Owner:
    """Makes ``"made <key>"`` strings; records closes; a close can be held open."""

    def __init__(self) -> None:
        self.closed: list[tuple[str, bool, str]] = []
        self.hold_close = anyio.Event()
        self.hold_close.set()
        self.made = 0

    async def close(self, lifetime: Lifetime[str], interrupted: bool, reason: str) -> None:
        await self.hold_close.wait()
        self.closed.append((lifetime.key, interrupted, reason))

    async def create(self, lifetime: Lifetime[str]) -> str:
        self.made += 1
        return f"made {lifetime.key}"


async def test_concurrent_gets_make_one_and_a_cancelled_creator_hands_over() -> None:
    owner = Owner()
    table: Lifetimes[str] = Lifetimes("thing", owner.close, LOG)
    go = anyio.Event()
    attempts = 0

    async def slow(lifetime: Lifetime[str]) -> str:
        nonlocal attempts
        attempts += 1
        await go.wait()
        return f"attempt {attempts}"

    got: list[str | None] = []
    creator = anyio.CancelScope()

    async def create() -> None:
        with creator:
            await table.get("k", slow)

    async def wait() -> None:
        got.append((await table.get("k", slow)).value)

    async with anyio.create_task_group() as tg:
        await table.start(tg)
        tg.start_soon(create)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert attempts == 1  # the waiter waits for the one creation
        creator.cancel()
        await anyio.wait_all_tasks_blocked()
        assert attempts == 2  # the waiter took over
        go.set()
    assert got == ["attempt 2"]


async def test_a_second_release_waits_for_the_first_and_creation_after_release_closes() -> None:
    owner = Owner()
    table: Lifetimes[str] = Lifetimes("thing", owner.close, LOG)
    async with anyio.create_task_group() as tg:
        await table.start(tg)
        await table.get("k", owner.create)
        owner.hold_close = anyio.Event()
        tg.start_soon(table.release, "k")
        await anyio.wait_all_tasks_blocked()
        assert "k" not in table.entries and owner.closed == []
        done = anyio.Event()

        async def second() -> None:
            assert await table.release("k") is None
            done.set()

        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()  # waits for the first close
        owner.hold_close.set()
        with anyio.fail_after(5):
            await done.wait()
        table.stop()
        entry = await table.get("late", owner.create)  # made after stop: closed at once
        assert entry.released is False and ("late", False, "released during its creation") in (
            owner.closed
        )
    assert owner.closed[0] == ("k", False, "released")


async def test_request_release_runs_in_the_janitor_and_spares_a_newer_lifetime() -> None:
    owner = Owner()
    table: Lifetimes[str] = Lifetimes("thing", owner.close, LOG)
    async with anyio.create_task_group() as tg:
        await table.start(tg)
        await table.get("k", owner.create)
        table.request_release("k", reason="asked")
        assert "k" in table.entries  # only queued
        await table.release("k")
        newer = await table.get("k", owner.create)
        await anyio.wait_all_tasks_blocked()
        assert table.entries["k"] is newer
        table.request_release("k", reason="asked")
        with anyio.fail_after(5):
            while "k" in table.entries:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert [reason for _, _, reason in owner.closed] == ["released", "asked"]


class TestReaper:
    @pytest.fixture
    def anyio_backend(self) -> tuple[str, dict[str, object]]:
        # The reaper's timing under a virtual clock: no real waiting.
        return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})

    async def test_it_releases_what_is_unused_and_reapable_only(self) -> None:
        owner = Owner()
        keep = {"pinned"}

        async def reapable(lifetime: Lifetime[str]) -> bool:
            return lifetime.key not in keep

        table: Lifetimes[str] = Lifetimes(
            "thing", owner.close, LOG, idle_timeout=10.0, reap_interval=1.0, reapable=reapable
        )
        async with anyio.create_task_group() as tg:
            await table.start(tg)
            idle = await table.get("idle", owner.create)
            busy = await table.get("busy", owner.create)
            await table.get("pinned", owner.create)
            with busy.in_use():
                await anyio.sleep(30)
                assert "busy" in table.entries and "pinned" in table.entries
                assert "idle" not in table.entries and idle.released
            await anyio.sleep(12)  # its last use was when the block ended
            assert "busy" not in table.entries and "pinned" in table.entries
            assert table.reaped == 2
            tg.cancel_scope.cancel()
        assert [(key, reason) for key, _, reason in owner.closed] == [
            ("idle", "idle"),
            ("busy", "idle"),
        ]
