"""What a harness check expects of a trial (pure): the oracle pass table's rules.

A real task: ``oracle`` scores 1.0 and ``null`` its ``[metadata].null_floor`` (0.0), both
``ok``. A negative fixture (tag ``"negative"``) states its oracle outcome in
``[metadata]`` (``expect_status``, ``expect_reward``, ``expect_error``); fixtures never run
with ``null`` nor count in a pass rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from hermes_async._json import finite_number
from hermes_async.envs.terminalbench.contract import AgentKind, TrialStatus
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.envs.terminalbench.trial import TrialResult

__all__ = (
    "Expectation",
    "expectation_for",
    "is_negative_fixture",
    "mismatch",
)


_STATUSES: dict[str, TrialStatus] = {status: status for status in get_args(TrialStatus)}


@dataclass(frozen=True, slots=True)
class Expectation:
    """The outcome a trial must have; a None ``reward`` must be null, a None ``error_contains`` is unchecked."""

    status: TrialStatus
    reward: float | None
    error_contains: str | None = None


def is_negative_fixture(task: HarborTask) -> bool:
    """Whether the task is a harness fixture that is meant to fail (``tags`` has "negative")."""
    return "negative" in task.tags


def expectation_for(task: HarborTask, agent: AgentKind) -> Expectation | None:
    """The expected outcome of ``agent`` on ``task`` (None: this pair is not checked)."""
    meta = task.metadata
    if is_negative_fixture(task):
        if agent != "oracle":
            return None
        raw = meta.get("expect_status", "ok")
        status = _STATUSES.get(raw) if isinstance(raw, str) else None
        if status is None:
            raise ValueError(
                f"task {task.name!r}: [metadata].expect_status {raw!r} is not one of "
                f"{', '.join(_STATUSES)}"
            )
        reward = meta.get("expect_reward")
        error = meta.get("expect_error")
        return Expectation(
            status=status,
            reward=_reward(task, "expect_reward", reward)
            if isinstance(reward, int | float)
            else None,
            error_contains=error if isinstance(error, str) else None,
        )
    if agent == "oracle":
        return Expectation("ok", 1.0)
    if agent == "null":
        floor = meta.get("null_floor", 0.0)
        return Expectation(
            "ok", _reward(task, "null_floor", floor) if isinstance(floor, int | float) else 0.0
        )
    return None


def _reward(task: HarborTask, key: str, value: float) -> float:
    number = finite_number(value)
    if number is None:  # NaN, an infinity, a 400-digit integer
        shown = f"{value!r:.80}"
        raise ValueError(f"task {task.name!r}: [metadata].{key} {shown} is not a finite number")
    return number


def mismatch(result: TrialResult, expected: Expectation) -> str | None:
    """Why ``result`` does not meet ``expected`` (None: it does)."""
    problems = []
    if result.status != expected.status:
        problems.append(f"status {result.status!r}, expected {expected.status!r}")
    if expected.reward is None:
        if result.reward is not None:
            problems.append(f"reward {result.reward:g}, expected null")
    elif result.reward is None or abs(result.reward - expected.reward) > 1e-9:
        got = "null" if result.reward is None else f"{result.reward:g}"
        problems.append(f"reward {got}, expected {expected.reward:g}")
    if expected.error_contains is not None and expected.error_contains not in (result.error or ""):
        problems.append(f"error {result.error!r} lacks {expected.error_contains!r}")
    return "; ".join(problems) or None
