"""What a Terminal-Bench pass reports: metrics (pass rate, pass@k), the table, ATIF trajectories.

Pure. A trial passes when its status is ``ok`` and its reward 1.0; the mean reward counts a
missing reward as 0. pass@k is the unbiased estimator, averaged over tasks.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from hermes_async._redact import redact
from hermes_async.envs.terminalbench.trial import TrialResult

__all__ = (
    "ATIF_SCHEMA_VERSION",
    "atif_trajectory",
    "format_pass_table",
    "mean_reward",
    "pass_at_k",
    "pass_metrics",
)

#: The ATIF version the trajectories are written in.
ATIF_SCHEMA_VERSION = "ATIF-v1.4"

_SOURCES = {"system": "system", "user": "user", "assistant": "agent"}


def _passed(trial: TrialResult) -> bool:
    return trial.status == "ok" and trial.reward == 1.0


def mean_reward(trials: Sequence[TrialResult]) -> float:
    """The mean reward over ``trials``, a trial without a reward counting 0 (0.0 for none)."""
    if not trials:
        return 0.0
    return sum(t.reward or 0.0 for t in trials) / len(trials)


def pass_at_k(trials: Sequence[TrialResult], k: int) -> float | None:
    """pass@k over the tasks with at least ``k`` attempts (None: no such task)."""
    by_task: dict[str, list[TrialResult]] = defaultdict(list)
    for trial in trials:
        by_task[trial.task].append(trial)
    scores = []
    for attempts in by_task.values():
        n, c = len(attempts), sum(map(_passed, attempts))
        if n < k:
            continue
        scores.append(1.0 - (math.comb(n - c, k) / math.comb(n, k)))
    return sum(scores) / len(scores) if scores else None


def pass_metrics(trials: Sequence[TrialResult]) -> dict[str, float]:
    """``eval/pass_rate`` overall and per category, pass@k, mean reward, counts per status."""
    metrics: dict[str, float] = {"eval/num_trials": float(len(trials))}
    if not trials:
        return metrics
    metrics["eval/num_tasks"] = float(len({t.task for t in trials}))
    metrics["eval/pass_rate"] = sum(map(_passed, trials)) / len(trials)
    metrics["eval/mean_reward"] = mean_reward(trials)
    metrics["eval/without_reward"] = float(sum(t.reward is None for t in trials))
    most = max(sum(1 for t in trials if t.task == task) for task in {t.task for t in trials})
    for k in range(1, most + 1):
        value = pass_at_k(trials, k)
        if value is not None:
            metrics[f"eval/pass@{k}"] = value
    for category in sorted({t.category for t in trials}):
        mine = [t for t in trials if t.category == category]
        metrics[f"eval/pass_rate/{category}"] = sum(map(_passed, mine)) / len(mine)
    for status in sorted({t.status for t in trials}):
        metrics[f"eval/status/{status}"] = float(sum(t.status == status for t in trials))
    return metrics


def format_pass_table(
    results: Sequence[TrialResult], *, notes: Sequence[str | None] | None = None
) -> str:
    """A plain-text table, a line per trial, then a pass line per agent kind.

    ``notes`` (one per result) replaces the note column.
    """
    header = ("task", "agent", "try", "status", "reward", "agent s", "verifier s", "note")
    rows = [
        (
            r.task,
            r.agent,
            str(r.attempt),
            r.status,
            "-" if r.reward is None else f"{r.reward:g}",
            f"{r.agent_seconds:.1f}",
            f"{r.verifier_seconds:.1f}",
            ((notes[i] if notes is not None else r.error or "; ".join(r.notes)) or "")[:70],
        )
        for i, r in enumerate(results)
    ]
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    for kind in dict.fromkeys(r.agent for r in results):
        mine = [r for r in results if r.agent == kind]
        passed = sum(map(_passed, mine))
        without = sum(r.reward is None for r in mine)
        line = (
            f"{kind}: {passed}/{len(mine)} passed (reward 1.0, status ok), "
            f"mean reward {mean_reward(mine):.3f} (no reward counts 0), {without} without a reward"
        )
        if len({r.task for r in mine}) < len(mine):
            ks = [
                f"pass@{k} {v:.3f}" for k in (1, 2, 3, 5) if (v := pass_at_k(mine, k)) is not None
            ]
            line += ", " + ", ".join(ks)
        lines.append(line)
    return "\n".join(lines)


def atif_trajectory(
    messages: Sequence[Mapping[str, Any]],
    *,
    session_id: str,
    agent_name: str,
    model_name: str | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The conversation as an ATIF trajectory, redacted: one step per message.

    ``tool`` messages become the ``observation`` of the step whose call they answer.
    """
    steps: list[dict[str, Any]] = []
    by_call: dict[str, dict[str, Any]] = {}
    for message in messages:
        role = str(message.get("role"))
        content = message.get("content")
        text = redact(content if isinstance(content, str) else json.dumps(content or ""))
        if role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            step = by_call.get(call_id) or (steps[-1] if steps else None)
            if step is None:
                continue
            observation = step.setdefault("observation", {"results": []})
            observation["results"].append({"source_call_id": call_id or None, "content": text})
            continue
        step = {"step_id": len(steps) + 1, "source": _SOURCES.get(role, "system"), "message": text}
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            step["reasoning_content"] = redact(reasoning)
        calls = []
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = {"raw": arguments}
            call_id = str(call.get("id") or f"call_{len(by_call)}")
            calls.append(
                {
                    "tool_call_id": call_id,
                    "function_name": str(function.get("name") or ""),
                    "arguments": json.loads(redact(json.dumps(arguments))),
                }
            )
            by_call[call_id] = step
        if calls:
            step["tool_calls"] = calls
        steps.append(step)
    trajectory: dict[str, Any] = {
        "schema_version": ATIF_SCHEMA_VERSION,
        "session_id": session_id,
        "agent": {"name": agent_name, "version": "hermes_async", "model_name": model_name},
        "steps": steps,
        "final_metrics": {"total_steps": len(steps)},
    }
    if extra:
        trajectory["extra"] = dict(extra)
    return trajectory
