from __future__ import annotations

import time

import anyio
import pytest

from hermes_async.errors import ConfigError, LimitError, UnknownLimiterError
from hermes_async.limits import LagMonitor, Limits, NamedLimiter, open_lag_monitor

pytestmark = pytest.mark.anyio


async def test_defaults_and_custom_limiters() -> None:
    limits = Limits(tool_calls=3, extra_thing=2)
    assert limits.tool_calls.total == 3
    assert limits["extra_thing"].total == 2
    assert set(limits.statistics()) == {
        "model_requests",
        "sandbox_create",
        "sandbox_exec",
        "tool_calls",
        "extra_thing",
    }
    with pytest.raises(KeyError, match="unknown limiter 'nope'; available: "):
        limits["nope"]


@pytest.mark.parametrize("catch", [KeyError, ConfigError, LimitError, UnknownLimiterError])
def test_an_unknown_limiter_is_a_config_error_that_is_also_a_key_error(
    catch: type[Exception],
) -> None:
    limits = Limits(extra_thing=2)
    with pytest.raises(
        catch,
        match=r"unknown limiter 'nope'; available: extra_thing, model_requests, sandbox_create, "
        r"sandbox_exec, tool_calls; add it with limits.add\('nope', total\)",
    ) as info:
        limits["nope"]
    assert isinstance(info.value, UnknownLimiterError)
    assert (info.value.limiter, info.value.value) == ("nope", "nope")


def test_standard_limiters_are_read_only_views_of_the_named_ones() -> None:
    limits = Limits(tool_calls=3)
    assert limits.tool_calls is limits["tool_calls"]
    assert [lim.name for lim in limits][:4] == [
        "model_requests",
        "sandbox_create",
        "sandbox_exec",
        "tool_calls",
    ]
    with pytest.raises(AttributeError):
        limits.tool_calls = NamedLimiter("tool_calls", 1)  # type: ignore[misc]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_bad_totals_rejected(bad: object) -> None:
    # A LimitError: a ConfigError (operator mistake), so still the ValueError it always was.
    for catch in (ValueError, ConfigError, LimitError):
        with pytest.raises(
            catch, match=rf"limiter 'x': total must be an integer >= 1, got {bad!r}"
        ):
            NamedLimiter("x", bad)  # type: ignore[arg-type]
    with pytest.raises(LimitError) as info:
        Limits(tool_calls=bad)  # type: ignore[arg-type]
    assert (info.value.limiter, info.value.value) == ("tool_calls", bad)
    with pytest.raises(LimitError, match="limiter 'tool_calls'"):
        Limits().resize("tool_calls", bad)  # type: ignore[arg-type]


async def test_stats_report_in_use_and_waiting() -> None:
    lim = NamedLimiter("tools", 2)
    release = anyio.Event()
    entered = 0

    async def worker() -> None:
        nonlocal entered
        async with lim:
            entered += 1
            await release.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(worker)
        await anyio.wait_all_tasks_blocked()
        s = lim.statistics()
        assert (s.total, s.in_use, s.waiting) == (2, 2, 3)
        assert entered == 2
        # Growing the limiter admits waiters immediately.
        lim.set_total(4)
        await anyio.wait_all_tasks_blocked()
        s = lim.statistics()
        assert (s.total, s.in_use, s.waiting) == (4, 4, 1)
        # Shrinking keeps current holders and admits nobody new.
        lim.set_total(1)
        await anyio.wait_all_tasks_blocked()
        s = lim.statistics()
        assert (s.in_use, s.waiting) == (4, 1)
        release.set()
    s = lim.statistics()
    assert (s.in_use, s.waiting, s.acquisitions) == (0, 0, 5)
    assert s.max_wait_seconds >= 0.0


async def test_resize_through_limits() -> None:
    limits = Limits()
    limits.resize("sandbox_create", 5)
    assert limits.sandbox_create.total == 5
    assert limits.add("web", 3).total == 3
    assert limits.add("web", 7) is limits["web"]
    assert limits["web"].total == 7


async def test_cancelled_waiter_holds_nothing() -> None:
    lim = NamedLimiter("x", 1)
    async with anyio.create_task_group() as tg:
        hold = anyio.Event()

        async def holder() -> None:
            async with lim:
                await hold.wait()

        tg.start_soon(holder)
        await anyio.wait_all_tasks_blocked()
        with anyio.move_on_after(0.05):
            async with lim:
                pytest.fail("should not get a slot")
        assert lim.statistics().waiting == 0
        hold.set()
    assert lim.statistics().in_use == 0


async def test_lag_monitor_detects_blocking_call() -> None:
    async with open_lag_monitor(0.005) as mon:
        await anyio.sleep(0.1)
        quiet = mon.statistics()
        time.sleep(0.25)  # deliberately block the event loop
        await anyio.sleep(0.05)
        stats = mon.statistics()
    assert quiet.samples > 3
    assert stats.max >= 0.2
    assert stats.max > quiet.max
    assert "max" in str(stats)


def test_lag_percentiles() -> None:
    mon = LagMonitor(0.01)
    for i in range(100):
        mon.record(i / 1000)
    s = mon.statistics()
    assert s.samples == 100
    assert s.p50 == pytest.approx(0.049)
    assert s.p99 == pytest.approx(0.098)
    assert s.max == pytest.approx(0.099)
    mon.reset()
    assert mon.statistics().samples == 0
    with pytest.raises(ConfigError, match="lag monitor interval must be > 0 seconds, got 0"):
        LagMonitor(0)
