"""A Terminal-Bench run on disk, in Harbor's job layout, written as trials finish::

    <job>/config.json            the job's configuration (written once)
    <job>/results.jsonl          one row per finished trial, appended and flushed
    <job>/result.json            the job's summary; metrics.json: pass rates, pass@k
    <job>/<task>__<agent>-<n>/   one trial: config.json, result.json,
                                 agent/trajectory.json (ATIF), verifier/

Invariant: a trial's folder is written first and its row last, so the row is the commit;
``resume`` keeps every finished row byte for byte. :class:`JobWriter` is the one seam.
"""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast, get_args

from hermes_async._json import finite_number
from hermes_async._redact import redact
from hermes_async.envs._resume import ITEM_KEY, ResultsFile
from hermes_async.envs.terminalbench.contract import AgentKind, TrialStatus
from hermes_async.envs.terminalbench.report import pass_metrics
from hermes_async.envs.terminalbench.trial import TrialResult

__all__ = ("JobWriter", "result_row", "trial_from_row", "trial_key", "trial_name")

#: Harbor's agent names for ours (its viewer groups trials by them).
_AGENT_NAMES = {"oracle": "oracle", "null": "nop", "model": "hermes-async"}


def trial_key(task: str, agent: AgentKind, attempt: int) -> str:
    """The results row key of one trial: ``<task>#<agent>#<attempt>``."""
    return f"{task}#{agent}#{attempt}"


def trial_name(task: str, agent: AgentKind, attempt: int) -> str:
    """The trial's folder name: ``<task>__<agent>-<attempt>`` (Harbor: ``<task>__<id>``)."""
    return f"{task}__{agent}-{attempt}"


def _iso(moment: float | None) -> str | None:
    return datetime.fromtimestamp(moment, UTC).isoformat() if moment is not None else None


def result_row(
    trial: TrialResult, *, trial_dir: str | None, started: float, finished: float
) -> dict[str, Any]:
    """The ``results.jsonl`` row of one trial."""
    return {
        ITEM_KEY: trial_key(trial.task, trial.agent, trial.attempt),
        "task": trial.task,
        "category": trial.category,
        "agent": trial.agent,
        "attempt": trial.attempt,
        "reward": trial.reward,
        "status": trial.status,
        "agent_seconds": round(trial.agent_seconds, 3),
        "verifier_seconds": round(trial.verifier_seconds, 3),
        "error": redact(trial.error) if trial.error else None,
        "notes": [redact(note) for note in trial.notes],
        "metrics": dict(trial.metrics),
        "started_at": _iso(started),
        "finished_at": _iso(finished),
        "trial": trial_dir,
    }


def trial_from_row(row: Mapping[str, Any]) -> TrialResult:
    """A :class:`TrialResult` rebuilt from its row (for a resumed pass's table and metrics).

    A row damaged by hand or by another tool never raises: a field of the wrong type reads as
    its default; the task, agent and attempt come from the row's key if need be.
    """
    key = row.get(ITEM_KEY)
    parts = key.rsplit("#", 2) if isinstance(key, str) and key.count("#") >= 2 else ["?", "", ""]
    task, agent, attempt = row.get("task"), row.get("agent"), row.get("attempt")
    if not isinstance(agent, str) or agent not in _AGENT_NAMES:
        agent = parts[1] if parts[1] in _AGENT_NAMES else "model"
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        number = parts[2]  # ASCII and short: int() refuses "²" and 4,301 digits
        attempt = int(number) if number.isascii() and number.isdigit() and len(number) < 10 else 0
    status, error, notes = row.get("status"), row.get("error"), row.get("notes")
    metrics = row.get("metrics")
    numbers = (
        {str(k): finite_number(v) for k, v in metrics.items()} if isinstance(metrics, dict) else {}
    )
    category = row.get("category")
    return TrialResult(
        task=task if isinstance(task, str) else parts[0],
        category=category if isinstance(category, str) and category else "uncategorized",
        agent=cast(AgentKind, agent),
        status=cast(TrialStatus, status if status in get_args(TrialStatus) else "infra"),
        reward=finite_number(row.get("reward")),
        error=error if isinstance(error, str) else None,
        metrics={k: v for k, v in numbers.items() if v is not None},
        agent_seconds=finite_number(row.get("agent_seconds")) or 0.0,
        verifier_seconds=finite_number(row.get("verifier_seconds")) or 0.0,
        attempt=attempt,
        notes=tuple(n for n in notes if isinstance(n, str)) if isinstance(notes, list) else (),
    )


