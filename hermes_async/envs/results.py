"""What an environment reports about its rollouts: :class:`RolloutSummary`, :class:`EvalReport`.

:func:`summarize` turns the rollout core's :class:`~hermes_async.agent.ScoredRollout` into the
summary that progress displays, the demo's table and ``run_agent_eval`` show.
"""

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
        task_id: The rollout's task id (its sandbox's key).
        reward: The score.
        turns: Model calls made.
        tokens: Tokens in the trajectory (Phase 2: exact; Phase 1: placeholder count).
        seconds: Wall time of the rollout, reward and sandbox release included.
        finished_naturally: The model ended without a tool call.
        tool_errors: Number of failed tool calls.
        error: Why the loop stopped early, or why the reward failed, if either happened.
        evaluating: Part of an evaluation, not training.
        category: The rollout's failure category (``infra``, ``verifier``, ``tool``, ...), or
            ``None``; see :mod:`hermes_async.agent.failures`.
        attempt: Which attempt this was (> 1 after a retry on a fresh sandbox).
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

    Attributes:
        metrics: ``eval/*`` metrics (also passed to ``evaluate_log``).
        samples: One dict per item (``item_key``, prompt, response, reward, turns, tokens, tool
            errors, ``failure``), as written to ``samples.jsonl``.
        rollouts: One :class:`RolloutSummary` per item, in item order.
        start_time: Unix time the evaluation started.
        end_time: Unix time it ended.
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

    Per rollout attempt its failure category (replaced attempts of a retry included), per group
    its outcome (``ok``, ``retried``, ``zeroed``, ``masked``), and rollouts cut off by a
    cancellation (``cancelled``: a serve-mode worker timeout, SIGTERM).
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
        """``train/failures/<category>`` (every category), ``train/groups_masked``,
        ``train/groups_retried``, ``train/groups_zeroed``, ``train/groups_stale`` and the
        ``train/staleness/...`` counters (age distribution); then the window starts over."""
        metrics = failure_metrics("train", self.failures)
        for outcome in ("masked", "retried", "zeroed", "stale"):
            metrics[f"train/groups_{outcome}"] = float(self.outcomes.get(outcome, 0))
        metrics.update({key: float(value) for key, value in self.staleness.items()})
        self.failures.clear()
        self.outcomes.clear()
        self.staleness.clear()
        return metrics
