"""What a Terminal-Bench run leaves on disk: rows, metrics, and Harbor's trial directories.

Pure builders plus one writer, so the layout is tested without a container::

    <data_dir_to_save_evals>/
      results.jsonl             one row per task: task, category, reward (float|null), status,
                                agent_seconds, verifier_seconds, error, agent, trial
      metrics.json              (atroposlib's evaluate_log) eval/pass_rate overall and per
                                category, eval/mean_reward, counts per status
      trials/<task>__<n>/       Harbor's trial layout, readable by its viewer:
        config.json             the task and the agent that ran
        result.json             the trial's outcome (reward, status, timings)
        agent/trajectory.json   the conversation in ATIF (v1.4): one step per message
        verifier/               /logs/verifier copied from the container (reward file,
                                test-stdout.txt)

A task *passes* when its status is ``ok`` and its reward is 1.0 (partial credit counts in
the mean reward, not in the pass rate). A missing reward is ``null`` in the row and counts
as not passed; it is never written as 0.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hermes_async._redact import redact
from hermes_async.envs.terminalbench.trial import TrialResult

__all__ = (
    "ATIF_SCHEMA_VERSION",
    "atif_trajectory",
    "pass_metrics",
    "result_row",
    "trial_dir_name",
    "write_trial_dir",
)

#: The ATIF version the trajectories are written in.
ATIF_SCHEMA_VERSION = "ATIF-v1.4"

_SOURCES = {"system": "system", "user": "user", "assistant": "agent"}


def result_row(trial: TrialResult, *, trial_dir: str | None = None) -> dict[str, Any]:
    """The results.jsonl row of one trial."""
    return {
        "task": trial.task,
        "category": trial.category,
        "agent": trial.agent,
        "reward": trial.reward,
        "status": trial.status,
        "agent_seconds": round(trial.agent_seconds, 3),
        "verifier_seconds": round(trial.verifier_seconds, 3),
        "error": redact(trial.error) if trial.error else None,
        "metrics": dict(trial.metrics),
        "trial": trial_dir,
    }


def _passed(trial: TrialResult) -> bool:
    return trial.status == "ok" and trial.reward == 1.0


def pass_metrics(trials: Sequence[TrialResult]) -> dict[str, float]:
    """``eval/pass_rate`` overall and ``eval/pass_rate/<category>``, mean reward, counts."""
    metrics: dict[str, float] = {"eval/num_tasks": float(len(trials))}
    if not trials:
        return metrics
    metrics["eval/pass_rate"] = sum(map(_passed, trials)) / len(trials)
    rewards = [t.reward for t in trials if t.reward is not None]
    metrics["eval/mean_reward"] = sum(rewards) / len(trials) if rewards else 0.0
    metrics["eval/without_reward"] = float(len(trials) - len(rewards))
    for category in sorted({t.category for t in trials}):
        mine = [t for t in trials if t.category == category]
        metrics[f"eval/pass_rate/{category}"] = sum(map(_passed, mine)) / len(mine)
    for status in sorted({t.status for t in trials}):
        metrics[f"eval/status/{status}"] = float(sum(t.status == status for t in trials))
    return metrics


def trial_dir_name(task: str, index: int) -> str:
    """``<task>__<index>`` (Harbor names trials by task and attempt)."""
    return f"{task}__{index}"


def atif_trajectory(
    messages: Sequence[Mapping[str, Any]],
    *,
    session_id: str,
    agent_name: str,
    model_name: str | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The conversation as an ATIF trajectory: one step per message.

    An assistant message is an ``agent`` step with its ``tool_calls``; the ``tool`` messages
    that answer them become that step's ``observation`` (matched by ``tool_call_id``).
    Everything is redacted.
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


def _extract(tar_data: bytes, dest: Path) -> None:
    """Extract a tar into ``dest`` with the stdlib ``data`` filter (nothing lands outside)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar_data)) as tar:
        tar.extractall(dest, filter="data")


def write_trial_dir(
    root: Path,
    trial: TrialResult,
    *,
    index: int = 0,
    trajectory: Mapping[str, Any] | None = None,
    verifier_tar: bytes | None = None,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Write one trial's Harbor directory under ``root/trials``; return its path.

    Small files, written synchronously (a few KiB per trial; the verifier's output is
    bounded by the contract).
    """
    path = root / "trials" / trial_dir_name(trial.task, index)
    (path / "agent").mkdir(parents=True, exist_ok=True)
    (path / "verifier").mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps({"task_name": trial.task, "agent": trial.agent, **(config or {})}, indent=2)
    )
    result = {
        "task_name": trial.task,
        "trial_name": path.name,
        "category": trial.category,
        "agent": trial.agent,
        "status": trial.status,
        "verifier_result": {"reward": trial.reward, "rewards": dict(trial.metrics)}
        if trial.reward is not None
        else None,
        "exception_info": {"message": redact(trial.error)} if trial.error else None,
        "agent_seconds": trial.agent_seconds,
        "verifier_seconds": trial.verifier_seconds,
        "verifier_exit_code": trial.verifier_exit_code,
    }
    (path / "result.json").write_text(json.dumps(result, indent=2))
    if trajectory is not None:
        (path / "agent" / "trajectory.json").write_text(json.dumps(trajectory, indent=2))
    if verifier_tar is not None:
        _extract(verifier_tar, path / "verifier")
    elif trial.verifier_stdout:
        (path / "verifier" / "test-stdout.txt").write_text(trial.verifier_stdout)
    return path
