"""What the remote backends share, on both doubles (E2B and Daytona): cancellation during
create, create timeouts, a sandbox dying mid-rollout, deadlines, the rate limiter, the reaper,
the manager's close hook, and randomized cancellations (during create, exec, background start,
close) that must leave no sandbox in the provider's books. SDK-specific behaviour (create
parameters, auth errors, trio, the registry) and the conformance suite are in test_e2b.py and
test_daytona.py."""

from __future__ import annotations

import os
import pathlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import pytest

from hermes_async.errors import SandboxError
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
from hermes_async.tools.sandbox.errors import SandboxUnavailableError
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import SOAK, cancelled_once_set

pytestmark = pytest.mark.anyio

#: Randomized cancellations in every run (split over the two doubles); the soak test
#: (``HERMES_ASYNC_SOAK=1``) runs ``HERMES_ASYNC_REMOTE_CANCELLATIONS`` (default 10,000).
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
    #: The double's operation names for a file write and a delete, and the SDK's key variable.
    write_op: str
    delete_op: str
    key_env: str

    def live_ids(self) -> list[str]:
        return [r.sandbox_id for r in self.fake.live]


KINDS = ["e2b", "daytona"]


@pytest.fixture(params=KINDS)
def provider(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Provider:
    return make_provider(request.param, tmp_path)


def make_provider(name: str, workdir: pathlib.Path, **fake_options: object) -> Provider:
    common = {"workdir": str(workdir), "home": str(workdir)}
    if name == "e2b":
        e2b = FakeE2B(workdir=str(workdir), **fake_options)  # type: ignore[arg-type]

        def build_e2b(run_id: str | None = None, **options: object) -> E2BBackend:
            config = E2BSandboxConfig(**{**common, **options})  # type: ignore[arg-type]
            return E2BBackend(config, e2b=e2b, run_id=run_id)

        return Provider(name, e2b, build_e2b, "files.write", "kill", "E2B_API_KEY")
    daytona = FakeDaytona(workdir=str(workdir), **fake_options)  # type: ignore[arg-type]

    def build_daytona(run_id: str | None = None, **options: object) -> DaytonaBackend:
        config = DaytonaSandboxConfig(**{**common, **options})  # type: ignore[arg-type]
        return DaytonaBackend(config, daytona=daytona, run_id=run_id)

    return Provider(name, daytona, build_daytona, "fs.upload_file", "delete", "DAYTONA_API_KEY")


def creating(started: anyio.Event) -> Callable[[], float]:
    """A create latency of 0.5 s that sets ``started`` when the provider begins the create."""

    def latency() -> float:
        started.set()
        return 0.5

    return latency


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_during_create_deletes_the_sandbox(tmp_path: pathlib.Path, kind: str) -> None:
    started = anyio.Event()
    provider = make_provider(kind, tmp_path, create_delay_seconds=creating(started))
    factory = provider.build()
    assert await cancelled_once_set(started, lambda: factory("t"))
    # The create was under way (the provider had made the sandbox) when the cancel came; it
    # was deleted once its id arrived, not left for the reaper.
    assert len(provider.fake.sandboxes) == 1
    assert provider.fake.live == []
    assert factory.live == set()
    assert factory.reaps[-1].found == ()  # only the start-up sweep ran, before the create


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_during_a_managers_create_leaves_nothing(
    tmp_path: pathlib.Path, kind: str
) -> None:
    started = anyio.Event()
    provider = make_provider(kind, tmp_path, create_delay_seconds=creating(started))
    factory = provider.build()
    async with SandboxManager(factory) as manager:
        assert await cancelled_once_set(started, lambda: manager.get("t"))
        assert provider.fake.live == []  # gone before the manager closes (and reaps)


@pytest.mark.parametrize("kind", KINDS)
async def test_create_timeout_is_an_error_and_sweeps_the_leftover(
    tmp_path: pathlib.Path, kind: str
) -> None:
    provider = make_provider(kind, tmp_path, hang={"create"})
    factory = provider.build(create_timeout=0.3)
    start = anyio.current_time()
    with pytest.raises(SandboxError, match=rf"did not finish within 0\.3 s.*{provider.key_env}"):
        await factory("t")
    assert anyio.current_time() - start < 5
    # The hung create had made a sandbox server-side; the sweep by task label removed it.
    assert len(provider.fake.sandboxes) == 1
    assert provider.fake.live == []


@pytest.mark.parametrize("kind", KINDS)
async def test_the_sdks_own_create_timeout_is_an_error(tmp_path: pathlib.Path, kind: str) -> None:
    # The SDK's own create deadline (we pass ours) fires first and leaves the sandbox made.
    provider = make_provider(kind, tmp_path, create_delay_seconds=5)
    factory = provider.build(create_timeout=0.2)
    with pytest.raises(SandboxError, match="did not finish within"):
        await factory("t")
    assert len(provider.fake.sandboxes) == 1
    assert provider.fake.live == []


async def test_a_sandbox_dying_mid_rollout_is_unavailable(provider: Provider) -> None:
    factory = provider.build()
    sb = await factory("t")
    try:
        assert (await sb.exec("echo alive")).stdout == "alive\n"
        await provider.fake.die(sb.sandbox_id)
        with pytest.raises(SandboxUnavailableError, match="gone") as info:
            await sb.exec("echo again")
        assert info.value.category == "infra"
        # Every later operation says the same.
        with pytest.raises(SandboxUnavailableError):
            await sb.read_bytes("x")
        with pytest.raises(SandboxUnavailableError):
            await sb.write_bytes("x", b"1")
    finally:
        await sb.aclose()


async def test_a_sandbox_dying_during_a_command_is_an_infra_failure(provider: Provider) -> None:
    factory = provider.build()
    async with SandboxManager(factory) as manager:
        sandbox = await manager.get("t")

        async def kill_soon() -> None:
            await anyio.sleep(0.3)
            remote = factory.live.copy().pop()
            await provider.fake.die(remote)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            with pytest.raises(SandboxUnavailableError):
                await sandbox.exec("sleep 30")
        failure = manager.sandbox_failure("t")
        assert failure is not None and failure.category == "infra"
    assert provider.fake.live == []


async def test_a_timeout_keeps_the_partial_output(provider: Provider) -> None:
    async with await provider.build()("t") as sb:
        result = await sb.exec("echo before; echo oops >&2; sleep 30; echo after", timeout=0.5)
        assert (result.exit_code, result.timed_out) == (124, True)
        assert result.stdout == "before\n"
        assert result.stderr.startswith("oops\n")
        assert result.duration_seconds < 10


async def test_hung_calls_hit_their_deadlines(provider: Provider) -> None:
    fake = provider.fake
    factory = provider.build(call_timeout=0.3, delete_timeout=0.3)
    sb = await factory("t")
    fake.faults.hang.add(provider.write_op)
    with pytest.raises(SandboxError, match=r"write .* did not answer within 0\.3 s"):
        await sb.write_bytes("x", b"1")
    fake.faults.hang.add(provider.delete_op)
    start = anyio.current_time()
    await sb.aclose()
    assert anyio.current_time() - start < 5
    assert len(fake.live) == 1  # the hung delete left it ...
    fake.faults.hang.clear()
    await factory.aclose()  # ... and the reaper deletes it
    assert fake.live == []


async def test_creation_is_rate_limited(tmp_path: pathlib.Path) -> None:
    for kind in KINDS:
        provider = make_provider(kind, tmp_path, create_delay_seconds=0.05)
        factory = provider.build(max_creates_per_second=40.0, max_concurrent_creates=3)
        begin = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for i in range(9):
                tg.start_soon(factory, f"t{i}")
        assert provider.fake.max_creates_in_flight <= 3
        # Starts are spaced 1/rate apart: the 9th cannot start before 8/40 s.
        assert max(provider.fake.create_start_times) - begin >= 0.95 * 8 / 40
        await factory.aclose()  # the reaper deletes all nine (nobody held them)
        assert provider.fake.live == []


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
        create_timeout=0.05,  # some creates (delay up to 0.06 s) time out
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


@SOAK
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
