"""What the remote backends share, on both doubles: the reaper, the manager's close hook, and
randomized cancellations (during create, exec, background start, close) that must leave no
sandbox in the provider's books."""

from __future__ import annotations

import os
import pathlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import pytest

from hermes_async.testing.daytona_double import FakeDaytona
from hermes_async.testing.e2b_double import FakeE2B
from hermes_async.tools.sandbox._remote import (
    HERMES_LABEL,
    RUN_LABEL,
    TASK_LABEL,
    RemoteBackend,
)
from hermes_async.tools.sandbox.daytona import DaytonaBackend, DaytonaSandboxConfig
from hermes_async.tools.sandbox.e2b import E2BBackend, E2BSandboxConfig
from hermes_async.tools.sandbox.manager import SandboxManager

pytestmark = pytest.mark.anyio

#: Randomized cancellations in the default run (split over the two doubles); the slow test
#: runs ``HERMES_ASYNC_REMOTE_CANCELLATIONS`` (default 10,000).
DEFAULT_CANCELLATIONS = 500


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # Both SDKs are asyncio-only (test_e2b.py / test_daytona.py assert the error under trio).
    return ("asyncio", {"debug": True})


@dataclass
class Provider:
    """One double and how to build a backend on it."""

    name: str
    fake: FakeE2B | FakeDaytona
    build: Callable[..., RemoteBackend[E2BSandboxConfig] | RemoteBackend[DaytonaSandboxConfig]]

    def live_ids(self) -> list[str]:
        return [r.sandbox_id for r in self.fake.live]


