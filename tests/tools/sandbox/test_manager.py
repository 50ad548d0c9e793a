from __future__ import annotations

import math
import pathlib

import anyio
import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.limits import Limits
from hermes_async.testing.fake_sandbox import FakeSandbox, FakeSandboxFactory
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.local import LocalSandbox, local_factory
from hermes_async.tools.sandbox.manager import (
    ManagedSandbox,
    SandboxManager,
    current_sandbox_manager,
    open_sandbox_manager,
    use_sandbox_manager,
)
from tests.support import wait_until

pytestmark = pytest.mark.anyio


@pytest.mark.virtual_clock
async def test_concurrent_get_creates_exactly_one() -> None:
    factory = FakeSandboxFactory(create_latency=0.05)
    async with SandboxManager(factory) as manager:
        got: list[ManagedSandbox] = []

        async def get() -> None:
            got.append(await manager.get("t1"))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(get)
        assert len(factory.created) == 1
        assert {id(g.inner) for g in got} == {id(factory.created[0])}
        assert "t1" in manager and manager.task_ids() == ["t1"]
        assert manager.statistics().created == 1
    assert factory.created[0].closed


@pytest.mark.virtual_clock
async def test_create_is_gated_by_limiter() -> None:
    limits = Limits(sandbox_create=2)
    factory = FakeSandboxFactory(create_latency=0.2)
    peak = 0

    async with SandboxManager(factory, limits=limits) as manager:

        async def get(i: int) -> None:
            await manager.get(f"t{i}")

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, limits.sandbox_create.statistics().in_use)
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as outer:
            outer.start_soon(watch)
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(get, i)
            outer.cancel_scope.cancel()
    assert peak == 2
    assert limits.sandbox_create.statistics().acquisitions == 6


@pytest.mark.virtual_clock
async def test_exec_is_gated_by_limiter() -> None:
    limits = Limits(sandbox_exec=1)
    release = anyio.Event()

    async def script(command: str) -> str:
        await release.wait()
        return "ok"

    fake = FakeSandbox(exec_script=script)
    async with SandboxManager(FakeSandboxFactory(sandbox=fake), limits=limits) as manager:
        sb = await manager.get("t")
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(sb.exec, "x")
            await anyio.wait_all_tasks_blocked()
            stats = limits.sandbox_exec.statistics()
            assert stats.in_use == 1 and stats.waiting == 2
            assert manager.statistics().busy == 1
            release.set()
        assert limits.sandbox_exec.statistics().acquisitions == 3


@pytest.mark.virtual_clock
async def test_creation_failure_propagates_to_all_waiters() -> None:
    factory = FakeSandboxFactory(create_latency=0.05, fail_create=RuntimeError("no capacity"))
    async with SandboxManager(factory) as manager:
        errors: list[BaseException] = []

        async def get() -> None:
            try:
                await manager.get("t")
            except SandboxError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(get)
        assert len(errors) == 3
        assert all("no capacity" in str(e) for e in errors)
        assert factory.attempts == 1
        assert manager.statistics().create_failures == 1
        # A later get retries.
        factory.fail_create = None
        assert isinstance(await manager.get("t"), ManagedSandbox)


@pytest.mark.virtual_clock
async def test_creation_timeout_is_sandbox_error() -> None:
    async with SandboxManager(FakeSandboxFactory(create_hangs=True), create_timeout=0.1) as m:
        with pytest.raises(SandboxError, match=r"creation timed out after 0\.1 s"):
            await m.get("t")


