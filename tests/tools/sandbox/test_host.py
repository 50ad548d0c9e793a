"""pidfd_child_watcher: asyncio waits for children through pidfds (no thread per child)."""

from __future__ import annotations

import asyncio
import sys
import threading
import warnings

import anyio
import pytest

from hermes_async.tools.sandbox.host import pidfd_child_watcher, run_bounded

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
