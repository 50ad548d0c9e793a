"""TerminalBench2EvalEnv: Harbor tasks (Terminal-Bench 2) as an evaluation and training env.

Run it like any atroposlib environment::

    # the oracle over the bundled tasks, on Docker, no model server
    python -m hermes_async.envs.terminalbench evaluate --env.agent oracle \\
        --env.data_dir_to_save_evals evals/tb2
    # a model (Phase 1 chat server here; vllm/sglang for Phase 2)
    python -m hermes_async.envs.terminalbench evaluate --env.dataset path/to/tasks \\
        --env.task_filter fix-git,hello --openai.base_url http://127.0.0.1:8000/v1

Each task's rollout runs in its own sandbox made from the task (its image built from
``environment/`` once per content, its cpus/memory, workdir and env: :meth:`sandbox_spec`),
bounded by ``[agent].timeout_sec`` times ``timeout_multiplier`` (:meth:`rollout_options`).
The reward is the verifier's, through :mod:`.trial`'s contract, on the very sandbox the model
used (:meth:`compute_reward`).

Decisions:

* **A missing or unreadable reward is a ``verifier`` failure, never 0.** In ``evaluate`` the
  task's row has ``reward: null`` and ``status: verifier``. In training (``serve`` /
  ``process``) ``compute_reward`` raises :class:`VerifierError`, and a group with such a
  rollout is dropped (``collect_trajectories`` returns no group) rather than trained on as a
  failure of the policy.
* ``--env.agent oracle|null`` runs the task's ``solution/solve.sh`` (or nothing) instead of
  the model: no model server is contacted. They are how the harness is checked: every oracle
  must score 1.0, every null run 0.0.
* Concurrency: at most ``max_concurrent_tasks`` tasks at once; image builds behind their own
  limiter (``build_concurrency``, default 1 for a 2-core box), container creation behind the
  ``sandbox_create`` limiter. A task that cannot be built or started is an ``infra`` row.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import Field

from hermes_async.agent import AgentOptions, AgentResult, ToolContext, run_rollout
from hermes_async.envs._atropos import APIServerConfig, ScoredDataGroup
from hermes_async.envs._examples import CyclingItems, example_configs
from hermes_async.envs.base import HermesAgentBaseEnv, _require_asyncio
from hermes_async.envs.config import HermesAgentEnvConfig
from hermes_async.envs.terminalbench.contract import (
    VERIFIER_LOGS_DIR,
    AgentKind,
    TrialStatus,
    agent_timeout,
    setup_spec,
)
from hermes_async.envs.terminalbench.dataset import load_dataset, select
from hermes_async.envs.terminalbench.report import (
    atif_trajectory,
    pass_metrics,
    result_row,
    write_trial_dir,
)
from hermes_async.envs.terminalbench.sandbox import SandboxTrial, task_sandbox_spec
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.envs.terminalbench.trial import TrialResult, format_pass_table, run_trial, verify
from hermes_async.errors import ConfigError, HermesAsyncError, SandboxError
from hermes_async.inference.generate import GenerateClient
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.docker_images import ImageBuilder
from hermes_async.tools.sandbox.manager import SandboxFactory, SandboxManager
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "TaskRun",
    "TerminalBench2EvalEnv",
    "TerminalBench2EvalEnvConfig",
    "VerifierError",
)

logger = logging.getLogger(__name__)

#: ``/logs/verifier`` is copied to the host only up to this size (else just the stdout tail).
MAX_VERIFIER_COPY_BYTES = 16 * 1024 * 1024

SYSTEM_PROMPT = (
    "You are an expert software engineer working in a Linux container through a terminal. "
    "Complete the task completely and carefully with the tools; verify your work; then "
    "answer briefly. Nobody will answer questions: decide yourself."
)

_GROUP_FAILURES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "hermes_async_tb2_group_failures", default=None
)


class VerifierError(HermesAsyncError):
    """The verifier produced no reward (none written, unreadable, timed out) or the sandbox
    failed during grading: the rollout has no score, and no 0 stands in for one."""


class TerminalBench2EvalEnvConfig(HermesAgentEnvConfig):
    """TerminalBench2EvalEnv's options (``--env.<name>``)."""

    dataset: str | None = Field(
        default=None,
        description="Harbor task folder, directory of tasks, or Hermes rows (.jsonl/.parquet); "
        "default: the bundled tasks.",
    )
    task_filter: str | None = Field(
        default=None, description="Comma-separated task names to run (default: all)."
    )
    skip_tasks: str | None = Field(default=None, description="Comma-separated names to skip.")
    agent: Literal["model", "oracle", "null"] = Field(
        default="model", description="model, oracle (solution/solve.sh) or null (nothing)."
    )
    timeout_multiplier: float = Field(
        default=1.0, gt=0, description="Scales every task's [agent].timeout_sec."
    )
    max_concurrent_tasks: int = Field(default=4, ge=1, description="Tasks running at once.")
    build_concurrency: int = Field(default=1, ge=1, description="Docker image builds at once.")
    allow_network: bool = Field(
        default=False, description="Give containers the network when their task allows it."
    )
    rows_cache_dir: str | None = Field(
        default=None, description="Where Hermes rows are materialised as task folders."
    )