class GatedFactory:
    """Creation blocks until ``go`` is set; ``started`` fires when a creation begins."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.go = anyio.Event()
        self.attempts = 0
        self.created: list[FakeSandbox] = []

    async def __call__(self, task_id: str) -> Sandbox:
        self.attempts += 1
        self.started.set()
        await self.go.wait()
        sb = FakeSandbox(task_id)
        self.created.append(sb)
        return sb


async def test_cancelled_creator_hands_over_to_waiter() -> None:
    factory = GatedFactory()
    async with SandboxManager(factory) as manager:
        result: list[Sandbox] = []
        creator_scope = anyio.CancelScope()

        async def creator() -> None:
            with creator_scope:
                await manager.get("t")

        async def waiter() -> None:
            result.append(await manager.get("t"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(creator)
            await factory.started.wait()
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            factory.started = anyio.Event()
            creator_scope.cancel()
            await factory.started.wait()  # the waiter started a new creation
            factory.go.set()
        assert len(result) == 1
        assert factory.attempts == 2 and len(factory.created) == 1


async def test_release_is_idempotent_and_closes() -> None:
    factory = FakeSandboxFactory()
    async with SandboxManager(factory) as manager:
        sb = await manager.get("t")
        await manager.release("t")
        await manager.release("t")
        await manager.release("never-created")
        fake = factory.created[0]
        assert fake.closed and fake.close_count == 1
        with pytest.raises(SandboxError, match="was released"):
            await sb.exec("ls")
        again = await manager.get("t")
        assert again.inner is not fake
    assert manager.statistics().released == 2


@pytest.mark.virtual_clock
async def test_release_runs_even_when_cancelled() -> None:
    closed = anyio.Event()

    class SlowClose(FakeSandbox):
        async def aclose(self, interrupted: bool = False) -> None:
            await anyio.sleep(0.1)
            await super().aclose(interrupted)
            closed.set()

    async with SandboxManager(FakeSandboxFactory(sandbox=SlowClose())) as manager:
        await manager.get("t")
        with anyio.CancelScope() as scope:
            scope.cancel()
            await manager.release("t")
        assert closed.is_set()


@pytest.mark.virtual_clock
async def test_release_that_hangs_is_bounded() -> None:
    class Hang(FakeSandbox):
        async def aclose(self, interrupted: bool = False) -> None:
            await anyio.sleep_forever()

    async with SandboxManager(FakeSandboxFactory(sandbox=Hang()), close_timeout=0.1) as m:
        await m.get("t")
        start = anyio.current_time()
        await m.release("t")
        assert anyio.current_time() - start < 2
        assert "t" not in m


async def test_release_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(FakeSandbox):
        async def aclose(self, interrupted: bool = False) -> None:
            raise RuntimeError("backend exploded")

    async with SandboxManager(FakeSandboxFactory(sandbox=Broken())) as m:
        await m.get("t")
        await m.release("t")
    assert "cleanup failed: close the sandbox of 't': RuntimeError: backend exploded" in caplog.text


async def test_release_during_creation_closes_new_sandbox() -> None:
    factory = GatedFactory()
    async with SandboxManager(factory) as manager:
        async with anyio.create_task_group() as tg:

            async def get() -> None:
                with pytest.raises(SandboxError, match="released while it was being created"):
                    await manager.get("t")

            tg.start_soon(get)
            await factory.started.wait()
            await manager.release("t")
            factory.go.set()
        assert factory.created[0].closed
        assert "t" not in manager


@pytest.mark.virtual_clock
async def test_idle_reaper_closes_unused_sandboxes() -> None:
    factory = FakeSandboxFactory()
    async with SandboxManager(factory, idle_timeout=0.2, reap_interval=0.05) as manager:
        await manager.get("idle")
        busy = await manager.get("busy")
        running = await manager.get("bg")
        proc = await running.start_background("server")
        with anyio.fail_after(5):
            while "idle" in manager:
                await busy.exec("true")
                await anyio.sleep(0.05)
        assert "busy" in manager
        assert "bg" in manager  # a running background process keeps it alive
        factory.created[2].finish_background(proc.session_id)
        with anyio.fail_after(5):
            while "bg" in manager:
                await busy.exec("true")
                await anyio.sleep(0.05)
        assert manager.statistics().reaped == 2


@pytest.mark.virtual_clock
async def test_an_idle_manager_holds_no_task_until_a_release_is_queued() -> None:
    # A standalone loop opens a manager per run: thousands of parked rollouts must not each
    # keep an idle janitor task (issue #23, resident memory per idle rollout).
    factory = FakeSandboxFactory()
    before = len(anyio.get_running_tasks())
    async with SandboxManager(factory, idle_timeout=None) as manager:
        assert len(anyio.get_running_tasks()) == before
        await manager.get("t")
        assert len(anyio.get_running_tasks()) == before
        manager.request_release("t")  # the first queued release starts the janitor
        await wait_until(lambda: "t" not in manager)
        assert len(anyio.get_running_tasks()) == before + 1
    assert len(anyio.get_running_tasks()) == before
    assert factory.created[0].closed


@pytest.mark.virtual_clock
async def test_request_release_is_done_by_janitor() -> None:
    factory = FakeSandboxFactory()
    async with SandboxManager(factory) as manager:
        await manager.get("t")
        manager.request_release("t")
        assert "t" in manager  # synchronous call only queues
        await wait_until(lambda: "t" not in manager)
        assert factory.created[0].closed


async def test_request_release_does_not_touch_a_newer_sandbox() -> None:
    factory = FakeSandboxFactory()
    async with SandboxManager(factory) as manager:
        await manager.get("t")
        manager.request_release("t")
        await manager.release("t")
        await manager.get("t")
        await anyio.wait_all_tasks_blocked()  # the janitor has handled the queued release
        assert "t" in manager and not factory.created[1].closed


async def test_manager_must_be_open() -> None:
    manager = SandboxManager(FakeSandboxFactory())
    with pytest.raises(SandboxError, match=r"not open .*async with SandboxManager"):
        await manager.get("t")
    async with manager:
        pass
    with pytest.raises(SandboxError, match="has been closed"):
        await manager.get("t")
    with pytest.raises(RuntimeError, match="cannot be entered twice"):
        async with manager:
            pass


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="create_timeout must be > 0"):
        SandboxManager(FakeSandboxFactory(), create_timeout=0)
    with pytest.raises(ValueError, match="idle_timeout must be > 0"):
        SandboxManager(FakeSandboxFactory(), idle_timeout=-1)
    # Before: accepted. An infinite close or create bound is an unbounded wait; a reap
    # interval of 0 a janitor that never sleeps.
    for field in ("close_timeout", "create_timeout"):
        with pytest.raises(ConfigError, match=rf"SandboxManager\.{field} must be > 0 and finite"):
            SandboxManager(FakeSandboxFactory(), **{field: math.inf})
    for bad in (0, -1, math.inf):
        with pytest.raises(ConfigError, match=r"SandboxManager\.reap_interval must be > 0"):
            SandboxManager(FakeSandboxFactory(), reap_interval=bad)
    assert SandboxManager(FakeSandboxFactory(), idle_timeout=None).idle_timeout == math.inf


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"default_timeout": 0}, "default_timeout must be > 0 and finite, got 0"),
        ({"default_timeout": math.inf}, "default_timeout must be > 0 and finite, got inf"),
        ({"terminate_grace": -1}, "terminate_grace must be >= 0 and finite, got -1"),
        ({"env_allowlist": "PATH"}, "a bare string would be read as its characters"),
        ({"env_allowlist": ["PATH", "A=B"]}, "env_allowlist must be a list of variable names"),
        ({"extra_env": ["A"]}, "extra_env must be a mapping"),
        ({"extra_env": {"A=B": "x"}}, "invalid variable name 'A=B'"),
        (
            {"extra_env": {"PORT": 8080}},
            r"extra_env\['PORT'\] must be a string without NUL, got int",
        ),
    ],
)
def test_local_factory_refuses_bad_options_when_made(
    options: dict[str, object], match: str
) -> None:
    # Before: accepted; a bare allowlist string copied variables named 'P', 'A', 'T', 'H' and
    # a non-string value failed at the sandbox's first command.
    with pytest.raises(ConfigError, match=match):
        local_factory(**options)  # type: ignore[arg-type]


def test_a_bad_environment_value_is_never_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        local_factory(extra_env={"API_KEY": "sk-secret\0"})
    assert "sk-secret" not in str(caught.value)
    assert "API_KEY" in str(caught.value)


async def test_exit_releases_everything_even_when_cancelled() -> None:
    factory = FakeSandboxFactory()
    with anyio.CancelScope() as scope:
        async with SandboxManager(factory) as manager:
            for i in range(5):
                await manager.get(f"t{i}")
            scope.cancel()
            await anyio.sleep(1)
    assert all(s.closed for s in factory.created) and len(factory.created) == 5


async def test_current_manager_contextvar() -> None:
    assert current_sandbox_manager() is None
    async with SandboxManager(FakeSandboxFactory()) as manager:
        with use_sandbox_manager(manager):
            assert current_sandbox_manager() is manager
            seen: list[SandboxManager | None] = []

            async def child() -> None:
                seen.append(current_sandbox_manager())

            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
            assert seen == [manager]
        assert current_sandbox_manager() is None
    async with open_sandbox_manager(FakeSandboxFactory()) as m2:
        assert current_sandbox_manager() is m2
    assert current_sandbox_manager() is None


async def test_local_factory_through_manager(tmp_path: pathlib.Path) -> None:
    async with SandboxManager(local_factory(str(tmp_path))) as manager:
        sb = await manager.get("task/with odd:chars")
        assert isinstance(sb.inner, LocalSandbox)
        r = await sb.exec("echo hi")
        assert r.stdout == "hi\n"
        await sb.write_bytes("x.bin", b"\0\1")
        assert await sb.read_bytes("x.bin") == b"\0\1"
        assert repr(manager).startswith("<SandboxManager [open | 1 active")
    assert list(tmp_path.iterdir()) == []


async def test_release_passes_interrupted_to_the_backend() -> None:
    factory = FakeSandboxFactory()
    async with SandboxManager(factory) as manager:
        await manager.get("graceful")
        await manager.get("cut")
        managed = await manager.get("managed")
        await manager.release("graceful")
        await manager.release("cut", interrupted=True)
        await managed.aclose(interrupted=True)
    assert [s.closes for s in factory.created] == [[False], [True], [True]]


async def test_exit_releases_interrupted_when_the_block_raised() -> None:
    factory = FakeSandboxFactory()
    with pytest.raises(RuntimeError, match="rollout crashed"):
        async with SandboxManager(factory) as manager:
            await manager.get("t")
            raise RuntimeError("rollout crashed")
    async with SandboxManager(factory) as manager:
        await manager.get("u")
    assert [s.closes for s in factory.created] == [[True], [False]]
    await manager.aclose()  # idempotent after exit
    unopened = SandboxManager(factory)
    await unopened.aclose()
    with pytest.raises(SandboxError, match="has been closed"):
        await unopened.get("t")


@pytest.mark.virtual_clock
async def test_exit_is_bounded_by_close_timeout_alone(caplog: pytest.LogCaptureFixture) -> None:
    """Each release is the one bound: exiting with stuck closes takes ~close_timeout, once."""

    class Hang(FakeSandbox):
        async def aclose(self, interrupted: bool = False) -> None:
            await anyio.sleep_forever()

    class HangFactory(FakeSandboxFactory):
        async def __call__(self, task_id: str) -> Sandbox:
            sandbox = Hang(task_id)
            self.created.append(sandbox)
            return sandbox

    start = anyio.current_time()
    with anyio.CancelScope() as scope:
        async with SandboxManager(HangFactory(), close_timeout=0.5) as manager:
            for i in range(5):
                await manager.get(f"t{i}")
            scope.cancel("test: the run is cancelled")
            await anyio.sleep(10)
    elapsed = anyio.current_time() - start
    assert 0.5 <= elapsed < 4  # concurrent releases, each bounded by 0.5 s; no second bound
    overruns = [r for r in caplog.records if "overran its deadline" in r.getMessage()]
    assert len(overruns) == 5
    assert "cleanup because: the rollout was interrupted" in overruns[0].getMessage()


@pytest.mark.virtual_clock
async def test_exit_waits_for_a_close_another_task_started() -> None:
    # A straggler (a worker atroposlib cancelled and forgot) is closing its sandbox when the
    # run's manager exits: the exit returns only once that close is done.
    closing, closed = anyio.Event(), anyio.Event()

    class SlowClose(FakeSandbox):
        async def aclose(self, interrupted: bool = False) -> None:
            closing.set()
            await anyio.sleep(0.3)
            await super().aclose(interrupted)
            closed.set()

    async with anyio.create_task_group() as tg:
        async with SandboxManager(FakeSandboxFactory(sandbox=SlowClose())) as manager:
            await manager.get("t")
            tg.start_soon(manager.release, "t")
            await closing.wait()
        assert closed.is_set()
        assert manager.statistics().released == 1


async def get_or_record(manager: SandboxManager, task_id: str, errors: list[str]) -> None:
    """``manager.get(task_id)``; a SandboxError's message is appended to ``errors``."""
    try:
        await manager.get(task_id)
    except SandboxError as exc:
        errors.append(str(exc))


