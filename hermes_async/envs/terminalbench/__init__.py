"""Terminal-Bench 2 and Harbor tasks: the loader, the verifier contract, passes, job folders.

Task folders and rows load (:mod:`.task`, :mod:`.rows`, :mod:`.dataset`), trials follow
:mod:`.contract` on a project sandbox (:mod:`.trial`), and passes (:mod:`.runner`) write
Harbor job folders (:mod:`.job`). ``tasks/`` holds the bundled tasks, ``fixtures/`` the
harness's negative fixtures.
"""

from __future__ import annotations

from pathlib import Path

from hermes_async._lazy import lazy_getattr
from hermes_async.envs.terminalbench.contract import RewardReading, Step, TrialStatus, read_reward
from hermes_async.envs.terminalbench.dataset import (
    LoadReport,
    Selection,
    load_dataset,
    resolve_dataset,
    select,
)
from hermes_async.envs.terminalbench.files import FolderLimits, TaskError
from hermes_async.envs.terminalbench.images import parse_image_map, task_sandbox_spec
from hermes_async.envs.terminalbench.job import JobWriter
from hermes_async.envs.terminalbench.report import format_pass_table, pass_metrics
from hermes_async.envs.terminalbench.rows import HermesRow, materialise_row, read_rows
from hermes_async.envs.terminalbench.runner import PassOptions, TaskRun, run_pass, scripted_trial
from hermes_async.envs.terminalbench.task import (
    BASE_IMAGE,
    HarborTask,
    NetworkPolicy,
    TaskEnvironment,
    TaskLimits,
    load_task,
)
from hermes_async.envs.terminalbench.trial import TrialResult, run_trial, verify

__all__ = (
    "BASE_IMAGE",
    "BUNDLED_FIXTURES",
    "BUNDLED_ROWS",
    "BUNDLED_TASKS",
    "FolderLimits",
    "HarborTask",
    "HermesRow",
    "JobWriter",
    "LoadReport",
    "NetworkPolicy",
    "PassOptions",
    "RewardReading",
    "Selection",
    "Step",
    "TaskEnvironment",
    "TaskError",
    "TaskLimits",
    "TaskRun",
    "TerminalBench2EvalEnv",
    "TerminalBench2EvalEnvConfig",
    "TrialResult",
    "TrialStatus",
    "format_pass_table",
    "load_dataset",
    "load_task",
    "materialise_row",
    "parse_image_map",
    "pass_metrics",
    "read_reward",
    "read_rows",
    "resolve_dataset",
    "run_pass",
    "run_trial",
    "scripted_trial",
    "select",
    "task_sandbox_spec",
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
