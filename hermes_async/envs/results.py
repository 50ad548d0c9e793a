"""What an environment reports about its rollouts: :class:`RolloutSummary`, :class:`EvalReport`.

:func:`summarize` turns the rollout core's :class:`~hermes_async.agent.ScoredRollout` into the
summary that progress displays, the demo's table and ``run_agent_eval`` show.
"""

from __future__ import annotations

from dataclasses import dataclass

from hermes_async.agent import ScoredRollout
from hermes_async.jsontypes import JSONObject

__all__ = ("EvalReport", "RolloutSummary", "summarize")


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


@dataclass(frozen=True, slots=True)
class EvalReport:
    """What :meth:`HermesAgentBaseEnv.run_agent_eval` measured.

    Attributes:
        metrics: ``eval/*`` metrics (also passed to ``evaluate_log``).
        samples: One dict per item (prompt, response, reward, turns, tokens, tool errors).
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
    )
