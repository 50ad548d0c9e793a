"""Host processes of local sandboxes: the membership rule, the shared sweeper, the batcher."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from hermes_async.tools.sandbox import processes
from hermes_async.tools.sandbox._batch import Batcher
from hermes_async.tools.sandbox.processes import (
    SANDBOX_MARKER_ENV,
    ProcessEntry,
    ProcessSweeper,
    ProcessTable,
    find_sandbox_processes,
    group_alive,
    read_process_table,
    terminate_members,
)

pytestmark = pytest.mark.anyio


def _entry(pid: int, session: int, *markers: str) -> ProcessEntry:
    return ProcessEntry(pid, "S", pgrp=session, session=session, start_ticks=1, markers=markers)


def test_membership_rule() -> None:
    table = ProcessTable(
        (
            _entry(10, 100, "sbx-a"),  # marked
            _entry(11, 100),  # in a's session, which holds a marked process: ours
            _entry(12, 200),  # in a tracked session with no marked process: not ours
            _entry(13, 300, "sbx-b"),
            _entry(14, 400, "sbx-ab"),
            _entry(15, 500, "other", "sbx-a"),  # a second marker value still counts
        )
    )
    pids = lambda entries: sorted(e.pid for e in entries)  # noqa: E731
    assert pids(table.members("sbx-a", [100, 200])) == [10, 11, 15]
    assert pids(table.members("sbx-a")) == [10, 15]  # untracked sessions are not followed
    assert pids(table.members("sbx-a", marker_prefix=True)) == [10, 14, 15]
    assert pids(table.members(None, [200, 300])) == [12, 13]
    assert table.members("sbx-none", [100]) == []


async def test_sweep_finds_and_signals_a_marked_process_and_its_group() -> None:
    marker = f"test-{os.getpid()}-{anyio.current_time()}"
    env = {**os.environ, SANDBOX_MARKER_ENV: marker}
    # A marked shell and an unmarked child in its group (env -u): found via the session.
    proc = await anyio.open_process(
        ["/bin/sh", "-c", f"env -u {SANDBOX_MARKER_ENV} sleep 1000 & sleep 1000"],
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with anyio.fail_after(10):  # until both children have exec'd: sh + 2 sleeps, 1 unmarked
            while (
                len(find_sandbox_processes(marker)) != 2
                or len(find_sandbox_processes(marker, [proc.pid])) != 3
            ):
                await anyio.sleep(0.02)
        sweeper = ProcessSweeper()
        found = await sweeper.kill_round(marker, [proc.pid])  # look only
        assert len(found) == 3 and group_alive(proc.pid)
        survivors = await terminate_members(
            sweeper, marker, [proc.pid], grace=5, kill_wait=5, graceful=False
        )
        assert survivors == []
        with anyio.fail_after(10):
            await proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert not group_alive(proc.pid)
        assert find_sandbox_processes(marker, [proc.pid]) == []
    finally:
        with anyio.move_on_after(5, shield=True):
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.aclose()


#: Run in a session of its own: a marked child still in this process's group (as before its own
#: setsid()) is killed alone; neither the sweep nor ``signal_group`` signals that group.
_OWN_GROUP_SCRIPT = """
import os, signal, subprocess, sys, time
import anyio
from hermes_async.tools.sandbox.processes import SANDBOX_MARKER_ENV, ProcessSweeper, signal_group
marker = sys.argv[1]
child = subprocess.Popen(["sleep", "300"], env={**os.environ, SANDBOX_MARKER_ENV: marker})
assert os.getpgid(child.pid) == os.getpgrp()
deadline = time.monotonic() + 10
while marker.encode() not in open(f"/proc/{child.pid}/environ", "rb").read():
    assert time.monotonic() < deadline, "the child never exec'd"
    time.sleep(0.01)
