"""Warm pools: ready sandboxes handed out by ``get()``, refilled, aged, checked and drained."""

from __future__ import annotations

import pathlib

import anyio
import pytest

from hermes_async.errors import ConfigError
from hermes_async.testing.fake_sandbox import FakeSandbox, FakeSandboxFactory
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.local import local_factory
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.sandbox.spec import SandboxSpec
from hermes_async.tools.sandbox.warm_pool import WarmPoolOptions
from tests.support import wait_until

pytestmark = pytest.mark.anyio


class SpecFactory:
    """Records the spec of every creation, in order."""

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency
        self.specs: list[SandboxSpec | None] = []
        self.created: list[FakeSandbox] = []

    async def __call__(self, task_id: str, spec: SandboxSpec | None = None) -> Sandbox:
        self.specs.append(spec)
        await anyio.sleep(self.latency)
        sandbox = FakeSandbox(task_id, workdir=(spec.workdir if spec and spec.workdir else "/w"))
        self.created.append(sandbox)
        return sandbox


def ready(manager: SandboxManager) -> int:
    stats = manager.statistics().warm_pool
    assert stats is not None
    return stats.ready


@pytest.mark.virtual_clock
async def test_get_takes_a_ready_sandbox_and_the_pool_refills() -> None:
    factory = FakeSandboxFactory(create_latency=0.05)
    async with SandboxManager(factory, warm_pool=WarmPoolOptions(size=2)) as manager:
        await wait_until(lambda: ready(manager) == 2)
        assert factory.attempts == 2
        start = anyio.current_time()
        sandbox = await manager.get("rollout-1")
        assert anyio.current_time() - start < factory.create_latency  # no creation waited for
        assert sandbox.inner in factory.created and sandbox.inner.task_id == "rollout-1"
        await wait_until(lambda: ready(manager) == 2)  # topped up
        stats = manager.statistics()
        assert stats.warm_pool is not None and (stats.warm_pool.hits, stats.warm_pool.misses) == (
            1,
            0,
        )
        assert factory.attempts == 3
    assert all(s.closed for s in factory.created)  # the used one released, the pool drained


@pytest.mark.virtual_clock
async def test_an_empty_pool_means_a_cold_create_not_a_wait() -> None:
    factory = FakeSandboxFactory(create_latency=0.2)
    options = WarmPoolOptions(size=1, fill_concurrency=1)
    async with SandboxManager(factory, warm_pool=options, limits=None) as manager:
        # The filler's first creation is in flight: get() creates its own at once.
        a, b = await manager.get("a"), await manager.get("b")
        assert a.inner is not b.inner
        stats = manager.statistics().warm_pool
        assert stats is not None and stats.misses >= 1
    assert all(s.closed for s in factory.created)


@pytest.mark.virtual_clock
async def test_a_dead_pooled_sandbox_is_closed_not_handed_out() -> None:
    factory = FakeSandboxFactory()
    async with SandboxManager(
        factory, warm_pool=WarmPoolOptions(size=2, fill_concurrency=1)
    ) as manager:
        await wait_until(lambda: ready(manager) == 2)
        first = factory.created[0]
        first.die("exited")
        sandbox = await manager.get("t")
        assert sandbox.inner is factory.created[1]
        await wait_until(lambda: first.closed)  # closed by the filler, not by the taker
        stats = manager.statistics().warm_pool
        assert stats is not None and stats.failed_checks == 1


@pytest.mark.virtual_clock
async def test_the_taker_does_not_wait_for_a_dead_sandbox_to_close() -> None:
    factory = FakeSandboxFactory(close_latency=1.0)
    async with SandboxManager(
        factory, warm_pool=WarmPoolOptions(size=2, fill_concurrency=1)
    ) as manager:
        await wait_until(lambda: ready(manager) == 2)
        first = factory.created[0]
        first.die("exited")
        start = anyio.current_time()
        sandbox = await manager.get("t")
        assert anyio.current_time() - start < 0.5  # not the dead one's 1 s close
        assert sandbox.inner is factory.created[1] and not first.closed
        await wait_until(lambda: first.closed)
    assert all(s.closed for s in factory.created)


@pytest.mark.virtual_clock
async def test_a_probe_that_hangs_counts_as_dead() -> None:
    class Hung(FakeSandbox):
        async def alive(self) -> bool:
            await anyio.sleep_forever()
            return True  # pragma: no cover

    factory = FakeSandboxFactory(sandbox=None)
    hung = Hung("pool")
    calls = 0

    async def make(task_id: str) -> Sandbox:
        nonlocal calls
        calls += 1
        return hung if calls == 1 else await factory(task_id)

    options = WarmPoolOptions(size=1, check_timeout=0.1, fill_concurrency=1)
    async with SandboxManager(make, warm_pool=options) as manager:
        await wait_until(lambda: ready(manager) == 1)
        sandbox = await manager.get("t")
        assert sandbox.inner is not hung
        await wait_until(lambda: hung.closed)


