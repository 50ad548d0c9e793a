"""The mechanics of ``HermesAgentBaseEnv.run_agent_eval``: bounded runs, buffers, metrics.

:func:`run_items` runs one rollout per item, bounded, recording an item that raises.
:func:`roll_back_buffers` keeps eval rewards out of the ``train_buffers`` an environment names.
:func:`eval_report` derives the ``eval/*`` metrics from the samples; errored items are counted
but not scored. Why: docs/decisions/063-evaluation-mechanics.md.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from hermes_async._paced import start_paced
from hermes_async._redact import redact, redact_messages
from hermes_async.agent import FAILURE_CATEGORIES, RolloutFailure, ScoredRollout
from hermes_async.envs._resume import ITEM_KEY, errored
from hermes_async.envs.display import format_trajectory_for_display
from hermes_async.envs.results import EvalReport, RolloutSummary
from hermes_async.errors import ConfigError
from hermes_async.jsontypes import JSONObject

__all__ = (
    "eval_metrics",
    "eval_report",
    "failed_sample",
    "final_response",
    "roll_back_buffers",
    "rollout_sample",
    "run_items",
    "select_eval_items",
    "summary_from_sample",
    "token_counts",
    "train_buffer_lengths",
)

logger = logging.getLogger("hermes_async.envs.base")

T = TypeVar("T")


def train_buffer_lengths(env: object, names: Sequence[str]) -> dict[str, int]:
    """The length of each list attribute of ``env`` named in ``names``; else ``ConfigError``."""
    lengths: dict[str, int] = {}
    for name in names:
        value = getattr(env, name, None)
        if not isinstance(value, list):
            found = "no such attribute" if value is None else f"a {type(value).__name__}"
            raise ConfigError(
                f"{type(env).__name__}.train_buffers names {name!r}, but it is {found}, not a "
                "list: create the list in setup() or remove the name from train_buffers"
            )
        lengths[name] = len(value)
    return lengths


def select_eval_items(items: Sequence[T], size: int | None, repeats: int) -> list[T]:
    """The first ``size`` of ``items`` (all for ``None`` or 0), each ``repeats`` times in a row."""
    chosen = list(items[:size] if size else items)
    return [item for item in chosen for _ in range(repeats)]


def roll_back_buffers(env: object, lengths: Mapping[str, int]) -> None:
    """Cut each named list back to its recorded length (what an evaluation appended)."""
    for name, length in lengths.items():
        del getattr(env, name)[length:]


async def run_items(
    items: Sequence[Any],
    one: Callable[[Any], Awaitable[T]],
    *,
    concurrency: int,
) -> tuple[list[T | None], dict[int, str]]:
    """Run ``one(item)`` for every item, at most ``concurrency`` at once.

    Returns ``(results, failures)``: ``None`` where an item raised, its redacted error by index.

    **Cancellation**: every running item is cancelled; nothing is returned.
    """
    limiter = anyio.CapacityLimiter(max(1, concurrency))
    results: list[T | None] = [None] * len(items)
    failures: dict[int, str] = {}

    async def run(index: int) -> None:
        async with limiter:
            try:
                results[index] = await one(items[index])
            except Exception as exc:  # one broken item must not end the evaluation
                failures[index] = redact(f"{type(exc).__name__}: {exc}")
                logger.warning("eval item %d failed: %s", index, failures[index])

    async with anyio.create_task_group() as tg:
        await start_paced(tg, run, range(len(items)))
    return results, failures


def final_response(messages: Sequence[Mapping[str, Any]]) -> str:
    """The content of the last assistant message that has any."""
    for message in reversed(messages):
        if message.get("role") == "assistant" and message.get("content"):
            return str(message["content"])
    return ""


def token_counts(managed_state: Mapping[str, Any] | None) -> JSONObject | None:
    """``{"prompt", "completion", "per_turn"}`` token counts of a Phase 2 trajectory, from its
    segments (``None`` without them: Phase 1 has no real tokens)."""
    segments = (managed_state or {}).get("segments") or ()
    if not segments:
        return None
    totals: dict[str, int] = {}
    per_turn: dict[int, int] = {}
    for seg in segments:
        if not isinstance(seg, Mapping):
            continue
        size = int(seg.get("end", 0)) - int(seg.get("start", 0))
        kind = str(seg.get("kind"))
        totals[kind] = totals.get(kind, 0) + size
        if kind == "completion":
            turn = int(seg.get("turn") or 0)
            per_turn[turn] = per_turn.get(turn, 0) + size
    return {
        "prompt": totals.get("prompt", 0),
        "completion": totals.get("completion", 0),
        "per_turn": [per_turn[t] for t in sorted(per_turn)],
    }


def rollout_sample(
    label: str, prompt: str, scored: ScoredRollout, key: str, *, mode: str = "eval"
) -> JSONObject:
    """One rollout's line of ``samples.jsonl``: its ``item_key``, scores, failure, timing and
    the whole conversation (``messages``, redacted), which ``hermes-async view`` shows."""
    result = scored.result
    sample: JSONObject = {
        ITEM_KEY: key,
        "mode": mode,
        "task": label,
        "task_id": scored.task_id,
        "prompt": redact(prompt),
        "response": redact(final_response(result.messages)),
        "reward": scored.reward,
        "turns": result.turns_used,
        "tokens": len(scored.tokens),
        "seconds": round(scored.seconds, 3),
        "finished_naturally": result.finished_naturally,
        "tool_errors": [
            redact(f"[turn {e.turn}] {e.tool_name}: {e.error}") for e in result.tool_errors
        ],
        "error": scored.error,
        "failure": scored.failure.to_json() if scored.failure is not None else None,
        "attempt": scored.attempt,
        "trajectory": format_trajectory_for_display(result.messages),
        "messages": redact_messages(result.messages),
        "timings": [dict(t) for t in result.timings],
    }
    counts = token_counts(result.managed_state)
    if counts is not None:
        sample["token_counts"] = counts
    return sample


def failed_sample(label: str, error: str, key: str) -> JSONObject:
    """The sample of an item whose rollout could not even start (``format_prompt`` raised)."""
    failure = RolloutFailure.of("infra", error, source="harness")
    return {
        ITEM_KEY: key,
        "mode": "eval",
        "task": label,
        "reward": 0.0,
        "turns": 0,
        "tool_errors": [],
        "error": failure.message,
        "failure": failure.to_json(),
    }


def _category(sample: Mapping[str, Any]) -> str | None:
    failure = sample.get("failure")
    return failure.get("category") if isinstance(failure, Mapping) else None


def eval_metrics(
    samples: Sequence[Mapping[str, Any]], seconds: float, *, prefix: str = "eval"
) -> dict[str, float]:
    """The ``eval/*`` metrics of ``samples``; ``prefix`` replaces ``eval``.

    The names: docs/decisions/063-evaluation-mechanics.md.
    """
    scored = [s for s in samples if not errored(s)]
    rewards = [float(s.get("reward") or 0.0) for s in scored]
    count = max(len(scored), 1)
    metrics = {
        "mean_reward": sum(rewards) / count,
        "accuracy": sum(1 for r in rewards if r >= 1.0) / count,
        "num_samples": float(len(samples)),
        "num_errored": float(len(samples) - len(scored)),
        "mean_turns": sum(int(s.get("turns") or 0) for s in scored) / count,
        "tool_errors": float(sum(len(s.get("tool_errors") or ()) for s in samples)),
        "evaluation_time_seconds": seconds,
    }
    categories = [_category(s) for s in samples]
    for category in FAILURE_CATEGORIES:
        metrics[f"failures/{category}"] = float(categories.count(category))
    return {f"{prefix}/{name}": value for name, value in metrics.items()}


def summary_from_sample(sample: Mapping[str, Any]) -> RolloutSummary:
    """The :class:`RolloutSummary` of a line of ``samples.jsonl`` (resume, run summaries)."""
    return RolloutSummary(
        label=str(sample.get("task", "")),
        task_id=str(sample.get("task_id", "")),
        reward=float(sample.get("reward") or 0.0),
        turns=int(sample.get("turns") or 0),
        tokens=int(sample.get("tokens") or 0),
        seconds=float(sample.get("seconds") or 0.0),
        finished_naturally=bool(sample.get("finished_naturally")),
        tool_errors=len(sample.get("tool_errors") or ()),
        error=sample.get("error"),
        evaluating=sample.get("mode", "eval") == "eval",
        category=_category(sample),  # type: ignore[arg-type]
    )


def eval_report(
    samples: Sequence[JSONObject],
    summaries: Sequence[RolloutSummary],
    start: float,
    end: float,
) -> EvalReport:
    """The report of one evaluation: one sample and one summary per item, in item order."""
    return EvalReport(
        eval_metrics(samples, end - start), list(samples), list(summaries), start, end
    )
