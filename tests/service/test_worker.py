"""The rollout worker in-process: groups answered by their deadline, refusals, drain, cancel."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from hermes_async._groups import unwrap_group
from hermes_async.agent.rollout import RolloutTask
from hermes_async.errors import ConfigError, RequestError
from hermes_async.inference.pool import PoolOptions, ServerPool
from hermes_async.jsontypes import JSON
from hermes_async.service.environments import FunctionEnvironment
from hermes_async.service.wire import GroupRequest
from hermes_async.service.worker import RolloutWorker, WorkerOptions, open_worker
from hermes_async.testing import Fault, ScriptedModelServer, open_asgi_transport
from hermes_async.testing.worker_tasks import echo_policy, echo_task
from hermes_async.tools.sandbox.leftovers import count_sandboxes
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio


def broken_task(item: JSON) -> RolloutTask:
    raise RuntimeError("the dataset is gone")


SERVER = ScriptedModelServer(echo_policy, tokenizer=TOKENIZER)


@asynccontextmanager
async def worker_on(
    tmp_path: Path, server: ScriptedModelServer = SERVER, **options: Any
) -> AsyncIterator[RolloutWorker]:
    """A worker with the echo and broken environments, on the scripted server in-process."""
    async with (
        open_asgi_transport(server) as transport,
        ServerPool(
            ["http://scripted"],
            transport=transport,
            options=PoolOptions(eject_after_failures=1000),
        ) as pool,
        open_worker(
            {
                "echo": FunctionEnvironment(echo_task),
                "broken": FunctionEnvironment(broken_task),
            },
            pool,
            options=WorkerOptions(
                name="w0",
                sandbox_parent=str(tmp_path / "roots"),
                isolation="process",
                **options,
            ),
            tokenizer=TOKENIZER,
        ) as worker,
    ):
        yield worker
    assert count_sandboxes(str(tmp_path / "roots")) == 0
    assert os.listdir(tmp_path / "roots") == []  # the worker's own root went with it


def echo(size: int = 2, seconds: float = 60, **item: Any) -> GroupRequest:
    return GroupRequest.within(seconds, "echo", {"label": "x", **item}, size)


async def test_a_group_comes_back_scored(tmp_path: Path) -> None:
    async with worker_on(tmp_path) as worker:
        result = await worker.run_group(echo(3, turns=2))
        stats = worker.statistics()
    assert result.outcome == "ok" and result.worker == "w0"
    assert result.rewards == [1.0, 1.0, 1.0]
    for r in result.rollouts:
        assert len(r.tokens) == len(r.masks) == len(r.logprobs) > 0
        assert r.trainable and r.turns == 3 and r.failure is None
    assert stats.accepted == 1 and stats.answered == {"ok": 1}
    assert stats.sandboxes.created == stats.sandboxes.released == 3
    assert stats.groups_running == stats.rollouts_running == 0
    assert set(stats.limiters) >= {"worker_groups", "model_requests", "sandbox_create"}


async def test_refusals_say_why(tmp_path: Path) -> None:
    async with worker_on(tmp_path) as worker:
        with pytest.raises(
            RequestError, match=r"unknown environment 'nope'; .*serves: broken, echo"
        ) as e:
            await worker.run_group(GroupRequest.within(60, "nope", {}, 1))
        assert e.value.status == 404
        with pytest.raises(RequestError, match="refused the item: ValueError: label") as e:
            await worker.run_group(GroupRequest.within(60, "echo", {"label": "a b"}, 1))
        assert e.value.status == 422
        async with anyio.create_task_group() as tg:
            slow = echo(1, sleep=2)
            tg.start_soon(worker.run_group, slow)
            await anyio.sleep(0.3)
            with pytest.raises(RequestError, match="already running") as e:
                worker.admit(slow)
            assert e.value.status == 409
        assert worker.statistics().refused == 3
        # It goes on serving.
        assert (await worker.run_group(echo(1))).outcome == "ok"


async def test_a_failing_environment_is_a_classified_failure(tmp_path: Path) -> None:
    async with worker_on(tmp_path) as worker:
        result = await worker.run_group(GroupRequest.within(60, "broken", {}, 2))
    assert result.outcome == "failed" and result.rollouts == ()
    assert result.failure is not None and result.failure.category == "infra"
    assert "the dataset is gone" in result.failure.message


async def test_a_dead_model_server_is_a_classified_failure(tmp_path: Path) -> None:
    down = ScriptedModelServer(
        echo_policy, tokenizer=TOKENIZER, fault_plan=lambda n, body: Fault.http_error(404)
    )
    async with worker_on(tmp_path, down) as worker:
        result = await worker.run_group(echo(2))
    assert result.outcome == "failed"
    assert result.failure is not None and result.failure.category == "infra"
    assert "model" in result.failure.message


async def test_rollouts_that_cannot_finish_end_by_the_deadline(tmp_path: Path) -> None:
    async with worker_on(tmp_path, reply_reserve_seconds=0.5) as worker:
        start = anyio.current_time()
        result = await worker.run_group(echo(2, seconds=3, sleep=60))
        took = anyio.current_time() - start
    assert took < 3.0  # answered by the deadline, with time to send it
    assert [r.failure.category for r in result.rollouts if r.failure] == ["agent_timeout"] * 2
    assert result.rewards == [0.0, 0.0]


async def test_a_group_waiting_past_its_deadline_for_a_slot_fails_as_such(tmp_path: Path) -> None:
    async with worker_on(tmp_path, max_groups=1) as worker, anyio.create_task_group() as tg:
        tg.start_soon(worker.run_group, echo(1, seconds=30, sleep=3))
        await anyio.sleep(0.3)
        result = await worker.run_group(echo(1, seconds=1.5))
        assert result.outcome == "failed" and result.failure is not None
        assert result.failure.category == "agent_timeout"
        assert "its deadline" in result.failure.message


async def test_drain_finishes_running_groups_and_admits_nothing(tmp_path: Path) -> None:
    async with worker_on(tmp_path) as worker, anyio.create_task_group() as tg:
        results: list[Any] = []

        async def run() -> None:
            results.append(await worker.run_group(echo(2, sleep=1)))

        tg.start_soon(run)
        await anyio.sleep(0.3)
        draining = anyio.Event()

        async def drain() -> None:
            results.append(await worker.drain(timeout=30))
            draining.set()

        tg.start_soon(drain)
        await anyio.sleep(0.1)
        assert worker.state == "draining"
        with pytest.raises(RequestError, match="draining: it takes no new groups") as e:
            await worker.run_group(echo(1))
        assert e.value.status == 503
        await draining.wait()
    group, cancelled = results
    assert group.outcome == "ok" and group.rewards == [1.0, 1.0]
    assert cancelled == 0


async def test_drain_timeout_answers_what_is_left_as_failed(tmp_path: Path) -> None:
    async with worker_on(tmp_path) as worker, anyio.create_task_group() as tg:
        results: list[Any] = []

        async def run() -> None:
            results.append(await worker.run_group(echo(2, sleep=60)))

        tg.start_soon(run)
        await anyio.sleep(0.5)
        assert await worker.drain(timeout=0.5) == 1
        assert worker.manager.statistics().active == 0  # released before the answer
    [group] = results
    assert group.outcome == "failed" and group.failure is not None
    assert group.failure.category == "infra"
    assert "shut down before the group finished" in group.failure.message


async def test_a_caller_that_goes_away_cancels_its_group(tmp_path: Path) -> None:
    async with worker_on(tmp_path) as worker:
        with anyio.move_on_after(0.8):
            await worker.run_group(echo(3, sleep=60))
        stats = worker.statistics()
        assert stats.groups_running == 0
        assert worker.manager.statistics().active == 0
        assert count_sandboxes(str(tmp_path / "roots")) == 0
        assert (await worker.run_group(echo(1))).outcome == "ok"


async def test_two_live_workers_cannot_share_a_name(tmp_path: Path) -> None:
    async with worker_on(tmp_path):
        try:
            async with worker_on(tmp_path):
                pytest.fail("a second worker named w0 opened")
        except BaseException as exc:  # through the test's own task groups
            caught = unwrap_group(exc) if isinstance(exc, BaseExceptionGroup) else exc
    assert isinstance(caught, ConfigError)
    assert "belongs to a running process" in str(caught)
