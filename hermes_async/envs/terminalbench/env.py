"""TerminalBench2EvalEnv: Harbor tasks (Terminal-Bench 2) as an evaluation and training env.

Each trial runs in its own sandbox made from the task; the reward is the verifier's, on the
very sandbox the model used. ``evaluate`` writes trials as they finish in Harbor's job layout,
resumable, and exits non-zero when no trial got a reward. In training a rollout without a
verifier reward drops its group, never a 0 stand-in. See docs/terminalbench.md.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from hermes_async.agent import AgentOptions, AgentResult, ToolContext, run_rollout
from hermes_async.envs._atropos import APIServerConfig, ScoredDataGroup
from hermes_async.envs._examples import CyclingItems, example_configs
from hermes_async.envs.base import HermesAgentBaseEnv, _require_asyncio
from hermes_async.envs.config import HermesAgentEnvConfig
from hermes_async.envs.terminalbench.contract import TrialStatus, agent_timeout, setup_spec
from hermes_async.envs.terminalbench.dataset import (
    load_dataset,
    parse_names,
    resolve_dataset,
    select,
)
from hermes_async.envs.terminalbench.images import parse_image_map, task_sandbox_spec
from hermes_async.envs.terminalbench.job import JobWriter
from hermes_async.envs.terminalbench.report import format_pass_table, pass_metrics
from hermes_async.envs.terminalbench.runner import (
    ImageProbe,
    PassOptions,
    TaskRun,
    run_pass,
    scripted_trial,
    verifier_archive,
)
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.envs.terminalbench.trial import TrialResult, verify
from hermes_async.errors import ConfigError, HermesAsyncError, SandboxError
from hermes_async.inference.generate import GenerateClient
from hermes_async.tools.sandbox.docker_images import ImageBuilder
from hermes_async.tools.sandbox.manager import SandboxFactory, SandboxManager
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "NoRewardError",
    "TerminalBench2EvalEnv",
    "TerminalBench2EvalEnvConfig",
    "VerifierError",
)

logger = logging.getLogger(__name__)

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


class NoRewardError(HermesAsyncError):
    """``evaluate`` ran trials but none produced a reward (the run's exit status is 1)."""


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
    attempts: int = Field(default=1, ge=1, description="Trials per task (pass@k up to k).")
    registry: str | None = Field(
        default=None,
        description="Local dataset registry file (name@version -> folder); default "
        "$HERMES_ASYNC_DATASETS or ~/.config/hermes-async/datasets.toml.",
    )
    image_map: str | None = Field(
        default=None,
        description="Images replaced before use, FROM=LOCAL pairs: python:3.12-slim=mirror/py,...",
    )
    image_map_file: str | None = Field(
        default=None, description="The image map as a file (JSON object or FROM=LOCAL lines)."
    )
    allow_network_tasks: Literal["skip", "run"] = Field(
        default="skip",
        description="A task that needs a network it does not have: skip (a needs_network "
        "row) or run (on sandbox_options' network_mode; the row says so).",
    )
    timeout_multiplier: float = Field(
        default=1.0, gt=0, description="Scales every task's [agent].timeout_sec."
    )
    max_concurrent_tasks: int = Field(default=4, ge=1, description="Tasks running at once.")
    build_concurrency: int = Field(default=1, ge=1, description="Docker image builds at once.")
    build_network: str | None = Field(
        default=None,
        description="Network of image builds' RUN steps (e.g. host: a Dockerfile's apt-get / "
        "pip reach the mirrors the host reaches); default: the engine's.",
    )
    rows_cache_dir: str | None = Field(
        default=None, description="Where Hermes rows are materialised as task folders."
    )


@dataclass(slots=True)
class _Graded:
    trial: TrialResult
    verifier_tar: bytes | None


class TerminalBench2EvalEnv(CyclingItems, HermesAgentBaseEnv):
    """Harbor tasks, one sandbox each, scored by their verifiers.

    ``images.builds`` counts images built, not found cached; ``last_trials`` includes resumed
    trials.
    """

    name = "terminalbench2"
    env_config_cls = TerminalBench2EvalEnvConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tb_config: TerminalBench2EvalEnvConfig = self._tb_config()
        self.images = ImageBuilder(
            build_concurrency=self.tb_config.build_concurrency,
            build_network=self.tb_config.build_network,
        )
        self.tasks: list[HarborTask] = []
        self.last_trials: list[TrialResult] = []
        self.invalid_tasks: list[tuple[str, str]] = []
        self.image_map = parse_image_map(self.tb_config.image_map, self.tb_config.image_map_file)
        self._graded: dict[str, _Graded] = {}
        self._started: dict[str, float] = {}

    @classmethod
    def cli(cls) -> None:
        """atroposlib's ``serve`` / ``process`` / ``evaluate``; ``evaluate`` exits 1 when
        trials ran and none produced a reward."""
        try:
            super().cli()
        except NoRewardError as exc:
            print(f"{cls.name}: {exc}", file=sys.stderr)
            sys.exit(1)

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

        Invalid tasks and unknown names are logged with the reason and skipped; nothing left
        to run is a ``ConfigError``.
        """
        from hermes_async.envs.terminalbench import BUNDLED_TASKS

        cfg = self.tb_config
        source = (
            resolve_dataset(cfg.dataset, registry=cfg.registry) if cfg.dataset else BUNDLED_TASKS
        )
        report = load_dataset(source, cache_dir=cfg.rows_cache_dir)
        for name, reason in report.invalid:
            logger.warning("skipping invalid task %s: %s", name, reason)
        wanted = set(parse_names(cfg.task_filter)) - set(parse_names(cfg.skip_tasks))
        self.invalid_tasks = [
            (name, reason)
            for name, reason in report.invalid
            if (not wanted or name in wanted) and name not in parse_names(cfg.skip_tasks)
        ]
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
        return task_sandbox_spec(item, image_map=self.image_map)

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
        options.setdefault("default_exec_timeout", float(self.config.terminal_timeout))
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
        """Run the verifier on the rollout's sandbox; no reward is a ``VerifierError``.

        **Cancellation**: the running ``test.sh`` is killed; the sandbox is released by the
        rollout core.
        """
        started = self._started.get(ctx.task_id)
        agent_seconds = time.monotonic() - started if started is not None else 0.0
        agent_state: TrialStatus = (
            "agent_timeout" if (result.error or "").startswith("rollout deadline") else "ok"
        )
        sandbox = await ctx.manager.get(ctx.task_id)
        try:
            setup = setup_spec().request
            await sandbox.exec(setup.command, timeout=setup.timeout, user=setup.user)
            verified = await verify(item, sandbox)
            verifier_tar = await verifier_archive(sandbox)
        except SandboxError as exc:
            trial = TrialResult.failed(
                item, "model", "infra", str(exc), agent_seconds=agent_seconds
            )
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

        A group with an unscored rollout is dropped: its zeros would train as policy failures.

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

    def pass_options(self) -> PassOptions:
        """The pass this configuration asks for."""
        cfg = self.tb_config
        return PassOptions(
            agent=cfg.agent,
            attempts=cfg.attempts,
            concurrency=cfg.max_concurrent_tasks,
            timeout_multiplier=cfg.timeout_multiplier,
            network_tasks=cfg.allow_network_tasks,
            image_map=self.image_map,
            build_network=self.images.build_network is not None,
        )

    def _probe(self, manager: SandboxManager) -> ImageProbe | None:
        factory = getattr(manager, "factory", None)
        return getattr(factory, "image_labels", None)

    async def _ensure_reachable(self) -> None:
        # The oracle and the null agent talk to no model server.
        if self.tb_config.agent == "model":
            await super()._ensure_reachable()

    def _open_clients(self) -> AbstractAsyncContextManager[list[Any]]:
        if self.tb_config.agent == "model":
            return super()._open_clients()

        @asynccontextmanager
        async def none() -> AsyncIterator[list[Any]]:
            yield []  # the oracle and the null agent need no model client

        return none()

    async def run_tasks(
        self, tasks: Sequence[HarborTask] | None = None, *, writer: JobWriter | None = None
    ) -> list[TrialResult]:
        """Run the pass over ``tasks`` (default: the selected ones); asyncio only.

        **Cancellation**: every running trial is cancelled and its sandbox released; finished
        trials are already written by ``writer``.
        """
        _require_asyncio("TerminalBench2EvalEnv.run_tasks")
        chosen = list(tasks if tasks is not None else self.tasks or self.load_tasks())
        options = self.pass_options()
        model = self.server_specs[0].model_name if options.agent == "model" else None
        if options.agent == "model":
            resources: Any = self._rollout_resources()
        else:
            resources = self._scripted_resources()
        async with resources as (manager, clients):
            tools = self._resolve_tools_for_group() if options.agent == "model" else None

            async def trial_fn(task: HarborTask, attempt: int, network: bool) -> TaskRun:
                if tools is None:
                    return await scripted_trial(
                        task, manager=manager, options=options, network=network
                    )
                return await self._model_trial(task, manager, self._pick(clients), tools)

            self.last_trials = await run_pass(
                chosen,
                trial_fn,
                options=options,
                writer=writer,
                probe=self._probe(manager),
                model_name=model,
                invalid=self.invalid_tasks if tasks is None else (),
            )
        return self.last_trials

    def _scripted_resources(self) -> Any:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def opened() -> Any:
            async with self.open_sandboxes() as manager:
                yield manager, []

        return opened()

    async def _model_trial(
        self,
        task: HarborTask,
        manager: SandboxManager,
        client: Any,
        tools: tuple[list[Any], set[str]],
    ) -> TaskRun:
        task_id = f"tb2-{task.name}-{uuid.uuid4().hex[:8]}"
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
            trial = TrialResult.failed(
                task,
                "model",
                "model",
                scored.error or "the model produced no answer",
                agent_seconds=scored.seconds,
            )
            return TaskRun(trial, scored.messages)
        return TaskRun(graded.trial, scored.messages, graded.verifier_tar)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Run the pass, writing each trial as it finishes; ``NoRewardError`` if none scored.

        **Cancellation**: running trials are cancelled and their sandboxes released; the
        finished ones are on disk (``--env.resume true`` runs the rest).
        """
        start = time.time()
        cfg = self.tb_config
        out = self.config.data_dir_to_save_evals
        writer = None
        if out:
            writer = JobWriter(
                Path(out),
                config={
                    "job_name": Path(out).name,
                    "agent": cfg.agent,
                    "attempts": cfg.attempts,
                    "dataset": cfg.dataset,
                    "n_concurrent_trials": cfg.max_concurrent_tasks,
                    "timeout_multiplier": cfg.timeout_multiplier,
                    "allow_network_tasks": cfg.allow_network_tasks,
                    "image_map": self.image_map,
                },
                resume=bool(self.config.resume),
            )
        try:
            trials = await self.run_tasks(writer=writer)
        finally:
            if writer is not None:
                writer.close()
        print(format_pass_table(trials), flush=True)
        n_total = len(self.tasks or trials) * cfg.attempts
        metrics = writer.finish(trials, n_total=n_total) if writer else pass_metrics(trials)
        await self.evaluate_log(
            metrics=metrics,
            task_name="terminalbench2",
            start_time=start,
            end_time=time.time(),
            generation_parameters={"agent": cfg.agent, "attempts": cfg.attempts},
            samples=list(writer.rows) if writer else [],
            verbose=False,
        )
        if trials and all(t.reward is None for t in trials):
            raise NoRewardError(
                f"no trial of {len(trials)} produced a reward (statuses: "
                f"{', '.join(sorted({t.status for t in trials}))}); see the table above"
            )
