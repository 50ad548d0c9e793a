"""The start ramp: rollouts started in one pass begin a few per pass, and nothing waits twice."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest

from hermes_async._paced import start_paced
from hermes_async.agent._start_ramp import _ADMITTED, STARTS_PER_PASS, StartRamp, start_gate

pytestmark = pytest.mark.anyio


class Passes:
    """Counts passes of the event loop (a task that checkpoints in a loop)."""

    def __init__(self) -> None:
        self.count = 0

    async def tick(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        while True:
            await anyio.lowlevel.checkpoint()
            self.count += 1


@pytest.fixture
async def passes() -> AsyncIterator[Passes]:
    counter = Passes()
    async with anyio.create_task_group() as tg:
        await tg.start(counter.tick)
        yield counter
        tg.cancel_scope.cancel()


async def test_starts_in_one_pass_are_admitted_a_few_per_pass(passes: Passes) -> None:
    n = STARTS_PER_PASS * 8
    admitted_at: list[int] = []

    async def rollout() -> None:
        async with StartRamp():
            admitted_at.append(passes.count)

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(rollout)
    assert len(admitted_at) == n
    per_pass = collections.Counter(admitted_at)
    # Without the ramp all n begin in one pass. The ticker may be one pass off (trio shuffles
    # the order within a pass), so a count may hold two passes' worth.
    assert max(per_pass.values()) <= 2 * STARTS_PER_PASS, per_pass
    assert len(per_pass) >= n // (2 * STARTS_PER_PASS)


async def test_work_inside_an_admitted_rollout_is_not_held_back(passes: Passes) -> None:
    inner_waits: list[int] = []

    async def rollout() -> None:
        async with StartRamp():
            before = passes.count
            async with StartRamp():  # a group's rollout, a run inside run_rollout
                inner_waits.append(passes.count - before)

    async with anyio.create_task_group() as tg:
        for _ in range(STARTS_PER_PASS * 4):
            tg.start_soon(rollout)
    assert inner_waits and set(inner_waits) == {0}


async def test_admission_reaches_child_tasks_and_ends_with_the_block() -> None:
    seen: list[bool] = []

    async def child() -> None:
        seen.append(_ADMITTED.get())

    async with StartRamp(), anyio.create_task_group() as tg:
        tg.start_soon(child)  # a group's rollout: admitted with its group
    # A task that ran one rollout and then starts more must not hand them its admission.
    async with anyio.create_task_group() as tg:
        tg.start_soon(child)
    assert seen == [True, False]


async def test_cancelled_waiters_leave_the_ramp_free() -> None:
    async with anyio.create_task_group() as tg:
        for _ in range(STARTS_PER_PASS * 4):
            tg.start_soon(StartRamp().__aenter__)
        await anyio.lowlevel.checkpoint()  # the first are admitted, the rest wait
        await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()
    gate = start_gate()
    assert gate.borrowed_tokens == 0
    assert gate.statistics().tasks_waiting == 0


async def test_start_paced_yields_to_the_loop_between_chunks(passes: Passes) -> None:
    n = STARTS_PER_PASS * 8
    started_at: list[int] = []

    async def task(i: int) -> None:
        started_at.append(passes.count)

    async with anyio.create_task_group() as tg:
        await start_paced(tg, task, range(n), name=lambda i: f"task {i}")
    assert len(started_at) == n
    per_pass = collections.Counter(started_at)
    # A loop of start_soon starts all n in one pass; the ticker may be one pass off on trio.
    assert max(per_pass.values()) <= 2 * STARTS_PER_PASS, per_pass
    assert len(per_pass) >= n // (2 * STARTS_PER_PASS)


async def test_start_paced_names_tasks_and_stops_starting_when_the_group_fails() -> None:
    names: list[str | None] = []
    started: list[int] = []

    async def task(i: int) -> None:
        names.append(anyio.get_current_task().name)
        started.append(i)
        if i == 0:
            raise RuntimeError("boom")
        await anyio.sleep_forever()

    with pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as tg:
            await start_paced(tg, task, range(STARTS_PER_PASS * 100), name=lambda i: f"t{i}")
    assert caught.group_contains(RuntimeError, match="boom")
    assert "t0" in names
    # The group's failure cancels the starter at its next yield: the rest are never started.
    assert len(started) < STARTS_PER_PASS * 100