class JobWriter:
    """Writes one job folder; synchronous, small files (KBs per trial).

    Args:
        config: The job's configuration (kept as it was on resume).
        resume: Keep the finished rows and skip their trials; else start empty.
    """

    def __init__(self, root: Path, *, config: Mapping[str, Any], resume: bool) -> None:
        self.root = root
        self.job_id = str(uuid.uuid4())
        self.started = datetime.now(UTC)
        root.mkdir(parents=True, exist_ok=True)
        config_file = root / "config.json"
        if not (resume and config_file.exists()):
            config_file.write_text(json.dumps({"job_id": self.job_id, **config}, indent=2))
        self.results = ResultsFile(root / "results.jsonl", resume=resume).open()
        self.rows: list[Mapping[str, Any]] = list(self.results.done.values())

    @property
    def finished(self) -> set[str]:
        """Keys of the trials with a row (:func:`trial_key`)."""
        return set(self.results.done)

    def write_trial(
        self,
        trial: TrialResult,
        *,
        started: float,
        finished: float,
        trajectory: Mapping[str, Any] | None = None,
        verifier_tar: bytes | None = None,
        task_path: Path | None = None,
    ) -> dict[str, Any]:
        """Write the trial's folder, then append (and flush) its row; return the row."""
        name = trial_name(trial.task, trial.agent, trial.attempt)
        path = self.root / name
        (path / "agent").mkdir(parents=True, exist_ok=True)
        (path / "verifier").mkdir(parents=True, exist_ok=True)
        config = {
            "task": {"path": str(task_path) if task_path else trial.task},
            "trial_name": name,
            "trials_dir": str(self.root),
            "job_id": self.job_id,
            "agent": {"name": _AGENT_NAMES[trial.agent]},
        }
        (path / "config.json").write_text(json.dumps(config, indent=2))
        (path / "result.json").write_text(
            json.dumps(self._harbor_result(trial, config, started, finished), indent=2)
        )
        if trajectory is not None:
            (path / "agent" / "trajectory.json").write_text(json.dumps(trajectory, indent=2))
        if trial.agent_output:
            (path / "agent" / "oracle.txt").write_text(redact(trial.agent_output))
        if verifier_tar is not None:
            with tarfile.open(fileobj=io.BytesIO(verifier_tar)) as tar:
                tar.extractall(path / "verifier", filter="data")
        elif trial.verifier_stdout:
            (path / "verifier" / "test-stdout.txt").write_text(redact(trial.verifier_stdout))
        row = result_row(trial, trial_dir=name, started=started, finished=finished)
        self.results.append(row)
        self.rows.append(row)
        return row

    def _harbor_result(
        self, trial: TrialResult, config: Mapping[str, Any], started: float, finished: float
    ) -> dict[str, Any]:
        # Harbor's TrialResult fields (harbor.models.trial.result), so its viewer reads ours.
        agent_end = started + trial.agent_seconds
        error = None
        if trial.status != "ok":
            error = {
                "exception_type": trial.status,
                "exception_message": redact(trial.error or trial.status),
                "exception_traceback": "",
                "occurred_at": _iso(finished),
            }
        return {
            "id": str(uuid.uuid4()),
            "task_name": trial.task,
            "trial_name": config["trial_name"],
            "trial_uri": (self.root / str(config["trial_name"])).resolve().as_uri(),
            "task_id": {"path": config["task"]["path"]},
            "source": None,
            "task_checksum": "",
            "config": config,
            "agent_info": {"name": config["agent"]["name"], "version": "hermes_async"},
            "verifier_result": (
                {"rewards": {**trial.metrics, "reward": trial.reward}}
                if trial.reward is not None
                else None
            ),
            "exception_info": error,
            "started_at": _iso(started),
            "finished_at": _iso(finished),
            "agent_execution": {"started_at": _iso(started), "finished_at": _iso(agent_end)},
            "verifier": {"started_at": _iso(agent_end), "finished_at": _iso(finished)},
            "hermes_async": {
                "status": trial.status,
                "category": trial.category,
                "attempt": trial.attempt,
                "notes": [redact(n) for n in trial.notes],
            },
        }

    def finish(self, trials: Sequence[TrialResult], *, n_total: int) -> dict[str, float]:
        """Write ``metrics.json`` and the job's ``result.json``; return the metrics."""
        metrics = pass_metrics(trials)
        (self.root / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
        errored = sum(1 for t in trials if t.status not in ("ok", "agent_timeout"))
        summary = {
            "id": self.job_id,
            "started_at": self.started.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "n_total_trials": n_total,
            "stats": {
                "n_completed_trials": len(trials),
                "n_errored_trials": errored,
                "n_pending_trials": max(0, n_total - len(trials)),
            },
            "metrics": metrics,
        }
        (self.root / "result.json").write_text(json.dumps(summary, indent=2))
        return metrics

    def close(self) -> None:
        """Close ``results.jsonl`` (idempotent)."""
        self.results.close()
