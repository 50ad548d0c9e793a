"""What an environment reports about its rollouts: :class:`RolloutSummary`, :class:`EvalReport`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hermes_async.agent import FailureCategory, ScoredGroup, ScoredRollout
from hermes_async.envs._resume import ERRORED_CATEGORIES
from hermes_async.envs.display import failure_metrics, format_failures, format_table
from hermes_async.jsontypes import JSONObject

__all__ = ("EvalReport", "FailureTally", "RolloutSummary", "format_summary", "summarize")


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


def format_summary(summaries: Sequence[RolloutSummary], wall_seconds: float) -> str:
    """The end-of-run table: per mode and task (sorted), then all rows, and a one-line total.

    Columns: rollouts, mean reward and its (population) standard deviation, pass rate (share of
    reward >= 1), mean turns, mean tokens, mean seconds, failures by category. Errored rollouts
    (``infra``, ``verifier``, ``cancelled``) are counted under failures and left out of the
    reward, pass and turn columns, as ``eval/*`` metrics leave them out.
    """
    keys: dict[tuple[str, str], list[RolloutSummary]] = {}
    for summary in summaries:
        mode = "eval" if summary.evaluating else "process"
        keys.setdefault((mode, summary.label), []).append(summary)
    ordered = sorted(keys.items(), key=lambda kv: (kv[0][0] != "eval", kv[0][1]))
    rows = [_summary_row(mode, task, group) for (mode, task), group in ordered]
    if len(keys) > 1:
        rows.append(_summary_row("all", "", list(summaries)))
    headers = ["mode", "task", "rollouts", "reward", "std", "pass", "turns", "tokens", "time_s"]
    table = format_table([*headers, "failures"], rows)
    scored = [s.reward for s in summaries if s.category not in ERRORED_CATEGORIES]
    errored = len(summaries) - len(scored)
    mean = sum(scored) / len(scored) if scored else 0.0
    passed = sum(1 for r in scored if r >= 1.0) / len(scored) if scored else 0.0
    total = (
        f"{len(summaries)} rollout{'' if len(summaries) == 1 else 's'}"
        f"{f' ({errored} errored)' if errored else ''}, "
        f"mean reward {mean:.2f}, pass rate {passed:.0%}, {wall_seconds:.1f} s"
    )
    return table + "\n" + total


def _summary_row(mode: str, task: str, group: Sequence[RolloutSummary]) -> list[object]:
    scored = [s for s in group if s.category not in ERRORED_CATEGORIES]
    rewards = [s.reward for s in scored]
    count = max(len(rewards), 1)
    mean = sum(rewards) / count
    std = (sum((r - mean) ** 2 for r in rewards) / count) ** 0.5
    n = max(len(group), 1)
    return [
        mode,
        task,
        len(group),
        mean,
        std,
        sum(1 for r in rewards if r >= 1.0) / count,
        sum(s.turns for s in scored) / count,
        round(sum(s.tokens for s in group) / n),
        sum(s.seconds for s in group) / n,
        format_failures(s.category for s in group),
    ]