@pytest.mark.virtual_clock
async def test_sandboxes_past_max_age_are_replaced_never_handed_out() -> None:
    factory = FakeSandboxFactory()
    options = WarmPoolOptions(size=2, max_age=0.2)
    async with SandboxManager(factory, warm_pool=options) as manager:
        await wait_until(lambda: ready(manager) == 2)
        old = list(factory.created)
        await wait_until(lambda: all(s.closed for s in old) and ready(manager) == 2)
        stats = manager.statistics().warm_pool
        assert stats is not None and stats.expired >= 2
        sandbox = await manager.get("t")
        assert sandbox.inner not in old
    assert all(s.closed for s in factory.created)


@pytest.mark.virtual_clock
async def test_close_drains_the_pool_and_cancels_fills_in_flight() -> None:
    factory = FakeSandboxFactory(create_latency=0.3)
    async with SandboxManager(factory, warm_pool=WarmPoolOptions(size=3)) as manager:
        await anyio.sleep(0.05)  # three creations in flight
        assert factory.attempts == 3
    assert factory.created == []  # cancelled before any finished: nothing was made
    async with SandboxManager(FakeSandboxFactory(), warm_pool=WarmPoolOptions(size=3)) as manager:
        await wait_until(lambda: ready(manager) == 3)
        made = list(manager.warm_pool._warm[""].ready) if manager.warm_pool else []
    assert len(made) == 3 and all(s.closed for s, _ in made)


@pytest.mark.virtual_clock
async def test_prewarmed_specs_fill_in_the_order_asked_and_are_handed_out_by_spec() -> None:
    factory = SpecFactory(latency=0.01)
    spec_a, spec_b = SandboxSpec(workdir="/a"), SandboxSpec(workdir="/b")
    options = WarmPoolOptions(size=1, warm_default=False, fill_concurrency=1)
    async with SandboxManager(factory, warm_pool=options) as manager:
        manager.prewarm(spec_a)
        manager.prewarm(spec_b)
        await wait_until(lambda: ready(manager) == 2)
        assert factory.specs == [spec_a, spec_b]
        manager.assign_spec("t", spec_b)
        sandbox = await manager.get("t")
        assert sandbox.workdir == "/b" and len(factory.specs) == 2
        manager.assign_spec("u", SandboxSpec(workdir="/c"))  # not warm: created cold
        assert (await manager.get("u")).workdir == "/c"


@pytest.mark.virtual_clock
async def test_asking_for_more_specs_than_max_specs_drops_the_oldest() -> None:
    factory = SpecFactory()
    options = WarmPoolOptions(size=1, warm_default=False, max_specs=2)
    async with SandboxManager(factory, warm_pool=options) as manager:
        specs = [SandboxSpec(workdir=f"/{n}") for n in "abc"]
        manager.prewarm(specs[0])
        manager.prewarm(specs[1])
        await wait_until(lambda: ready(manager) == 2)
        manager.prewarm(specs[2])
        await wait_until(lambda: ready(manager) == 2 and factory.created[0].closed)
        assert [s.workdir for s in factory.created if not s.closed] == ["/b", "/c"]


@pytest.mark.virtual_clock
async def test_prewarm_needs_a_factory_that_takes_a_spec() -> None:
    async with SandboxManager(FakeSandboxFactory(), warm_pool=WarmPoolOptions(size=1)) as manager:
        with pytest.raises(ConfigError, match="spec= keyword"):
            manager.prewarm(SandboxSpec(workdir="/a"))
        manager.prewarm(None)  # the default is fine


@pytest.mark.virtual_clock
async def test_fill_failures_back_off_and_get_still_works() -> None:
    factory = FakeSandboxFactory(fail_create=RuntimeError("quota"), fail_times=2)
    async with SandboxManager(
        factory, warm_pool=WarmPoolOptions(size=1, fill_concurrency=1)
    ) as manager:
        await wait_until(lambda: ready(manager) == 1, timeout=15)
        stats = manager.statistics().warm_pool
        assert stats is not None and stats.fill_failures == 2
        assert (await manager.get("t")).inner is factory.created[0]


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="size"):
        WarmPoolOptions(size=-1)
    with pytest.raises(ValueError, match="max_age"):
        WarmPoolOptions(max_age=0)
    with pytest.raises(ValueError, match="fill_concurrency"):
        WarmPoolOptions(fill_concurrency=0)


@pytest.mark.virtual_clock
async def test_size_zero_is_no_pool() -> None:
    async with SandboxManager(FakeSandboxFactory(), warm_pool=WarmPoolOptions(size=0)) as manager:
        assert manager.warm_pool is None and manager.statistics().warm_pool is None
        manager.prewarm(None)


async def test_a_local_pool_hands_out_working_isolated_sandboxes(tmp_path: pathlib.Path) -> None:
    factory = local_factory(str(tmp_path), isolation="process")
    async with SandboxManager(factory, warm_pool=WarmPoolOptions(size=2)) as manager:
        await wait_until(lambda: ready(manager) == 2, timeout=30)
        a, b = await manager.get("a"), await manager.get("b")
        assert a.inner is not b.inner
        await a.exec("echo mine > f")
        assert (await b.exec("cat f")).exit_code != 0
        assert (await a.exec("cat f")).stdout.strip() == "mine"
    assert list(p for p in tmp_path.iterdir() if p.name.startswith("hermes-sbx-")) == []