signal_group(os.getpgrp(), signal.SIGKILL)
found = anyio.run(ProcessSweeper().kill_round, marker, (), signal.SIGKILL)
print(found == [child.pid], child.wait(timeout=10))
"""


def test_a_marked_process_in_the_callers_group_is_killed_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _OWN_GROUP_SCRIPT, f"own-group-{os.getpid()}"],
        start_new_session=True,  # if the guard fails, only this helper's group dies
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["True", str(-signal.SIGKILL)]


async def test_concurrent_kill_rounds_share_sweeps() -> None:
    sweeper = ProcessSweeper()
    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(sweeper.kill_round, f"nobody-{i}", ())
    stats = sweeper.statistics()
    assert stats.requests == 50
    assert stats.sweeps <= 3  # the first caller's sweep, then everyone who arrived during it
    table = read_process_table()
    assert all(e.pid != os.getpid() for e in table.entries)
    assert any(e.pid == os.getppid() for e in table.entries)


@contextmanager
def _marked_sleep(marker: str | None) -> Iterator[subprocess.Popen[bytes]]:
    """A ``sleep`` with the marker in its environment (``None``: no environment at all)."""
    env = {} if marker is None else {**os.environ, SANDBOX_MARKER_ENV: marker}
    child = subprocess.Popen(["/bin/sleep", "300"], env=env)
    try:
        # Until it has exec'd, the child's environment is ours.
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/comm").read_text().strip() != "sleep":
            assert time.monotonic() < deadline, "the child never exec'd"
        yield child
    finally:
        child.kill()
        child.wait()


async def test_a_process_caught_mid_exec_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # While a process execs, its environment reads empty for a moment (~15 us; longer under
    # load): a sweep that read it then would miss the marker of a `setsid cmd` for good.
    marker = f"mid-exec-{os.getpid()}"
    with _marked_sleep(marker) as child:
        blank_once = {f"/proc/{child.pid}/environ"}

        def reading_mid_exec(path: str, *args: Any, **kwargs: Any) -> Any:
            if path in blank_once:
                blank_once.discard(path)
                return io.BytesIO(b"")
            return open(path, *args, **kwargs)

        monkeypatch.setattr(processes, "open", reading_mid_exec, raising=False)
        found = await ProcessSweeper().kill_round(marker, (), signal.SIGKILL)
        assert not blank_once  # the first read was the blank one
        assert found == [child.pid]
        with anyio.fail_after(10):
            while child.poll() is None:
                await anyio.sleep(0.01)
        assert child.returncode == -signal.SIGKILL


async def test_a_process_with_no_environment_is_read_a_few_times_then_kept_unmarked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _marked_sleep(None) as child:
        path = f"/proc/{child.pid}/environ"
        reads = 0

        def counting(name: str, *args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += name == path
            return open(name, *args, **kwargs)

        monkeypatch.setattr(processes, "open", counting, raising=False)
        with anyio.fail_after(5):
            table = await processes.sweep_process_table()
        assert reads == 1 + processes._UNSETTLED_TRIES
        assert [e.markers for e in table.entries if e.pid == child.pid] == [()]
        assert child.pid in [e.pid for e in read_process_table().entries]


def test_sweeper_validates() -> None:
    with pytest.raises(ValueError, match="slice_seconds must be > 0"):
        ProcessSweeper(slice_seconds=0)


class _Work:
    """Batch work that blocks until released, recording each batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.started = anyio.Event()
        self.go = anyio.Event()

    async def __call__(self, items: list[int]) -> None:
        self.batches.append(list(items))
        self.started.set()
        await self.go.wait()


async def test_batcher_serves_late_arrivals_together_in_the_next_batch() -> None:
    work = _Work()
    batcher: Batcher[int] = Batcher()
    served: list[int] = []

    async def submit(i: int) -> None:
        await batcher.submit(i, work)
        served.append(i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, 0)
        await work.started.wait()
        for i in range(1, 6):
            tg.start_soon(submit, i)
        await anyio.wait_all_tasks_blocked()
        work.go.set()
    assert [sorted(b) for b in work.batches] == [[0], [1, 2, 3, 4, 5]] and batcher.runs == 2
    assert sorted(served) == [0, 1, 2, 3, 4, 5]


async def test_batcher_hands_over_when_a_runner_is_cancelled() -> None:
    work = _Work()
    batcher: Batcher[str] = Batcher()
    served: list[str] = []

    async def submit(item: str, scope: anyio.CancelScope) -> None:
        with scope:
            await batcher.submit(item, work)  # type: ignore[arg-type]
            served.append(item)

    scopes = {name: anyio.CancelScope() for name in "abc"}
    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, "a", scopes["a"])  # runs batch 1 (blocks in the work)
        await work.started.wait()
        tg.start_soon(submit, "b", scopes["b"])  # will run batch 2, waits for batch 1
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(submit, "c", scopes["c"])  # joins batch 2
        await anyio.wait_all_tasks_blocked()
        scopes["b"].cancel("test: the runner of the pending batch is cancelled")
        await anyio.wait_all_tasks_blocked()  # c found batch 2 abandoned and asked again
        work.go.set()
    assert sorted(served) == ["a", "c"]
    assert work.batches == [["a"], ["c"]]  # batch 2 never ran; c was served by a new one
    assert batcher.runs == 2


async def test_batcher_runner_cancelled_mid_work_still_serves_the_next_batch() -> None:
    work = _Work()
    batcher: Batcher[int] = Batcher()
    served: list[int] = []

    async def submit(i: int, scope: anyio.CancelScope) -> None:
        with scope:
            await batcher.submit(i, work)
            served.append(i)

    runner = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, 0, runner)
        await work.started.wait()
        for i in (1, 2):
            tg.start_soon(submit, i, anyio.CancelScope())
        await anyio.wait_all_tasks_blocked()
        work.started = anyio.Event()
        runner.cancel("test: the running batch's runner is cancelled")
        await work.started.wait()  # the next batch started once the first was abandoned
        work.go.set()
    assert sorted(served) == [1, 2]
    assert work.batches[0] == [0] and sorted(work.batches[1]) == [1, 2]
