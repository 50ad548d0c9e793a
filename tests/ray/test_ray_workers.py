"""Rollout workers as Ray actors on a real multi-node cluster (``make test-ray``).

The cluster is ``scripts/ray/cluster.sh``'s: a head and worker raylets on 127.0.0.1. The
scripted model server runs in its own process; the actors reach it over loopback and run
real local sandboxes (namespaced where the machine allows). Asyncio only: Ray owns the loop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from hermes_async.service.config import WorkerConfig
from hermes_async.service.dispatch import DispatchOptions
from hermes_async.service.ray import RayWorkerPool
from hermes_async.service.wire import GroupRequest, GroupResult
from hermes_async.service.worker import WorkerOptions
from hermes_async.tools.sandbox.leftovers import count_sandboxes
from tests.support import processes_mentioning

pytestmark = [
    pytest.mark.ray,
    pytest.mark.timeout(900),  # on 2 shared cores the 1,000 rollouts take 1-3 minutes
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]

ray = pytest.importorskip("ray", reason="Ray is not installed: make test-ray builds .venv-ray")

SERVE = """
import anyio
from hermes_async.testing import ScriptedModelServer, open_loopback_server
from hermes_async.testing.worker_tasks import echo_policy

async def main():
    server = ScriptedModelServer(echo_policy, max_chunk_tokens=8)
    async with open_loopback_server(server) as url:
        print(url, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        message = 'no Ray cluster: eval "$(scripts/ray/cluster.sh up)" (make test-ray does)'
        if os.environ.get("HERMES_ASYNC_REQUIRE_RAY") == "1":
            pytest.fail(f"HERMES_ASYNC_REQUIRE_RAY=1 but {message}", pytrace=False)
        pytest.skip(message)
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) >= 3, "the tests want a head and two worker raylets"
    assert {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    return tmp_path / "worker-roots"


def config(model_url: str, parent: Path, **options: Any) -> WorkerConfig:
    return WorkerConfig(
        ("echo=hermes_async.testing.worker_tasks:echo_task",),
        (model_url,),
        options=WorkerOptions(sandbox_parent=str(parent), **options),
    )


def groups(n: int, size: int, seconds: float, **item: Any) -> list[GroupRequest]:
    return [
        GroupRequest.within(seconds, "echo", {"label": f"g{i}", **item}, size, group_id=f"g{i}")
        for i in range(n)
    ]


def check_once(requests: list[GroupRequest], results: list[GroupResult], seen: list[str]) -> None:
    """Every group reported, exactly once, in order."""
    assert [r.group_id for r in results] == [r.group_id for r in requests]
    assert sorted(seen) == sorted(r.group_id for r in requests)
    assert len(set(seen)) == len(seen)


async def test_a_thousand_rollouts_over_four_actors(
    cluster: None, model_url: str, parent: Path
) -> None:
    requests = groups(125, 8, 900)
    seen: list[str] = []
    async with RayWorkerPool(
        config(model_url, parent), workers=4, dispatch=DispatchOptions(max_per_worker=8)
    ) as pool:
        start = time.monotonic()
        results = await pool.run_groups(requests, on_result=lambda r: seen.append(r.group_id))
        took = time.monotonic() - start
        sent = pool.statistics().sent
        workers = await pool.worker_statistics()
    check_once(requests, results, seen)
    rollouts = [r for g in results for r in g.rollouts]
    assert len(rollouts) == 1000 and len({r.task_id for r in rollouts}) == 1000
    assert {g.outcome for g in results} == {"ok"}
    assert all(r.reward == 1.0 and r.failure is None for r in rollouts)
    assert len({g.worker for g in results}) == 4 and all(n > 0 for n in sent.values())
    assert sum(w["sandboxes"]["created"] for w in workers if w) == 1000
    assert all(w["sandboxes"]["active"] == 0 for w in workers if w)
    assert count_sandboxes(str(parent)) == 0  # counted on disk, after the run
    print(f"\n1000 rollouts over 4 actors in {took:.1f} s ({1000 / took:.1f} rollouts/s)")


async def test_an_actor_whose_process_dies_while_starting_is_started_again(
    cluster: None, model_url: str, parent: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hold = tmp_path / "hold"
    config = WorkerConfig(
        ("echo=tests.ray.held_task:echo_task",),
        (model_url,),
        options=WorkerOptions(sandbox_parent=str(parent)),
    )
    pool = RayWorkerPool(
        config,
        workers=2,
        actor_options={"runtime_env": {"env_vars": {"HERMES_TEST_HOLD": str(hold)}}},
    )
    killed: list[int] = []

    async def kill_one_then_release() -> None:
        with anyio.fail_after(60):
            while not (started := list(tmp_path.glob("started-*"))):
                await anyio.sleep(0.05)
        killed.append(int(started[0].name.removeprefix("started-")))
        os.kill(killed[0], signal.SIGKILL)
        hold.touch()

    async with anyio.create_task_group() as tg:
        tg.start_soon(kill_one_then_release)
        async with pool:
            assert len(pool.pids) == 2 and killed[0] not in pool.pids
            results = await pool.run_groups(groups(4, 2, 120))
    assert {g.outcome for g in results} == {"ok"}
    assert "died while starting (attempt 1 of 3)" in caplog.text
    assert count_sandboxes(str(parent)) == 0


async def test_a_killed_actor_loses_nothing_and_leaves_nothing(
    cluster: None, model_url: str, parent: Path
) -> None:
    requests = groups(24, 4, 120, sleep=2)
    seen: list[str] = []
    async with RayWorkerPool(
        config(model_url, parent),
        workers=4,
        dispatch=DispatchOptions(max_per_worker=6, revive_after_seconds=600),
    ) as pool:
        victim, victim_pid = pool.handles[0].name, pool.pids[0]

        async def kill_when_busy() -> None:
            with anyio.fail_after(60):
                while pool.statistics().in_flight[victim] < 2:
                    await anyio.sleep(0.05)
            await anyio.sleep(1.0)  # its rollouts are in their sandboxes now
            os.kill(victim_pid, signal.SIGKILL)

        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_when_busy)
            results = await pool.run_groups(requests, on_result=lambda r: seen.append(r.group_id))
        took = time.monotonic() - start
        stats = pool.statistics()
        report = await pool.sweep()  # the survivors reap the dead actor's sandboxes
    check_once(requests, results, seen)
    assert took < 120  # within the deadline
    assert stats.lost[victim] >= 2 and victim in stats.dead
    moved = [r for r in results if r.attempts > 1]
    assert moved and all(r.outcome == "ok" and r.worker != victim for r in moved)
    assert all(r.outcome == "ok" for r in results)
    # The dead actor's root is reaped (its namespaced worlds died with it; a process-mode
    # sandbox's escaped processes would be killed here: tests/tools/sandbox/test_leftovers.py).
    assert report.roots == 1
    assert count_sandboxes(str(parent)) == 0
    assert sorted(os.listdir(parent)) == []
    # No process of a world is left either (worlds being built when the actor died included).
    with anyio.move_on_after(15):
        while processes_mentioning(str(parent)):
            await anyio.sleep(0.1)
    assert processes_mentioning(str(parent)) == []


async def test_a_batch_cancelled_from_the_driver_releases_every_sandbox(
    cluster: None, model_url: str, parent: Path
) -> None:
    requests = groups(8, 4, 300, sleep=120)
    async with RayWorkerPool(
        config(model_url, parent), workers=2, dispatch=DispatchOptions(max_per_worker=4)
    ) as pool:
        with anyio.move_on_after(60) as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_when_running() -> None:
                    while True:
                        stats = [w for w in await pool.worker_statistics() if w]
                        if sum(w["sandboxes"]["active"] for w in stats) >= 32:
                            tg.cancel_scope.cancel(reason="the driver cancels the batch")
                            return
                        await anyio.sleep(0.2)

                tg.start_soon(cancel_when_running)
                await pool.run_groups(requests)
        assert not scope.cancelled_caught, "the sandboxes never all started"
        with anyio.fail_after(60):
            while True:
                stats = [w for w in await pool.worker_statistics() if w]
                if all(w["groups_running"] == 0 and w["sandboxes"]["active"] == 0 for w in stats):
                    break
                await anyio.sleep(0.2)
        assert sum(w["sandboxes"]["released"] for w in stats) == 32
        assert sum(w["answered"].get("ok", 0) for w in stats) == 0
    assert count_sandboxes(str(parent)) == 0