@pytest.fixture(params=["e2b", "daytona"])
def provider(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Provider:
    return make_provider(request.param, tmp_path)


def make_provider(name: str, workdir: pathlib.Path, **fake_options: object) -> Provider:
    common = {"workdir": str(workdir), "home": str(workdir)}
    if name == "e2b":
        e2b = FakeE2B(workdir=str(workdir), **fake_options)  # type: ignore[arg-type]

        def build_e2b(run_id: str | None = None, **options: object) -> E2BBackend:
            config = E2BSandboxConfig(**{**common, **options})  # type: ignore[arg-type]
            return E2BBackend(config, e2b=e2b, run_id=run_id)

        return Provider(name, e2b, build_e2b)
    daytona = FakeDaytona(workdir=str(workdir), **fake_options)  # type: ignore[arg-type]

    def build_daytona(run_id: str | None = None, **options: object) -> DaytonaBackend:
        config = DaytonaSandboxConfig(**{**common, **options})  # type: ignore[arg-type]
        return DaytonaBackend(config, daytona=daytona, run_id=run_id)

    return Provider(name, daytona, build_daytona)


async def test_reaper_deletes_this_runs_orphans_and_no_one_elses(provider: Provider) -> None:
    fake = provider.fake
    ours = [
        fake.inject_orphan({HERMES_LABEL: "1", RUN_LABEL: "run-a", TASK_LABEL: f"t{i}"})
        for i in range(150)  # more than one page of the provider's list
    ]
    theirs = [
        fake.inject_orphan({HERMES_LABEL: "1", RUN_LABEL: "run-b", TASK_LABEL: f"t{i}"})
        for i in range(20)
    ]
    unlabelled = [fake.inject_orphan({"team": "other"}) for _ in range(5)]
    factory = provider.build(run_id="run-a")
    sb = await factory("fresh")  # first use: the start-up sweep
    assert set(factory.reaps[0].deleted) == set(ours)
    assert factory.reaps[0].failed == factory.reaps[0].skipped == ()
    live = set(provider.live_ids())
    assert live.isdisjoint(ours)
    assert set(theirs) <= live and set(unlabelled) <= live
    # Leftovers that appear during the run (a crash elsewhere in it) go at exit.
    late = fake.inject_orphan({HERMES_LABEL: "1", RUN_LABEL: "run-a", TASK_LABEL: "late"})
    await sb.aclose()
    await factory.aclose()
    assert factory.reaps[-1].deleted == (late,)
    assert set(provider.live_ids()) == set(theirs) | set(unlabelled)


async def test_reaper_checks_labels_again_before_deleting(provider: Provider) -> None:
    # Even a list filter that lets everything through must not make the reaper delete another
    # run's sandbox.
    theirs = provider.fake.inject_orphan({HERMES_LABEL: "1", RUN_LABEL: "run-b"})
    factory = provider.build(run_id="run-a", reap_on_start=False)
    client = factory._client_for()
    original = client.list_ids

    async def unfiltered(labels: object) -> list[tuple[str, dict[str, str]]]:
        return await original({})

    client.list_ids = unfiltered  # type: ignore[method-assign]
    report = await factory.reap()
    assert report.skipped == (theirs,) and report.deleted == ()
    assert theirs in provider.live_ids()


async def test_the_manager_closes_the_factory_and_its_leftovers_go(provider: Provider) -> None:
    factory = provider.build(run_id="run-m")
    async with SandboxManager(factory) as manager:
        sandbox = await manager.get("t1")
        assert (await sandbox.exec("echo hi")).stdout == "hi\n"
        orphan = provider.fake.inject_orphan({HERMES_LABEL: "1", RUN_LABEL: "run-m"})
    assert provider.fake.live == []
    assert orphan in factory.reaps[-1].deleted


@dataclass
class Tally:
    outcomes: Counter[str]
    cancelled_in: Counter[str]


async def run_randomized(provider: Provider, count: int, seed: int) -> Tally:
    """``count`` rollouts, each cancelled at a random moment (many during create)."""
    rng = random.Random(seed)
    factory = provider.build(
        max_creates_per_second=10_000.0,
        max_concurrent_creates=64,
        create_timeout_seconds=0.05,  # some creates (delay up to 0.06 s) time out
        reap_on_start=False,  # the books must be clean without the reaper's help
    )
    tally = Tally(Counter(), Counter())
    in_create: set[int] = set()

    async def rollout(i: int, budget: float, plan: float) -> None:
        phase = "create"
        with anyio.move_on_after(budget) as scope:
            in_create.add(i)
            try:
                sb = await factory(f"task-{i}")
            except Exception:
                tally.outcomes["create_failed"] += 1  # it timed out: its sandbox was swept
                return
            finally:
                in_create.discard(i)
            async with sb:
                if plan < 0.5:
                    phase = "exec"
                    await sb.exec(f"sleep {plan / 10:.3f}; echo done")
                elif plan < 0.65:
                    phase = "background start"
                    await sb.start_background("sleep 30")
                elif plan < 0.75:
                    phase = "file write"
                    await sb.write_bytes("f.txt", b"x")
                phase = "idle"
                await anyio.sleep(plan / 50)
        tally.outcomes["cancelled" if scope.cancelled_caught else "completed"] += 1
        if scope.cancelled_caught:
            tally.cancelled_in[phase] += 1

    provider.fake.create_delay_seconds = lambda: rng.uniform(0.0, 0.06)
    batch = 40
    for start in range(0, count, batch):
        async with anyio.create_task_group() as tg:
            for i in range(start, min(count, start + batch)):
                tg.start_soon(rollout, i, rng.uniform(0.0, 0.3), rng.random())
    assert in_create == set()
    leaks = provider.live_ids()
    assert leaks == [], f"{len(leaks)} sandbox(es) left in {provider.name}'s books: {leaks[:5]}"
    await factory.aclose()
    assert factory.reaps[-1].deleted == ()  # nothing was left for the reaper
    return tally


@pytest.mark.parametrize("count", [DEFAULT_CANCELLATIONS // 2])
async def test_randomized_cancellations_leave_no_sandbox(provider: Provider, count: int) -> None:
    tally = await run_randomized(provider, count, seed=1234)
    # The schedule really exercised the interesting cases.
    assert tally.cancelled_in["create"] > count // 20, tally
    assert tally.cancelled_in["exec"] > count // 20, tally
    assert tally.outcomes["cancelled"] > count // 10, tally
    assert tally.outcomes["completed"] > 0 and tally.outcomes["create_failed"] > 0, tally
    assert sum(tally.outcomes.values()) == count


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_randomized_cancellations_at_scale(
    provider: Provider, capsys: pytest.CaptureFixture[str]
) -> None:
    count = int(os.environ.get("HERMES_ASYNC_REMOTE_CANCELLATIONS", "10000")) // 2
    start = anyio.current_time()
    tally = await run_randomized(provider, count, seed=99)
    elapsed = anyio.current_time() - start
    with capsys.disabled():
        print(
            f"\n{provider.name}: {count} rollouts in {elapsed:.1f} s; "
            f"cancelled in {dict(tally.cancelled_in)}; "
            f"outcomes {dict(tally.outcomes)}; sandboxes created {len(provider.fake.sandboxes)}; "
            f"left in the books {len(provider.fake.live)}"
        )
    assert sum(tally.outcomes.values()) == count
