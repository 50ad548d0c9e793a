"""Host processes: run_bounded's two ways to drive a child, and pidfd_child_watcher."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import warnings
from functools import partial

import anyio
import pytest

from hermes_async.tools.sandbox import host
from hermes_async.tools.sandbox.host import pidfd_child_watcher, run_bounded
from hermes_async.tools.sandbox.processes import group_alive

pytestmark = pytest.mark.anyio


def watcher() -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(asyncio.get_event_loop_policy(), "_watcher", None)


async def test_children_are_waited_for_without_a_thread_each(anyio_backend_name: str) -> None:
    before = watcher()
    with pidfd_child_watcher() as installed:
        if sys.version_info < (3, 12) and anyio_backend_name == "asyncio":
            assert installed and isinstance(watcher(), asyncio.PidfdChildWatcher)
        else:
            assert not installed  # trio waits for its children itself
        threads = threading.active_count()
        results = []

        async def one(i: int) -> None:
            results.append(await run_bounded(["/bin/sh", "-c", f"sleep 0.2; exit {i}"], timeout=10))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        assert sorted(r.exit_code for r in results) == list(range(20))
        if anyio_backend_name == "asyncio" and installed:
            # Python 3.11's default watcher would have started one waitpid thread per child.
            assert threading.active_count() <= threads + 2
    assert watcher() is before


async def test_a_watcher_the_application_chose_is_left_alone(anyio_backend_name: str) -> None:
    if sys.version_info >= (3, 12) or anyio_backend_name != "asyncio":
        pytest.skip("only asyncio before Python 3.12 has child watchers to swap")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mine = asyncio.SafeChildWatcher()
        asyncio.set_child_watcher(mine)
    try:
        with pidfd_child_watcher() as installed:
            assert not installed and watcher() is mine
        assert watcher() is mine
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(None)


@pytest.fixture(params=["pidfd", "anyio"])
def spawn_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on both ways run_bounded drives a child (pidfds, anyio.open_process)."""
    monkeypatch.setattr(host, "_use_pidfd", request.param == "pidfd")
    return str(request.param)


async def test_both_spawn_paths_give_the_same_results(spawn_path: str) -> None:
    ok = await run_bounded(
        ["/bin/sh", "-c", "cat; echo err >&2; exit 3"], timeout=10, stdin=b"x" * 300_000
    )
    assert (ok.exit_code, len(ok.stdout), ok.stderr, ok.timed_out) == (3, 300_000, b"err\n", False)
    big = await run_bounded(
        ["/bin/sh", "-c", "head -c 2000000 /dev/zero"], timeout=10, output_limit=1000
    )
    assert big.truncated and len(big.stdout) < 2000
    killed = await run_bounded(["/bin/sh", "-c", "kill -KILL $$"], timeout=10)
    assert killed.exit_code == 128 + 9
    with pytest.raises(FileNotFoundError):
        await run_bounded(["/bin/true"], cwd="/nonexistent/dir", timeout=10)
    with pytest.raises(FileNotFoundError):
        await run_bounded(["/nonexistent/program"], timeout=10)


async def test_both_spawn_paths_kill_the_group_on_timeout_and_cancel(spawn_path: str) -> None:
    started = time.monotonic()
    r = await run_bounded(
        ["/bin/sh", "-c", "sleep 30 & echo $!; wait"], timeout=0.5, terminate_grace=0.2
    )
    assert r.timed_out and r.exit_code == 124 and time.monotonic() - started < 10
    assert not group_alive(r.pgid)
    groups: list[int] = []
    with anyio.move_on_after(0.5):
        await run_bounded(["/bin/sh", "-c", "sleep 30"], timeout=60, on_start=groups.append)
    assert groups and not group_alive(groups[0])


async def test_the_pidfd_path_starts_no_thread_and_leaves_no_fd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without pidfd_child_watcher: Python 3.11's asyncio would start a waitpid thread per child.
    monkeypatch.setattr(host, "_use_pidfd", True)
    threads = threading.active_count()
    fds = len(os.listdir("/proc/self/fd"))
    peak = [threads]
    async with anyio.create_task_group() as tg:
        for i in range(30):
            tg.start_soon(
                partial(run_bounded, ["/bin/sh", "-c", f"sleep 0.3; exit {i % 3}"], timeout=10)
            )
        await anyio.sleep(0.15)  # all 30 children running
        peak.append(threading.active_count())
    assert max(peak) <= threads
    assert len(os.listdir("/proc/self/fd")) <= fds + 2
