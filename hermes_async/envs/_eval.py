"""The mechanics of ``HermesAgentBaseEnv.run_agent_eval``: bounded runs, buffers, metrics.

* :func:`run_items` — one rollout per item, at most ``concurrency`` at once, in one task group;
  an item that raises is recorded (redacted) and the evaluation goes on.
* **Train buffers** — environments accumulate training metrics in list attributes and log them
  in ``wandb_log``. An evaluation's rewards must not land there. The environment names those
  lists explicitly in its ``train_buffers`` class attribute (e.g.
  ``("reward_buffer", "partial_buffer")``); :func:`train_buffer_lengths` records their lengths
  before the evaluation and :func:`roll_back_buffers` cuts back what grew during it. (The former
  rule — every list attribute whose name ends in ``_buffer`` — also truncated lists that were no
  metrics, and missed metric lists named otherwise.) A name that is not a list attribute is a
  :class:`~hermes_async.errors.ConfigError`: a typo must not silently leave eval rewards in the
  training metrics.
* :func:`eval_report` (with :func:`eval_metrics` / :func:`eval_sample`) — the ``eval/*``
  metrics and one sample per item, as pure functions.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from hermes_async._redact import redact
from hermes_async.agent import ScoredRollout
from hermes_async.envs.display import format_trajectory_for_display
from hermes_async.envs.results import EvalReport, RolloutSummary
from hermes_async.errors import ConfigError
from hermes_async.jsontypes import JSONObject

__all__ = (
    "eval_metrics",
    "eval_report",
    "eval_sample",
    "final_response",
    "roll_back_buffers",
    "run_items",
    "train_buffer_lengths",
)

logger = logging.getLogger("hermes_async.envs.base")

T = TypeVar("T")


def train_buffer_lengths(env: object, names: Sequence[str]) -> dict[str, int]:
    """The current length of each list attribute of ``env`` named in ``names``.

    Raises:
        ConfigError: A name is not an attribute of ``env`` holding a list.
    """
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

    Returns:
        ``(results, failures)``: one result per item (``None`` where it raised), and the
        redacted error of each item that raised, by index.

    **Cancellation**: every running item is cancelled; nothing is returned.
    """
    limiter = anyio.CapacityLimiter(max(1, concurrency))
    results: list[T | None] = [None] * len(items)
    failures: dict[int, str] = {}

    async def run(index: int, item: Any) -> None:
        async with limiter:
            try:
                results[index] = await one(item)
            except Exception as exc:  # one broken item must not end the evaluation
                failures[index] = redact(f"{type(exc).__name__}: {exc}")
                logger.warning("eval item %d failed: %s", index, failures[index])

    async with anyio.create_task_group() as tg:
        for index, item in enumerate(items):
            tg.start_soon(run, index, item)
    return results, failures


def final_response(messages: Sequence[Mapping[str, Any]]) -> str:
    """The content of the last assistant message that has any."""
    for message in reversed(messages):
        if message.get("role") == "assistant" and message.get("content"):
            return str(message["content"])
    return ""


def eval_sample(label: str, prompt: str, scored: ScoredRollout) -> JSONObject:
    """One item's sample for ``samples.jsonl`` (redacted where it is free text)."""
    result = scored.result
    return {
        "task": label,
        "prompt": prompt,
        "response": redact(final_response(result.messages)),
        "reward": scored.reward,
        "turns": result.turns_used,
        "tokens": len(scored.tokens),
        "finished_naturally": result.finished_naturally,
        "tool_errors": [
            redact(f"[turn {e.turn}] {e.tool_name}: {e.error}") for e in result.tool_errors
        ],
        "error": scored.error,
        "trajectory": format_trajectory_for_display(result.messages),
    }


def eval_metrics(
    rewards: Sequence[float],
    turns: Sequence[int],
    tool_errors: Sequence[int],
    seconds: float,
) -> dict[str, float]:
    """The ``eval/*`` metrics: mean reward, accuracy (share >= 1), counts, duration."""
    count = max(len(rewards), 1)
    return {
        "eval/mean_reward": sum(rewards) / count,
        "eval/accuracy": sum(1 for r in rewards if r >= 1.0) / count,
        "eval/num_samples": float(len(rewards)),
        "eval/mean_turns": sum(turns) / count,
        "eval/tool_errors": float(sum(tool_errors)),
        "eval/evaluation_time_seconds": seconds,
    }


def eval_report(
    labels: Sequence[str],
    rollouts: Sequence[tuple[RolloutSummary, str, ScoredRollout] | None],
    failures: Mapping[int, str],
    start: float,
    end: float,
) -> EvalReport:
    """The report of one evaluation: per item its ``(summary, prompt, scored)`` or ``None``.

    An item whose rollout raised counts as reward 0.0 with its error (from ``failures``).
    """
    samples: list[JSONObject] = []
    summaries: list[RolloutSummary] = []
    for index, (label, rollout) in enumerate(zip(labels, rollouts, strict=True)):
        if rollout is None:
            error = failures.get(index)
            summaries.append(RolloutSummary(label, "", 0.0, 0, 0, 0.0, False, 0, error, True))
            samples.append({"task": label, "reward": 0.0, "error": error})
            continue
        summary, prompt, scored = rollout
        summaries.append(summary)
        samples.append(eval_sample(summary.label, prompt, scored))
    metrics = eval_metrics(
        [s.reward for s in summaries],
        [s.turns for s in summaries],
        [s.tool_errors for s in summaries],
        end - start,
    )
    return EvalReport(metrics, samples, summaries, start, end)
