"""What an environment reports about its rollouts: :class:`RolloutSummary`, :class:`EvalReport`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hermes_async.agent import FailureCategory, ScoredGroup, ScoredRollout
from hermes_async.envs.display import failure_metrics
from hermes_async.jsontypes import JSONObject

__all__ = ("EvalReport", "FailureTally", "RolloutSummary", "summarize")


@dataclass(frozen=True, slots=True)
class RolloutSummary:
    """One finished rollout, for progress displays, tables and tests.

    Attributes:
        label: The item's label (:meth:`HermesAgentBaseEnv.item_label`).
        tokens: Tokens in the trajectory (Phase 2: exact; Phase 1: placeholder count).
        seconds: Wall time, reward and sandbox release included.
        error: Why the loop stopped early or the reward failed, if either happened.
        category: The failure category (``infra``, ``verifier``, ``tool``...), or ``None``.
        attempt: > 1 after a retry on a fresh sandbox.
    """

    label: str
    task_id: str
    reward: float
    turns: int
    tokens: int
    seconds: float
    finished_naturally: bool
    tool_errors: int
    error: str | None
    evaluating: bool
    category: FailureCategory | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class EvalReport:
    """What :meth:`HermesAgentBaseEnv.run_agent_eval` measured.

    ``metrics`` are the ``eval/*`` metrics; ``samples`` are the ``samples.jsonl`` rows.
    """

    metrics: dict[str, float]
    samples: list[JSONObject]
    rollouts: list[RolloutSummary]
    start_time: float
    end_time: float


def summarize(label: str, scored: ScoredRollout, *, evaluating: bool) -> RolloutSummary:
    """The summary of one scored rollout of the item labelled ``label``."""
    result = scored.result
    return RolloutSummary(
        label=label,
        task_id=scored.task_id,
        reward=scored.reward,
        turns=result.turns_used,
        tokens=len(scored.tokens),
        seconds=scored.seconds,
        finished_naturally=result.finished_naturally,
        tool_errors=len(result.tool_errors),
        error=scored.error,
        evaluating=evaluating,
        category=scored.category,
        attempt=scored.attempt,
    )


class FailureTally:
    """Training failures since the last ``wandb_log``, and the run's totals.

    Counts each attempt's failure category, each group's outcome, and rollouts cut off by a
    cancellation.
    """

    def __init__(self) -> None:
        self.failures: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        #: Since the run started (never reset).
        self.total_failures: Counter[str] = Counter()
        self.total_outcomes: Counter[str] = Counter()
        #: Staleness counters (``train/staleness/...``: ages, stale and masked tokens).
        self.staleness: Counter[str] = Counter()

    def add_group(self, group: ScoredGroup) -> None:
        """Count a finished group's failures and outcome."""
        counts = group.failure_counts()
        self.failures.update(counts)
        self.total_failures.update(counts)
        self.outcomes[group.outcome] += 1
        self.total_outcomes[group.outcome] += 1
        if group.staleness is not None:
            self.staleness.update(group.staleness.metrics("train/staleness/"))

    def add_cancelled(self, rollouts: int) -> None:
        """Count ``rollouts`` cut off by a cancellation."""
        if rollouts > 0:
            self.failures["cancelled"] += rollouts
            self.total_failures["cancelled"] += rollouts

    def metrics(self) -> dict[str, float]:
        """The ``train/failures/*``, ``train/groups_*`` and ``train/staleness/*`` counters; the window starts over."""
        metrics = failure_metrics("train", self.failures)
        for outcome in ("masked", "retried", "zeroed", "stale"):
            metrics[f"train/groups_{outcome}"] = float(self.outcomes.get(outcome, 0))
        metrics.update({key: float(value) for key, value in self.staleness.items()})
        self.failures.clear()
        self.outcomes.clear()
        self.staleness.clear()
        return metrics
