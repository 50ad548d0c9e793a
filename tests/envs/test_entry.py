"""run_entry stops the tasks atroposlib spawns and never awaits, while the sandboxes are open.

atroposlib starts its rollout workers with ``asyncio.create_task``; the run's cancellation
(SIGTERM, the end of ``serve``) does not reach them. Left alone, a worker kept ``asyncio.run``
waiting at exit (the orchestrator's SIGTERM ended in SIGKILL) or created a sandbox after the
run's manager had closed (a leaked directory). asyncio-only, as atroposlib is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from hermes_async.envs import _entry
from hermes_async.envs._entry import run_entry
from hermes_async.tools.sandbox.local import local_factory
from hermes_async.tools.sandbox.manager import SandboxManager

pytestmark = pytest.mark.anyio


def _manager(tmp_path: Path, events: list[str]) -> tuple[list[SandboxManager], object]:
    managers: list[SandboxManager] = []

    @asynccontextmanager
    async def sandboxes() -> AsyncIterator[SandboxManager]:
        async with SandboxManager(local_factory(str(tmp_path), isolation="process")) as m:
            managers.append(m)
            yield m
        events.append("manager closed")

    return managers, sandboxes


async def test_workers_spawned_by_the_run_are_cancelled_before_the_manager_closes(
    tmp_path: Path,
) -> None:
    events: list[str] = []
    managers, sandboxes = _manager(tmp_path, events)
    workers: set[asyncio.Task[None]] = set()
    started = anyio.Event()

    async def rollout(n: int) -> None:
        sandbox = await managers[0].get(f"task-{n}")
        try:
            await sandbox.exec("true")
            started.set()
            await anyio.sleep_forever()
        finally:
            events.append(f"worker {n} stopped")
            await managers[0].release(f"task-{n}", interrupted=True)

    async def run() -> None:  # atroposlib's shape: spawn, never await
        for n in range(3):
            workers.add(asyncio.create_task(rollout(n)))
        await started.wait()

    with anyio.fail_after(30):
        await run_entry(
            "serve", run, sandboxes=sandboxes, gc_tuning=None, stray_tasks=lambda: [*workers, None]
        )
    assert all(task.done() for task in workers)
    assert sorted(events[:3]) == ["worker 0 stopped", "worker 1 stopped", "worker 2 stopped"]
    assert events[3:] == ["manager closed"]
    assert list(tmp_path.iterdir()) == []


async def test_a_worker_that_ignores_cancellation_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_entry, "STRAY_TASK_TIMEOUT_SECONDS", 0.3)
    events: list[str] = []
    _, sandboxes = _manager(tmp_path, events)
    release = anyio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # a worker that swallows its cancellation

    task = asyncio.create_task(stubborn())

    async def run() -> None:
        await asyncio.sleep(0)

    try:
        with anyio.fail_after(10):
            await run_entry(
                "serve", run, sandboxes=sandboxes, gc_tuning=None, stray_tasks=lambda: [task]
            )
        assert events == ["manager closed"]  # the run ended, bounded
        assert not task.done()
    finally:
        release.set()
        task.cancel()
        await asyncio.wait([task])


async def test_a_worker_failing_as_it_stops_does_not_fail_the_run(tmp_path: Path) -> None:
    events: list[str] = []
    _, sandboxes = _manager(tmp_path, events)

    working = asyncio.Event()

    async def failing() -> None:
        try:
            working.set()
            await asyncio.sleep(10)
        finally:
            raise RuntimeError("a worker failed in its cleanup")

    task = asyncio.create_task(failing())

    async def run() -> None:
        await working.wait()  # the run ends while the worker works

    await run_entry("serve", run, sandboxes=sandboxes, gc_tuning=None, stray_tasks=lambda: [task])
    assert task.done() and isinstance(task.exception(), RuntimeError)
    assert events == ["manager closed"]


async def test_metrics_port_serves_the_run_status_while_it_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from hermes_async.telemetry import read_status

    events: list[str] = []
    _, sandboxes = _manager(tmp_path, events)
    read: list[object] = []

    async def run() -> None:
        [line] = [r.getMessage() for r in caplog.records if "/metrics" in r.getMessage()]
        url = line.split("metrics at ")[1].split(" ")[0]
        read.append(await read_status(url))

    with caplog.at_level("INFO", logger="hermes_async.envs.base"):
        await run_entry("serve", run, sandboxes=sandboxes, gc_tuning=None, metrics_port=0)
    [status] = read
    assert type(status).__name__ == "RunStatus"


async def test_a_bare_task_cancel_cuts_a_shielded_cleanup_but_not_under_as_child() -> None:
    # Why handle_env runs its body through as_child: atroposlib stops workers with
    # Task.cancel(), which lands inside anyio's shielded scopes.
    async def body(log: list[str], inside: anyio.Event) -> str:
        with anyio.CancelScope(shield=True):  # a release in progress
            inside.set()
            await anyio.sleep(0.2)
            log.append("cleanup finished")
        await anyio.sleep_forever()
        return "unreachable"

    for wrapped, expected in ((False, []), (True, ["cleanup finished"])):
        log: list[str] = []
        inside = anyio.Event()
        coro = _entry.as_child(body, log, inside) if wrapped else body(log, inside)
        task = asyncio.ensure_future(coro)
        await inside.wait()
        task.cancel()
        await asyncio.wait([task])
        assert task.cancelled()
        assert log == expected, f"as_child={wrapped}"


async def test_as_child_returns_and_raises_like_the_call() -> None:
    async def double(x: int) -> int:
        await anyio.sleep(0)
        return 2 * x

    async def fail() -> None:
        raise KeyError("boom")

    assert await _entry.as_child(double, 21) == 42
    with pytest.raises(KeyError, match="boom"):  # itself, not an exception group
        await _entry.as_child(fail)


async def test_workers_atroposlib_dropped_are_still_awaited_before_the_manager_closes(
    tmp_path: Path,
) -> None:
    # atroposlib shrinks its pool with worker.cancel() + workers.discard(worker): the worker is
    # still releasing when it leaves the set. The run waits for it through SpawnedTasks.
    events: list[str] = []
    managers, sandboxes = _manager(tmp_path, events)
    spawned = _entry.SpawnedTasks()
    workers: set[asyncio.Task[None]] = set()
    started = anyio.Event()

    async def rollout() -> None:
        sandbox = await managers[0].get("task")
        try:
            await sandbox.exec("true")
            started.set()
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.3)  # a slow release
                await managers[0].release("task", interrupted=True)
                events.append("worker released")

    async def worker() -> None:
        with spawned.track():
            await _entry.as_child(rollout)

    async def run() -> None:
        task = asyncio.create_task(worker())
        workers.add(task)
        await started.wait()
        task.cancel()  # atroposlib's pool shrink
        workers.discard(task)
        await asyncio.sleep(0.05)

    assert len(spawned) == 0
    with anyio.fail_after(30):
        await run_entry(
            "serve",
            run,
            sandboxes=sandboxes,
            gc_tuning=None,
            stray_tasks=lambda: [*workers, *spawned],
        )
    assert events == ["worker released", "manager closed"]
    assert list(tmp_path.iterdir()) == []
    assert len(spawned) == 0
