"""The driver's dispatcher against scripted workers: spread, cap, lost workers, deadlines."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
import trio.testing

from hermes_async.errors import RequestError
from hermes_async.service.dispatch import (
    DispatchOptions,
    GroupDispatcher,
    WorkerLostError,
    pick_worker,
)
from hermes_async.service.wire import GroupRequest, GroupResult, RolloutRecord

pytestmark = pytest.mark.anyio

VIRTUAL = pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}), id="trio")],
)


class FakeWorker:
    """A worker whose behaviour per call is a script: answer, lose, hang."""

    def __init__(self, name: str, behave: Callable[[GroupRequest], str] = lambda r: "ok") -> None:
        self.name = name
        self.behave = behave
        self.in_flight = 0
        self.most_in_flight = 0
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.release = anyio.Event()

    async def run_group(self, request: GroupRequest) -> GroupResult:
        self.calls.append(request.group_id)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            what = self.behave(request)
            if what == "dead":
                raise WorkerLostError(f"{self.name} died", worker=self.name, dead=True)
            if what == "bad":
                raise RequestError("bad item", status=422)
            if what == "hang":
                await anyio.sleep_forever()
            if what == "gate":
                await self.release.wait()
            await anyio.sleep(0.01)
            record = RolloutRecord("t", [1], [1], [-0.1], 1.0, True)
            return GroupResult(
                request.group_id, request.environment, "ok", (record,), worker=self.name
            )
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(request.group_id)
            raise
        finally:
            self.in_flight -= 1


def requests(n: int, seconds: float = 60.0) -> list[GroupRequest]:
    return [GroupRequest.within(seconds, "echo", {}, 1, group_id=f"g{i}") for i in range(n)]


def test_pick_worker_takes_the_least_loaded_under_the_cap() -> None:
    assert pick_worker([(2, True), (1, True), (1, True)], 4, frozenset(), 0) == 1
    assert pick_worker([(2, True), (1, True), (1, True)], 4, frozenset(), 2) == 2  # round robin
    assert pick_worker([(4, True), (4, True)], 4, frozenset(), 0) is None  # all at the cap
    assert pick_worker([(0, False), (3, True)], 4, frozenset(), 0) == 1  # dead skipped
    assert pick_worker([(0, True), (3, True)], 4, frozenset({0}), 0) == 1  # avoided skipped


async def test_groups_spread_over_workers_and_never_pass_the_cap() -> None:
    workers = [FakeWorker("a"), FakeWorker("b")]
    dispatcher = GroupDispatcher(workers, DispatchOptions(max_per_worker=2))
    seen: list[str] = []
    results = await dispatcher.run_groups(requests(12), on_result=lambda r: seen.append(r.group_id))
    assert [r.group_id for r in results] == [f"g{i}" for i in range(12)]
    assert sorted(seen) == sorted(f"g{i}" for i in range(12))  # each group reported once
    assert all(r.outcome == "ok" for r in results)
    assert [w.most_in_flight for w in workers] == [2, 2]
    assert sorted(len(w.calls) for w in workers) == [6, 6]


async def test_a_lost_group_goes_to_another_worker() -> None:
    dead, alive = FakeWorker("dead", lambda r: "dead"), FakeWorker("alive")
    dispatcher = GroupDispatcher([dead, alive], DispatchOptions(max_per_worker=4))
    results = await dispatcher.run_groups(requests(4))
    assert [r.outcome for r in results] == ["ok"] * 4
    assert all(r.worker == "alive" for r in results)
    assert len(dead.calls) == 1  # then avoided as dead
    # trio may start any of the four first: exactly the one that met the dead worker retried.
    assert sorted(r.attempts for r in results) == [1, 1, 1, 2]
    assert next(r for r in results if r.attempts == 2).group_id == dead.calls[0]
    assert dispatcher.statistics().dead == ("dead",)


async def test_without_retries_a_lost_group_fails_with_the_reason() -> None:
    dead = FakeWorker("w0", lambda r: "dead")
    dispatcher = GroupDispatcher([dead], DispatchOptions(retry_elsewhere=False))
    [result] = await dispatcher.run_groups(requests(1))
    assert result.outcome == "failed" and result.rollouts == ()
    assert result.failure is not None and result.failure.category == "infra"
    assert "w0 died" in result.failure.message
    # The only worker is dead now: the next group fails at once, saying so.
    [again] = await dispatcher.run_groups(requests(1))
    assert again.failure is not None and "no live worker" in again.failure.message


async def test_a_bad_request_is_raised_not_retried() -> None:
    bad = FakeWorker("w0", lambda r: "bad")
    other = FakeWorker("w1")
    dispatcher = GroupDispatcher([bad, other], DispatchOptions(max_per_worker=1))
    with pytest.raises(RequestError, match="bad item"):
        await dispatcher.run_group(requests(1)[0])
    assert other.calls == []


async def test_repeated_group_ids_are_refused() -> None:
    dispatcher = GroupDispatcher([FakeWorker("w0")])
    twice = [GroupRequest.within(60, "echo", {}, 1, group_id="same")] * 2
    with pytest.raises(ValueError, match=r"repeated group ids: \['same'\]"):
        await dispatcher.run_groups(twice)


@VIRTUAL
async def test_a_worker_that_does_not_answer_is_not_waited_for() -> None:
    slow = FakeWorker("slow", lambda r: "hang")
    dispatcher = GroupDispatcher([slow], DispatchOptions(answer_grace_seconds=5))
    start = anyio.current_time()
    [result] = await dispatcher.run_groups(requests(1, seconds=30))
    waited = anyio.current_time() - start
    assert 34 <= waited <= 36  # the deadline plus the grace, not forever
    assert result.outcome == "failed"
    assert result.failure is not None and result.failure.category == "agent_timeout"
    assert "did not answer by the deadline" in result.failure.message
    assert slow.cancelled == ["g0"]  # the call was cancelled: the group is cancelled there


@VIRTUAL
async def test_a_slow_worker_does_not_hold_the_batch() -> None:
    # The first group the slow worker gets hangs (trio may start any group first).
    slow = FakeWorker("slow", lambda r: "hang" if len(slow.calls) == 1 else "ok")
    fast = FakeWorker("fast")
    dispatcher = GroupDispatcher(
        [slow, fast], DispatchOptions(max_per_worker=8, answer_grace_seconds=1)
    )
    done: dict[str, float] = {}
    start = anyio.current_time()
    results = await dispatcher.run_groups(
        requests(6, seconds=20),
        on_result=lambda r: done.setdefault(r.group_id, anyio.current_time()),
    )
    hung = slow.calls[0]
    assert [r.outcome for r in results] == [
        "failed" if r.group_id == hung else "ok" for r in results
    ]
    assert all(done[r.group_id] - start < 1 for r in results if r.group_id != hung)  # not held
    assert 20 <= done[hung] - start <= 22


@VIRTUAL
async def test_groups_wait_for_a_slot_within_their_deadline() -> None:
    gated = FakeWorker("w0", lambda r: "gate")
    dispatcher = GroupDispatcher([gated], DispatchOptions(max_per_worker=1, answer_grace_seconds=0))
    async with anyio.create_task_group() as tg:
        first = requests(1, seconds=100)[0]
        second = GroupRequest.within(10, "echo", {}, 1, group_id="late")
        results: dict[str, GroupResult] = {}

        async def run(request: GroupRequest) -> None:
            results[request.group_id] = await dispatcher.run_group(request)

        tg.start_soon(run, first)
        await anyio.sleep(1)
        tg.start_soon(run, second)
        await anyio.sleep(20)  # the second's deadline passes while the first holds the slot
        gated.release.set()
    assert results["g0"].outcome == "ok"
    late = results["late"]
    assert late.outcome == "failed" and late.failure is not None
    assert late.failure.category == "infra"
    assert "no worker had room before the deadline" in late.failure.message
    assert gated.calls == ["g0"]


async def test_cancelling_the_batch_cancels_every_call() -> None:
    workers = [FakeWorker("a", lambda r: "hang"), FakeWorker("b", lambda r: "hang")]
    dispatcher = GroupDispatcher(workers, DispatchOptions(max_per_worker=4))
    with anyio.move_on_after(0.5):
        await dispatcher.run_groups(requests(6))
    assert sorted(workers[0].cancelled + workers[1].cancelled) == sorted(f"g{i}" for i in range(6))
    assert dispatcher.statistics().in_flight == {"a": 0, "b": 0}
