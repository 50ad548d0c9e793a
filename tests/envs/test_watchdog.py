"""The entry points' watchdog and the eval failure counters (issue 16: waits are visible,
failures are counted)."""

from __future__ import annotations

import logging

import anyio
import pytest

from hermes_async.agent.failures import FAILURE_CATEGORIES, RolloutFailure
from hermes_async.envs._eval import eval_metrics, failed_sample
from hermes_async.envs._watchdog import Watchdog


@pytest.mark.anyio
async def test_a_stall_is_logged_with_what_the_run_waits_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dog = Watchdog(0.2, describe=lambda: "model_requests 4/4 held, 3 waiting")
    with caplog.at_level(logging.WARNING, logger="hermes_async.envs"):
        async with anyio.create_task_group() as tg:
            await tg.start(dog.run)
            with dog.waiting("trainer registration"), dog.waiting("group 7"):
                with anyio.fail_after(30):  # the event itself, bounded (a loaded CI box)
                    while dog.warnings == 0:
                        await anyio.sleep(0.05)
            tg.cancel_scope.cancel("test done")
    text = caplog.text
    assert "watchdog: nothing finished for" in text
    assert "trainer registration (for" in text and "group 7 (for" in text
    assert "model_requests 4/4 held, 3 waiting" in text
    assert dog.report().startswith("nothing registered")  # the waits were unregistered


@pytest.mark.anyio
async def test_progress_keeps_the_watchdog_quiet() -> None:
    dog = Watchdog(1.0)
    async with anyio.create_task_group() as tg:
        await tg.start(dog.run)
        for _ in range(12):  # 1.2 s of steady progress, never 1 s without
            dog.progress()
            await anyio.sleep(0.1)
        tg.cancel_scope.cancel("test done")
    assert dog.warnings == 0


def test_watchdog_interval_is_checked() -> None:
    with pytest.raises(ValueError, match="watchdog interval must be > 0 seconds, got 0"):
        Watchdog(0)


def test_eval_metrics_count_failures_per_category() -> None:
    def sample(reward: float, category: str | None) -> dict[str, object]:
        failure = RolloutFailure.of(category, "x").to_json() if category else None  # type: ignore[arg-type]
        return {"reward": reward, "turns": 2, "tool_errors": [], "failure": failure}

    samples = [
        sample(1.0, None),
        sample(0.0, "model"),
        sample(0.0, "verifier"),
        sample(0.0, "infra"),
        failed_sample("task", "format_prompt raised KeyError", "k5"),
    ]
    metrics = eval_metrics(samples, 3.0)
    assert {c: metrics[f"eval/failures/{c}"] for c in FAILURE_CATEGORIES} == {
        "cancelled": 0.0,
        "infra": 2.0,
        "verifier": 1.0,
        "agent_timeout": 0.0,
        "model": 1.0,
        "tool": 0.0,
    }
    # infra and verifier say nothing about the model: errored, left out of the means.
    assert metrics["eval/num_errored"] == 3.0 and metrics["eval/mean_reward"] == 0.5