async def open_gate_later(factory: GatedFactory) -> None:
    await anyio.wait_all_tasks_blocked()  # the manager's exit is waiting for the creation
    factory.go.set()


async def test_exit_waits_for_a_creation_in_flight_and_closes_its_sandbox() -> None:
    factory = GatedFactory()
    errors: list[str] = []
    async with anyio.create_task_group() as tg:
        async with SandboxManager(factory) as manager:
            tg.start_soon(get_or_record, manager, "t", errors)
            await factory.started.wait()
            tg.start_soon(open_gate_later, factory)
        # The exit waited for the creation, and the sandbox it made was closed.
        assert len(factory.created) == 1 and factory.created[0].closed
    assert len(errors) == 1 and "released while it was being created" in errors[0]


async def test_a_creation_queued_when_the_exit_begins_creates_nothing() -> None:
    factory = GatedFactory()
    errors: list[str] = []
    async with anyio.create_task_group() as tg:
        async with SandboxManager(factory, limits=Limits(sandbox_create=1)) as manager:
            tg.start_soon(get_or_record, manager, "first", errors)
            await factory.started.wait()
            tg.start_soon(get_or_record, manager, "queued", errors)  # waits for the one slot
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(open_gate_later, factory)
        assert factory.attempts == 1  # the queued one never reached the factory
        assert [s.closed for s in factory.created] == [True]
    assert len(errors) == 2
    assert any("closed before this sandbox could be created" in m for m in errors)


@pytest.mark.virtual_clock
async def test_exit_wait_for_a_stuck_creation_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    factory = GatedFactory()  # never opened: the creation hangs until its own deadline
    async with anyio.create_task_group() as tg:
        start = anyio.current_time()
        async with SandboxManager(factory, create_timeout=0.3, close_timeout=0.3) as manager:

            async def get() -> None:
                with pytest.raises(SandboxError, match="timed out"):
                    await manager.get("t")

            tg.start_soon(get)
            await factory.started.wait()
        assert anyio.current_time() - start < 5