@dataclass(frozen=True, slots=True)
class TaskRun:
    """One task's trial and what goes into its Harbor directory.

    Attributes:
        trial: The outcome (reward, status, timings).
        messages: The conversation (model), or the oracle's prompt and output.
        verifier_tar: ``/logs/verifier`` as a tar, when it could be copied.
    """

    trial: TrialResult
    messages: list[dict[str, Any]]
    verifier_tar: bytes | None = None


@dataclass(slots=True)
class _Graded:
    trial: TrialResult
    verifier_tar: bytes | None


async def _verifier_archive(sandbox: Sandbox) -> bytes | None:
    """``/logs/verifier`` as a tar, if it is small enough to copy (else None)."""
    probe = await sandbox.exec(f"du -sb {VERIFIER_LOGS_DIR} | cut -f1", timeout=60)
    try:
        size = int(probe.stdout.strip() or "0")
    except ValueError:
        return None
    if probe.exit_code != 0 or size > MAX_VERIFIER_COPY_BYTES:
        return None
    try:
        return await sandbox.get_archive(VERIFIER_LOGS_DIR)
    except (OSError, SandboxError):
        return None


class TerminalBench2EvalEnv(CyclingItems, HermesAgentBaseEnv):
    """Harbor tasks, one sandbox each, scored by their verifiers (see the module docstring).

    Attributes:
        tasks: The selected tasks (after ``setup``).
        images: The Docker image builder (``builds`` counts images built, not found cached).
        last_runs: The :class:`TaskRun` s of the last :meth:`run_tasks`.
    """

    name = "terminalbench2"
    env_config_cls = TerminalBench2EvalEnvConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tb_config: TerminalBench2EvalEnvConfig = self._tb_config()
        self.images = ImageBuilder(build_concurrency=self.tb_config.build_concurrency)
        self.tasks: list[HarborTask] = []
        self.last_runs: list[TaskRun] = []
        self._graded: dict[str, _Graded] = {}
        self._started: dict[str, float] = {}

    def _tb_config(self) -> TerminalBench2EvalEnvConfig:
        if not isinstance(self.config, TerminalBench2EvalEnvConfig):
            raise ConfigError(
                f"TerminalBench2EvalEnv needs a TerminalBench2EvalEnvConfig, got "
                f"{type(self.config).__name__}"
            )
        return self.config

    @classmethod
    def config_init(cls) -> tuple[TerminalBench2EvalEnvConfig, list[APIServerConfig]]:
        """Defaults: Docker sandboxes, terminal + file tools, 30 turns, groups of 4."""
        return example_configs(
            TerminalBench2EvalEnvConfig,
            terminal_backend="docker",
            max_agent_turns=30,
            system_prompt=SYSTEM_PROMPT,
            group_size=4,
            steps_per_eval=1000,
            total_steps=10,
            ensure_scores_are_not_same=False,
            tool_call_parser="hermes",
            terminal_timeout=600,
        )

    # -------------------------------------------------------------- tasks

    def load_tasks(self) -> list[HarborTask]:
        """Load ``dataset`` (default: the bundled tasks) and apply the selection.

        Invalid tasks and unknown names are logged by name with the reason, and skipped.

        Raises:
            ConfigError: The dataset path does not exist, or nothing is left to run.
        """
        from hermes_async.envs.terminalbench import BUNDLED_TASKS

        cfg = self.tb_config
        report = load_dataset(cfg.dataset or BUNDLED_TASKS, cache_dir=cfg.rows_cache_dir)
        for name, reason in report.invalid:
            logger.warning("skipping invalid task %s: %s", name, reason)
        chosen = select(report.tasks, cfg.task_filter, cfg.skip_tasks)
        for name in chosen.unknown:
            logger.warning("no task named %r in %s (task_filter/skip_tasks)", name, report.source)
        if not chosen.tasks:
            raise ConfigError(
                f"no task to run from {report.source} (task_filter={cfg.task_filter!r}, "
                f"skip_tasks={cfg.skip_tasks!r}; {len(report.tasks)} valid tasks)"
            )
        return list(chosen.tasks)

    async def setup(self) -> None:
        """Load and select the tasks.

        **Cancellation**: nothing to clean up.
        """
        self.tasks = self.load_tasks()
        self.train_items = list(self.tasks)
        self._index = 0

    def format_prompt(self, item: HarborTask) -> str:
        """The task's ``instruction.md``, verbatim."""
        return item.instruction

    def item_label(self, item: Any) -> str:
        """The task's name."""
        return item.name if isinstance(item, HarborTask) else super().item_label(item)

    def sandbox_spec(self, item: Any) -> SandboxSpec | None:
        """The task's sandbox: its image, cpus, memory, workdir, env (see :mod:`.sandbox`)."""
        if not isinstance(item, HarborTask):
            return None
        return task_sandbox_spec(item, allow_network=self.tb_config.allow_network)

    def rollout_options(self, item: Any, options: AgentOptions) -> AgentOptions:
        """The task's agent deadline: ``[agent].timeout_sec`` times ``timeout_multiplier``."""
        if not isinstance(item, HarborTask):
            return options
        timeout = agent_timeout(item, self.tb_config.timeout_multiplier)
        return dataclasses.replace(options, rollout_timeout=timeout)

    def make_sandbox_factory(self) -> SandboxFactory:
        """``terminal_backend``'s factory; Docker's shares :attr:`images` (the build cache)."""
        if self.config.terminal_backend != "docker":
            return super().make_sandbox_factory()
        from hermes_async.tools.sandbox.docker import DockerBackend, DockerSandboxConfig

        options = dict(self.config.sandbox_options or {})
        options.setdefault("default_exec_timeout_seconds", float(self.config.terminal_timeout))
        try:
            config = DockerSandboxConfig(**options)
        except TypeError as exc:
            raise ConfigError(
                f"invalid sandbox_options for terminal_backend='docker': {exc}"
            ) from exc
        return DockerBackend(config, images=self.images)

    # -------------------------------------------------------------- reward

    async def compute_reward(
        self, item: HarborTask, result: AgentResult, ctx: ToolContext
    ) -> float:
        """Run the verifier contract on the rollout's sandbox; the reward is the verifier's.

        Raises:
            VerifierError: No reward (none written, unreadable, verifier timeout) or the
                sandbox failed while grading.

        **Cancellation**: the running ``test.sh`` is killed; the sandbox is released by the
        rollout core.
        """
        started = self._started.get(ctx.task_id)
        agent_seconds = time.monotonic() - started if started is not None else 0.0
        agent_state: TrialStatus = (
            "agent_timeout" if (result.error or "").startswith("rollout deadline") else "ok"
        )
        sandbox = await ctx.manager.get(ctx.task_id)
        trial_sandbox = SandboxTrial(sandbox)
        try:
            await trial_sandbox.exec(setup_spec())
            verified = await verify(item, trial_sandbox)
            verifier_tar = await _verifier_archive(sandbox)
        except SandboxError as exc:
            trial = TrialResult.infra(item, "model", str(exc), agent_seconds=agent_seconds)
            self._graded[ctx.task_id] = _Graded(trial, None)
            self._fail(item)
            raise VerifierError(f"task {item.name}: grading failed: {exc}") from exc
        trial = TrialResult.graded(
            item,
            "model",
            agent_state,
            verified,
            agent_seconds=agent_seconds,
            agent_timeout_error=result.error,
        )
        self._graded[ctx.task_id] = _Graded(trial, verifier_tar)
        if trial.reward is None:
            self._fail(item)
            raise VerifierError(f"task {item.name}: {trial.error}")
        return trial.reward

    def _fail(self, item: HarborTask) -> None:
        failures = _GROUP_FAILURES.get()
        if failures is not None:
            failures.append(item.name)

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        """A group of ``group_size`` rollouts of the task, scored by its verifier.

        A group with a rollout the verifier could not score is dropped (``(None, [])``): its
        zeros would be trained on as failures of the policy.

        **Cancellation**: as :meth:`HermesAgentBaseEnv.collect_trajectories`.
        """
        failures: list[str] = []
        token = _GROUP_FAILURES.set(failures)
        try:
            group, backlog = await super().collect_trajectories(item)
        finally:
            _GROUP_FAILURES.reset(token)
            for task_id in [t for t in self._graded if t not in self._started]:
                self._graded.pop(task_id, None)  # training rollouts: nothing to report
        if failures:
            logger.warning(
                "dropping the group of %s: %d rollout(s) without a verifier reward",
                self.item_label(item),
                len(failures),
            )
            return None, backlog
        return group, backlog

    # -------------------------------------------------------------- evaluation

    async def run_tasks(self, tasks: Sequence[HarborTask] | None = None) -> list[TaskRun]:
        """Run one trial per task (``agent`` model, oracle or null); results in task order.

        At most ``max_concurrent_tasks`` at once, in one task group; a task that fails to
        build or start is an ``infra`` trial, never an exception.

        Raises:
            AsyncBackendError: Not running under asyncio (atroposlib, aiodocker).

        **Cancellation**: every running trial is cancelled and its sandbox released.
        """
        _require_asyncio("TerminalBench2EvalEnv.run_tasks")
        chosen = list(tasks if tasks is not None else self.tasks or self.load_tasks())
        kind: AgentKind = self.tb_config.agent
        limiter = anyio.CapacityLimiter(self.tb_config.max_concurrent_tasks)
        runs: list[TaskRun | None] = [None] * len(chosen)
        resources = self._rollout_resources() if kind == "model" else self._scripted_resources()
        async with resources as (manager, clients):
            tools = self._resolve_tools_for_group() if kind == "model" else None

            async def one(index: int, task: HarborTask) -> None:
                async with limiter:
                    if kind == "model":
                        assert tools is not None
                        runs[index] = await self._model_trial(
                            task, manager, self._pick(clients), tools
                        )
                    else:
                        runs[index] = await self._scripted_trial(task, kind, manager)

            async with anyio.create_task_group() as tg:
                for index, task in enumerate(chosen):
                    tg.start_soon(one, index, task, name=f"trial {task.name}")
        self.last_runs = [r for r in runs if r is not None]
        return self.last_runs

    def _scripted_resources(self) -> Any:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def opened() -> Any:
            async with self.open_sandboxes() as manager:
                yield manager, []

        return opened()

    def _task_id(self, task: HarborTask) -> str:
        return f"tb2-{task.name}-{uuid.uuid4().hex[:8]}"

    async def _scripted_trial(
        self, task: HarborTask, kind: AgentKind, manager: SandboxManager
    ) -> TaskRun:
        task_id = self._task_id(task)
        started = time.monotonic()
        manager.assign_spec(task_id, self.sandbox_spec(task))
        interrupted = False
        try:
            try:
                sandbox = await manager.get(task_id)
            except SandboxError as exc:
                infra = TrialResult.infra(
                    task, kind, str(exc), agent_seconds=time.monotonic() - started
                )
                return TaskRun(infra, [])
            trial = await run_trial(
                task,
                SandboxTrial(sandbox),
                agent=kind,
                timeout_multiplier=self.tb_config.timeout_multiplier,
            )
            verifier_tar = await _verifier_archive(sandbox) if trial.status != "infra" else None
        except anyio.get_cancelled_exc_class():
            interrupted = True
            raise
        finally:
            await manager.release(task_id, interrupted=interrupted)
        messages = [{"role": "user", "content": task.instruction}]
        if kind == "oracle":
            messages.append({"role": "assistant", "content": trial.agent_output})
        return TaskRun(trial, messages, verifier_tar)

    async def _model_trial(
        self,
        task: HarborTask,
        manager: SandboxManager,
        client: Any,
        tools: tuple[list[Any], set[str]],
    ) -> TaskRun:
        task_id = self._task_id(task)
        self._started[task_id] = time.monotonic()
        try:
            run = self.rollout_task(
                task,
                token_server=isinstance(client, GenerateClient),
                sandboxes=manager,
                tools=tools,
                temperature=self.config.eval_temperature,
            )
            scored = await run_rollout(
                client,
                run.messages,
                run.tools,
                setup=run.setup,
                options=run.options,
                task_id=task_id,
            )
            graded = self._graded.pop(task_id, None)
        finally:
            self._started.pop(task_id, None)
            self._graded.pop(task_id, None)
        if graded is None:
            # The reward never ran: the model never answered (server failure, no reply).
            trial = TrialResult(
                task=task.name,
                category=task.category,
                agent="model",
                status="model",
                reward=None,
                error=scored.error or "the model produced no answer",
                agent_seconds=scored.seconds,
            )
            return TaskRun(trial, scored.messages)
        return TaskRun(graded.trial, scored.messages, graded.verifier_tar)

    def write_results(self, runs: Sequence[TaskRun], root: Path) -> list[dict[str, Any]]:
        """Write ``results.jsonl`` and one Harbor trial directory per run; return the rows."""
        root.mkdir(parents=True, exist_ok=True)
        rows = []
        counts: dict[str, int] = {}
        model = self.server_specs[0].model_name if self.tb_config.agent == "model" else None
        for run in runs:
            index = counts.get(run.trial.task, 0)
            counts[run.trial.task] = index + 1
            trajectory = atif_trajectory(
                run.messages,
                session_id=f"{run.trial.task}-{index}",
                agent_name=f"hermes_async-{run.trial.agent}",
                model_name=model,
            )
            path = write_trial_dir(
                root,
                run.trial,
                index=index,
                trajectory=trajectory,
                verifier_tar=run.verifier_tar,
                config={"timeout_multiplier": self.tb_config.timeout_multiplier},
            )
            rows.append(result_row(run.trial, trial_dir=path.relative_to(root).as_posix()))
        with (root / "results.jsonl").open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        return rows

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Run every selected task once; write results, trials and metrics; print the table.

        **Cancellation**: every running trial is cancelled and its sandbox released; nothing
        is written.
        """
        start = time.time()
        runs = await self.run_tasks()
        trials = [r.trial for r in runs]
        print(format_pass_table(trials), flush=True)
        metrics = pass_metrics(trials)
        out = self.config.data_dir_to_save_evals
        rows = self.write_results(runs, Path(out)) if out else [result_row(t) for t in trials]
        await self.evaluate_log(
            metrics=metrics,
            task_name="terminalbench2",
            start_time=start,
            end_time=time.time(),
            generation_parameters={
                "agent": self.tb_config.agent,
                "timeout_multiplier": self.tb_config.timeout_multiplier,
            },
            samples=rows,
            verbose=False,
        )
