"""The bounded-cleanup helper: shielded from the caller, bounded by its own deadline, logged."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from hermes_async._cleanup import acquisition_scope, bounded_cleanup, cleanup_scope

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]


async def test_cleanup_runs_although_the_caller_is_cancelled() -> None:
    done = False
    with anyio.CancelScope() as outer:
        outer.cancel("test")
        with cleanup_scope("step", 5):
            await anyio.sleep(0.01)
            done = True
    assert done


async def test_cleanup_is_abandoned_at_its_deadline_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="hermes_async.cleanup")
    with cleanup_scope("close thing", 0.05, reason="rollout cancelled") as step:
        await anyio.sleep(10)
    assert step.overran
    assert "close thing" in caplog.text
    assert "rollout cancelled" in caplog.text


async def test_bounded_cleanup_swallows_errors_but_not_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="hermes_async.cleanup")

    async def boom() -> None:
        raise OSError("disk gone")

    assert await bounded_cleanup("remove dir", boom, timeout=1) is None
    assert "remove dir" in caplog.text and "disk gone" in caplog.text

    async def value() -> int:
        return 7

    assert await bounded_cleanup("v", value, timeout=1) == 7


async def test_the_callers_cancellation_is_delivered_after_the_step() -> None:
    steps: list[str] = []
    with anyio.CancelScope() as outer:
        outer.cancel("test")
        with cleanup_scope("step", 5):
            await anyio.sleep(0)
            steps.append("cleaned")
        steps.append("after")  # no checkpoint between: still runs
        await anyio.sleep(0)
        steps.append("unreachable")
    assert steps == ["cleaned", "after"]
    assert outer.cancelled_caught


def test_bad_timeout_is_a_clear_error() -> None:
    with (
        pytest.raises(ValueError, match="cleanup timeout must be >= 0 seconds, got -1"),
        cleanup_scope("x", -1),
    ):
        pass


def test_shields_are_written_only_in_the_cleanup_helper() -> None:
    """Every shielded scope is a cleanup (cleanup_scope) or an acquisition (acquisition_scope),
    docstring examples included (users copy them)."""
    root = Path(__file__).resolve().parents[1] / "hermes_async"
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "_cleanup.py"
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if "shield=True" in line
    ]
    assert found == []


def test_an_acquisition_needs_a_positive_deadline() -> None:
    with pytest.raises(ValueError, match="> 0"), acquisition_scope(0):
        pass


async def test_an_acquisition_finishes_under_cancellation_then_delivers_it() -> None:
    steps: list[str] = []
    with anyio.CancelScope() as outer:
        outer.cancel("the caller gave up")
        with acquisition_scope(5):
            await anyio.sleep(0.01)  # not interrupted by the caller's cancellation
            steps.append("acquired")
        await anyio.sleep(1)  # the caller's cancellation lands here
        steps.append("not reached")
    assert steps == ["acquired"] and outer.cancelled_caught
