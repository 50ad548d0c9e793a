"""Terminal-Bench 2 and Harbor tasks: the task model, the loader and the verifier contract.

* :mod:`.task` — :class:`HarborTask`, parsed from ``task.toml`` schema 1.0 to 1.4;
* :mod:`.rows` — the Hermes dataset rows (JSONL / Parquet), materialised as task folders;
* :mod:`.dataset` — :func:`load_dataset` (folders or rows; invalid tasks reported, never
  fatal) and :func:`select` (``task_filter`` / ``skip_tasks``);
* :mod:`.contract` — the runtime contract as pure decisions (commands, reward files,
  statuses); :mod:`.trial` — one trial over any :class:`TrialSandbox`.

* :mod:`.sandbox` — a task's :class:`~hermes_async.tools.sandbox.spec.SandboxSpec` and
  trials over any project sandbox; :mod:`.report` — results rows, metrics, Harbor's trial
  directories (ATIF trajectories);
* :mod:`.env` — :class:`TerminalBench2EvalEnv` (``python -m hermes_async.envs.terminalbench
  serve|process|evaluate``), loaded lazily: it needs atroposlib, the rest does not.

Apart from :mod:`.env`, nothing here needs Docker or atroposlib; ``tasks/`` holds the bundled task set and
``fixtures/`` the harness's negative fixtures (see ``tasks/README.md``).
"""

from __future__ import annotations

from pathlib import Path

from hermes_async._lazy import lazy_getattr
from hermes_async.envs.terminalbench.contract import (
    ExecSpec,
    RewardReading,
    TrialStatus,
    read_reward,
)
from hermes_async.envs.terminalbench.dataset import LoadReport, Selection, load_dataset, select
from hermes_async.envs.terminalbench.rows import HermesRow, materialise_row, read_rows
from hermes_async.envs.terminalbench.task import (
    BASE_IMAGE,
    HarborTask,
    NetworkPolicy,
    TaskEnvironment,
    TaskError,
    load_task,
)
from hermes_async.envs.terminalbench.trial import (
    ExecResult,
    TrialResult,
    TrialSandbox,
    format_pass_table,
    run_trial,
    verify,
)

__all__ = (
    "BASE_IMAGE",
    "BUNDLED_FIXTURES",
    "BUNDLED_ROWS",
    "BUNDLED_TASKS",
    "ExecResult",
    "ExecSpec",
    "HarborTask",
    "HermesRow",
    "LoadReport",
    "NetworkPolicy",
    "RewardReading",
    "Selection",
    "TaskEnvironment",
    "TaskError",
    "TerminalBench2EvalEnv",
    "TerminalBench2EvalEnvConfig",
    "TrialResult",
    "TrialSandbox",
    "TrialStatus",
    "format_pass_table",
    "load_dataset",
    "load_task",
    "materialise_row",
    "read_reward",
    "read_rows",
    "run_trial",
    "select",
    "verify",
)

#: The bundled task set (every oracle scores 1.0, every null run 0.0).
BUNDLED_TASKS = Path(__file__).parent / "tasks"
#: Negative fixtures for the harness: each one's expected outcome is in its task.toml's
#: ``[metadata].expect_status`` / ``expect_reward``.
BUNDLED_FIXTURES = Path(__file__).parent / "fixtures"
#: Two bundled tasks as Hermes dataset rows (with this project's ``solution_tar``), made by
#: ``scripts/terminalbench/make_rows.py``.
BUNDLED_ROWS = BUNDLED_FIXTURES / "hermes_rows.jsonl"

_LAZY = {
    "TerminalBench2EvalEnv": "hermes_async.envs.terminalbench.env",
    "TerminalBench2EvalEnvConfig": "hermes_async.envs.terminalbench.env",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
