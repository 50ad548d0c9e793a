"""HermesAgentBaseEnv: an atroposlib ``BaseEnv`` whose rollouts are multi-turn tool-using agents.

A subclass implements only the task: ``config_init``, ``setup``, ``get_next_item``,
``format_prompt``, ``compute_reward`` and ``evaluate``. ``cli()`` is atroposlib's. The work is
done by :mod:`hermes_async.agent`; this module is the glue. atroposlib is asyncio-only, so
every async entry point raises :class:`~hermes_async.errors.AsyncBackendError` under trio.
See docs/architecture.md, "The atroposlib adapter".
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    nullcontext,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

from hermes_async._asynclib import require_asyncio
from hermes_async._groups import single_errors
from hermes_async._startup import STARTUP_FAILED
from hermes_async.agent import (
    AgentOptions,
    AgentResult,
    RolloutSetup,
    RolloutTask,
    ScoredRollout,
    ToolContext,
    Tools,
    VersionSource,
    run_group,
    run_rollout,
)
from hermes_async.agent.scoring import scored_data_item
from hermes_async.envs._atropos import BaseEnv, ScoredDataGroup, atropos_safe, wandb
from hermes_async.envs._cli import chosen_use_wandb, run_cli
from hermes_async.envs._entry import SpawnedTasks, as_child, run_entry
from hermes_async.envs._eval import (
    eval_report,
    failed_sample,
    roll_back_buffers,
    rollout_sample,
    run_items,
    select_eval_items,
    summary_from_sample,
    train_buffer_lengths,
)
from hermes_async.envs._override import collect_with_override, overrides
from hermes_async.envs._preflight import preflight
from hermes_async.envs._resume import (
    ITEM_KEY,
    ProcessItems,
    ResultsFile,
    default_item_key,
    errored,
    hide_groups_file_from_atroposlib,
    item_keys,
    open_groups_file,
)
from hermes_async.envs._servers import (
    ModelClient,
    ServerSpec,
    check_reachable,
    open_model_clients,
    server_specs,
)
from hermes_async.envs._watchdog import Watchdog
from hermes_async.envs.config import (
    HermesAgentEnvConfig,
    loop_tokenizer,
    resolve_tokenizer,
)
from hermes_async.envs.display import (
    format_tool_errors,
    tool_error_entry,
    wandb_rows,
)
from hermes_async.envs.results import EvalReport, FailureTally, RolloutSummary, summarize
from hermes_async.errors import AsyncBackendError, HermesAsyncError
from hermes_async.gc_tuning import gc_tuned_for_rollouts
from hermes_async.inference.generate import GenerateClient
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import (
    ToolDefaults,
    ToolRegistry,
    get_tool_definitions,
    use_tool_defaults,
)
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.manager import (
    SandboxFactory,
    SandboxManager,
    current_sandbox_manager,
    use_sandbox_manager,
)
from hermes_async.tools.sandbox.snapshot import SandboxSetup
from hermes_async.tools.sandbox.spec import SandboxSpec
from hermes_async.tools.toolsets import sample_toolsets_from_distribution

__all__ = (
    "AsyncBackendError",
    "EvalReport",
    "HermesAgentBaseEnv",
    "HermesAgentEnvConfig",
    "RolloutSummary",
)

logger = logging.getLogger(__name__)

#: How many rollout summaries an environment keeps (for the demo's table and for tests).
MAX_ROLLOUT_SUMMARIES = 10_000

_EVALUATING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "hermes_async_env_evaluating", default=False
)


def _require_asyncio(what: str) -> None:
    require_asyncio(
        f"{what}: this hermes_async environment",
        "atroposlib (BaseEnv, its server manager and its trajectory-API client)",
        remedy="use hermes_async.agent.run_group / run_rollout, which run under trio too",
    )


@dataclass(frozen=True, slots=True)
class _Rollout:
    scored: ScoredRollout
    summary: RolloutSummary
    prompt: str


# ------------------------------------------------------------------------------------------
# The environment


class HermesAgentBaseEnv(BaseEnv):  # type: ignore[misc]
    """Base class of tool-using agent environments.

    A subclass may set ``name``, ``env_config_cls``, ``tool_registry`` (default: the built-in
    tools) and ``train_buffers``: the names of list attributes holding training metrics, which
    :meth:`run_agent_eval` cuts back after an evaluation.

    Attributes:
        rollout_summaries: :class:`RolloutSummary` of every finished rollout (bounded).
        on_rollout: Called with each :class:`RolloutSummary` as it finishes.
        model_transport: An httpx transport for the model clients (tests; ``None``: network).
    """

    name: str | None = "hermes-agent"
    env_config_cls: type[HermesAgentEnvConfig] = HermesAgentEnvConfig
    tool_registry: ToolRegistry | None = None
    train_buffers: tuple[str, ...] = ()

    def __init__(
        self,
        config: HermesAgentEnvConfig,
        server_configs: Any,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        if not isinstance(config, HermesAgentEnvConfig):
            raise TypeError(
                f"{type(self).__name__} needs a HermesAgentEnvConfig (or subclass), got "
                f"{type(config).__name__}; set env_config_cls and return it from config_init()"
            )
        self._specs: list[ServerSpec] = server_specs(server_configs)
        resolved, self._builtin_tokenizer = resolve_tokenizer(config.tokenizer_name)
        config.tokenizer_name = resolved
        if (use_wandb := chosen_use_wandb()) is not None:
            config.use_wandb = use_wandb  # config_init's choice; atroposlib's CLI forced it on
        if config.wandb_name is None:
            # atroposlib means to default it to the class name but never does; /register-env
            # rejects a null name.
            config.wandb_name = self.name or type(self).__name__
        resumed = hide_groups_file_from_atroposlib(config)
        super().__init__(config, atropos_safe(server_configs), slurm=slurm, testing=testing)
        self.config: HermesAgentEnvConfig = config
        #: The scored-group lines (``data_path_to_save_groups``), keyed and resumable.
        self.groups_file: ResultsFile | None = open_groups_file(self, resumed)
        self._process_items: ProcessItems | None = None
        self._samples_file: ResultsFile | None = None  # process: data_path_to_save_samples
        self._entry: str | None = None  # "serve", "process" or "evaluate" while one runs
        #: Failure counts (``train/failures/<category>``) and group outcomes.
        self.failure_tally = FailureTally()
        #: Asynchronous RL: the trainer's policy version (``() -> int``, sync or async), read
        #: once per model request; segments carry it, and ``max_staleness`` needs it.
        self.policy_version_source: VersionSource | None = None
        #: Logs what a serve/process/evaluate run waits on when nothing finishes.
        self.watchdog: Watchdog | None = (
            Watchdog(config.watchdog_seconds, self._watchdog_state)
            if config.watchdog_seconds
            else None
        )
        if "tool_pool_size" in config.model_fields_set:
            logger.info(
                "tool_pool_size=%d is deprecated: there is no tool thread pool; it sets the "
                "tool_calls limiter (concurrent tool calls across rollouts)",
                config.tool_pool_size,
            )
        self.limits = config.build_limits()
        self._rng = random.Random(config.seed)
        self._current_group_tools: tuple[list[JSONObject], set[str]] | None = None
        self._tool_error_buffer: list[dict[str, Any]] = []
        self._reachable: set[str] = set()
        self._token_endpoints: dict[str, str] = {}  # token_endpoint="auto": probed once (#22)
        self._next_server = 0
        self._run_clients: list[ModelClient] | None = None
        self._training_groups_running = 0
        self._training_groups_started = 0
        self._spawned = SpawnedTasks()
        self._warned_all_tools = False
        self.rollout_summaries: list[RolloutSummary] = []
        self.on_rollout: Callable[[RolloutSummary], None] | None = None
        self.model_transport: httpx.AsyncBaseTransport | None = None
        self.loop_tokenizer: Tokenizer | None = (
            loop_tokenizer(config.tokenizer_name, builtin=self._builtin_tokenizer)
            if self.phase == 2
            else None
        )

    def format_prompt(self, item: Any) -> str:
        """Turn a dataset item into the user message."""
        raise NotImplementedError(f"{type(self).__name__} must implement format_prompt(item)")

    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        """Score a finished rollout; ``ctx`` reaches the rollout's own sandbox.

        **Cancellation**: the sandbox is released by the caller whatever happens here.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement async compute_reward(item, result, ctx)"
        )

    def sandbox_spec(self, item: Any) -> SandboxSpec | None:
        """How ``item``'s rollouts get their sandboxes (``None``: the backend's configuration)."""
        del item
        return None

    async def setup_sandbox(self, item: Any, sandbox: Sandbox) -> None:
        """Prepare a rollout's sandbox before its first turn (task files, setup commands).

        With ``group_snapshot`` on a backend that can snapshot, it runs once per group and the
        other sandboxes start from the snapshot. What it raises is an ``infra`` failure.
        """
        del item, sandbox

    def rollout_options(self, item: Any, options: AgentOptions) -> AgentOptions:
        """The agent options for ``item``'s rollouts (default: ``options`` unchanged)."""
        del item
        return options

    def item_key(self, item: Any) -> str:
        """The stable identity of ``item`` across runs (what ``--env.resume true`` matches).

        Default: its ``task_id`` / ``id`` / ``name`` / ``task`` field, else a hash of its JSON.
        """
        return default_item_key(item)

    def item_label(self, item: Any) -> str:
        """A short name for ``item`` in tables and progress output."""
        if isinstance(item, Mapping):
            for key in ("name", "task_id", "id", "task"):
                if isinstance(item.get(key), str | int):
                    return str(item[key])
        text = str(item)
        return text if len(text) <= 40 else text[:37] + "..."

    @property
    def phase(self) -> int:
        """2 when the servers are token servers (vllm, sglang), 1 for chat servers."""
        return self._specs[0].phase

    @property
    def server_specs(self) -> list[ServerSpec]:
        """The model servers this environment talks to."""
        return list(self._specs)

    @property
    def is_evaluating(self) -> bool:
        """True inside an evaluation rollout (so ``compute_reward`` can skip train buffers)."""
        return _EVALUATING.get()

    # -------------------------------------------------------------- watchdog

    def _waiting(self, what: str) -> AbstractContextManager[None]:
        """Register ``what`` with the watchdog for the block (no-op without one)."""
        return self.watchdog.waiting(what) if self.watchdog is not None else nullcontext()

    def _watchdog_state(self) -> str:
        parts = [
            f"{s.name} {s.in_use}/{s.total} held, {s.waiting} waiting"
            for s in self.limits.statistics().values()
        ]
        manager = current_sandbox_manager()
        if manager is not None:
            stats = manager.statistics()
            parts.append(
                f"sandboxes {stats.active} active, {stats.creating} creating, {stats.busy} busy"
            )
        return "; ".join(parts)

    async def setup_wandb(self) -> None:
        """atroposlib's, watched.

        **Cancellation**: as atroposlib's.
        """
        with self._waiting(f"the trainer at {self.config.rollout_server_url} (GET /wandb_info)"):
            await super().setup_wandb()

    async def register_env(self) -> None:
        """atroposlib's, watched.

        **Cancellation**: as atroposlib's.
        """
        url = self.config.rollout_server_url
        with self._waiting(f"the trainer at {url} to register this env (POST /register-env)"):
            await super().register_env()

    async def get_server_info(self) -> None:
        """atroposlib's, watched.

        **Cancellation**: as atroposlib's.
        """
        with self._waiting(f"the trainer at {self.config.rollout_server_url} (GET /info)"):
            await super().get_server_info()

    @classmethod
    def cli(cls) -> None:
        """atroposlib's command line; unknown flags and YAML keys fail before anything starts."""
        run_cli(cls, super().cli)

    def _use_managed_server(self) -> bool:
        """Reference name: True when rollouts use a token server (Phase 2)."""
        return self.phase == 2

    # -------------------------------------------------------------- entry points

    async def handle_env(self, item_uuid: str) -> Any:
        """atroposlib's worker (one group), as a child task the run waits for at its end."""
        with self._spawned.track():
            return await as_child(super().handle_env, item_uuid)

    async def env_manager(self) -> None:
        """``serve``: atroposlib's loop, inside one sandbox manager for the run.

        **Cancellation**: every sandbox is released; SIGTERM does the same, then exits 143.
        """
        await self._run_entry("serve", super().env_manager)

    async def process_manager(self) -> None:
        """``process``: atroposlib's loop, inside one sandbox manager for the run.

        **Cancellation**: every sandbox is released; SIGTERM does the same, then exits 143.
        """
        run = super().process_manager

        async def keyed() -> None:
            with ProcessItems(self, self.groups_file) as items:
                self._process_items = items
                self._samples_file = self._open_process_samples()
                try:
                    await run()
                finally:
                    self._process_items = None
                    if self._samples_file is not None:
                        self._samples_file.close()
                        self._samples_file = None

        await self._run_entry("process", keyed)

    def _open_process_samples(self) -> ResultsFile | None:
        """``process``'s samples file; on resume only finished groups' lines are kept."""
        path = self.config.data_path_to_save_samples
        if path is None:
            return None
        done = self.groups_file.done if self.groups_file is not None else {}
        return ResultsFile(
            path, resume=self.config.resume, keep=lambda r: r.get("group_key") in done
        ).open()

    async def _run_evaluate(self) -> None:
        """``evaluate``: ``setup()`` then ``evaluate()``, inside one sandbox manager.

        **Cancellation**: every sandbox is released; SIGTERM does the same, then exits 143.
        """
        await self._run_entry("evaluate", super()._run_evaluate)

    async def _run_entry(self, what: str, run: Callable[[], Any]) -> None:
        _require_asyncio(what)
        self._entry = what
        try:
            await self.preflight()
        except HermesAsyncError as exc:
            exc.add_note(STARTUP_FAILED)  # the CLI's one line says so; tracebacks show it
            raise
        await run_entry(
            what,
            run,
            sandboxes=self._open_run_resources,
            gc_tuning=gc_tuned_for_rollouts if self.config.tune_gc else None,
            servers=getattr(self.server, "servers", []),
            watchdog=self.watchdog,
            metrics_port=self.config.metrics_port,
            stray_tasks=lambda: [
                *getattr(self, "workers", ()),
                *self._spawned,
                getattr(self, "eval_runner", None),
            ],
        )

    async def preflight(self) -> None:
        """Check the configuration and the infrastructure before the first rollout.

        The backend check is skipped when ``make_sandbox_factory`` is replaced.

        Raises:
            ConfigError: A bad setting.
            SandboxError: The sandbox backend is unusable.
            ServerUnreachableError: A model server did not answer in time.
        **Cancellation**: whatever a check opened is closed.
        """
        custom_factory = "make_sandbox_factory" in vars(self) or overrides(
            self, HermesAgentBaseEnv, "make_sandbox_factory"
        )
        config = self.config
        await preflight(
            config.model_copy(update={"terminal_backend": "local"}) if custom_factory else config,
            backend_options={} if custom_factory else self._sandbox_options(),
            registry=self.tool_registry,
            check_servers=self._ensure_reachable,
        )

    # -------------------------------------------------------------- resources

    def _sandbox_options(self) -> dict[str, Any]:
        options = dict(self.config.sandbox_options or {})
        # Commands sent without a timeout (tools other than terminal) get terminal_timeout too.
        key = "default_timeout" if self.config.terminal_backend == "local" else None
        if self.config.terminal_backend in ("docker", "modal", "ssh", "singularity"):
            key = "default_exec_timeout"
        if key is not None:
            options.setdefault(key, float(self.config.terminal_timeout))
        return options

    def make_sandbox_factory(self) -> SandboxFactory:
        """The sandbox factory for ``terminal_backend`` (override to plug in your own)."""
        return make_backend_factory(self.config.terminal_backend, **self._sandbox_options())

    @asynccontextmanager
    async def open_sandboxes(self) -> AsyncIterator[SandboxManager]:
        """The current sandbox manager, or a new one (made current) for the block.

        **Cancellation**: a manager opened here releases its sandboxes, shielded and bounded.
        """
        # The run's tool defaults (terminal_timeout, skills_dir) reach every tool runtime built
        # inside, including loops and ToolContexts that subclass code builds itself.
        with self.tool_defaults():
            current = current_sandbox_manager()
            if current is not None:
                yield current
                return
            async with SandboxManager(
                self.make_sandbox_factory(),
                limits=self.limits,
                idle_timeout=float(self.config.terminal_lifetime),
                close_timeout=self.config.sandbox_release_timeout,
                warm_pool=self.config.build_warm_pool(),
            ) as manager:
                with use_sandbox_manager(manager):
                    yield manager

    def tool_defaults(self) -> AbstractContextManager[ToolDefaults]:
        """``use_tool_defaults`` with this config's ``terminal_timeout`` and ``skills_dir``."""
        return use_tool_defaults(
            terminal_timeout=float(self.config.terminal_timeout),
            skills_dir=self.config.skills_dir,
        )

    @asynccontextmanager
    async def _open_run_resources(self) -> AsyncIterator[SandboxManager]:
        async with self.open_sandboxes() as manager, self._open_clients() as clients:
            self._run_clients = clients
            try:
                yield manager
            finally:
                self._run_clients = None

    def _open_clients(self) -> AbstractAsyncContextManager[list[ModelClient]]:
        return open_model_clients(
            self._specs,
            token_endpoint=self.config.token_endpoint,
            limiter=self.limits.model_requests,
            transport=self.model_transport,
            endpoint_cache=self._token_endpoints,
            pool=self.config.server_pool,
            limits=self.limits,
            vocab_size=len(self.loop_tokenizer) if self.loop_tokenizer is not None else None,
        )

    @asynccontextmanager
    async def open_model_clients(self) -> AsyncIterator[list[ModelClient]]:
        """Clients for the configured servers, checked reachable first (bounded).

        Raises:
            ServerUnreachableError: A server did not answer within ``server_connect_timeout``.
        **Cancellation**: connection pools opened here are closed, shielded and bounded.
        """
        await self._ensure_reachable()
        if self._run_clients is not None:
            yield self._run_clients
            return
        async with self._open_clients() as clients:
            yield clients

    async def _ensure_reachable(self) -> None:
        """Check each server answers, once per environment."""
        for spec in self._specs:
            if spec.base_url not in self._reachable:
                await check_reachable(
                    spec,
                    timeout=self.config.server_connect_timeout,
                    transport=self.model_transport,
                )
                self._reachable.add(spec.base_url)

    @asynccontextmanager
    async def _rollout_resources(self) -> AsyncIterator[tuple[SandboxManager, list[ModelClient]]]:
        """The sandbox manager and model clients of a batch; a lone error comes out unwrapped."""
        await self._ensure_reachable()
        with single_errors():
            async with self.open_sandboxes() as manager, self.open_model_clients() as clients:
                yield manager, clients

    def _pick(self, clients: Sequence[ModelClient]) -> ModelClient:
        client = clients[self._next_server % len(clients)]
        self._next_server += 1
        return client

    def _resolve_tools_for_group(self) -> tuple[list[JSONObject], set[str]]:
        """``(tool_schemas, valid_names)`` for one group (reference name and shape)."""
        config = self.config
        enabled: list[str] | None
        if config.distribution:
            enabled = sample_toolsets_from_distribution(config.distribution, self._rng)
        else:
            enabled = config.enabled_toolsets
            if enabled is None and not self._warned_all_tools:
                self._warned_all_tools = True
                logger.warning("enabled_toolsets is None: offering ALL tools to the model")
        schemas, names = get_tool_definitions(
            enabled, config.disabled_toolsets, registry=self.tool_registry
        )
        return list(schemas), set(names)

    def _messages(self, item: Any) -> tuple[str, list[dict[str, Any]]]:
        prompt = self.format_prompt(item)
        messages: list[dict[str, Any]] = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append({"role": "user", "content": prompt})
        return prompt, messages

    def rollout_task(
        self,
        item: Any,
        *,
        token_server: bool,
        sandboxes: SandboxManager | None = None,
        tools: Tools | None = None,
        temperature: float | None = None,
    ) -> RolloutTask:
        """What the rollout core needs to run ``item``: the seam trainer adapters use.

        Args:
            token_server: Phase 2 (a token endpoint) or Phase 1 (a chat server).
            sandboxes: The sandbox manager (``None``: the current one).
            tools: The tools offered (``None``: resolved from the config).
            temperature: Replaces ``AgentOptions.temperature``.
        """
        seed = self._rng.randrange(2**31) if token_server and self.config.seed is not None else None

        async def reward(result: AgentResult, ctx: ToolContext) -> float:
            return await self.compute_reward(item, result, ctx)

        prepare: SandboxSetup | None = None
        if overrides(self, HermesAgentBaseEnv, "setup_sandbox"):

            async def prepare(sandbox: Sandbox) -> None:
                await self.setup_sandbox(item, sandbox)

        options = self.rollout_options(
            item,
            self.config.build_agent_options(
                temperature=temperature, token_server=token_server, seed=seed
            ),
        )
        if self.policy_version_source is not None and options.version_source is None:
            options = dataclasses.replace(options, version_source=self.policy_version_source)
        setup = RolloutSetup(
            reward=reward,
            tokenizer=self.loop_tokenizer if token_server else None,
            registry=self.tool_registry,
            sandboxes=sandboxes,
            limits=self.limits,
            failure_policy=self.config.build_failure_policy(),
            sandbox_spec=self.sandbox_spec(item),
            sandbox_setup=prepare,
            placeholder_encode=self._placeholder_encode,
        )
        _, messages = self._messages(item)
        if tools is None:
            tools = self._resolve_tools_for_group()
        return RolloutTask(messages, tools, setup, options)

    def _placeholder_encode(self, text: str) -> list[int]:
        """Phase 1 placeholder ids, with atroposlib's tokenizer as in the reference."""
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text, add_special_tokens=True))
        return list(range(min(len(text) // 4, 128)))

    def _record(self, item: Any, scored: ScoredRollout, *, evaluating: bool) -> RolloutSummary:
        summary = summarize(self.item_label(item), scored, evaluating=evaluating)
        if not evaluating:
            self._tool_error_buffer.extend(tool_error_entry(e) for e in scored.result.tool_errors)
        self.rollout_summaries.append(summary)
        del self.rollout_summaries[:-MAX_ROLLOUT_SUMMARIES]
        if self.watchdog is not None:
            self.watchdog.progress()
        if self.on_rollout is not None:
            self.on_rollout(summary)
        return summary

    async def _run_rollout(
        self,
        item: Any,
        tools: tuple[list[JSONObject], set[str]],
        client: ModelClient,
        manager: SandboxManager,
        *,
        evaluating: bool,
        temperature: float | None = None,
    ) -> _Rollout:
        token = _EVALUATING.set(evaluating)
        try:
            task = self.rollout_task(
                item,
                token_server=isinstance(client, GenerateClient),
                sandboxes=manager,
                tools=tools,
                temperature=temperature,
            )
            scored = await run_rollout(
                client,
                task.messages,
                task.tools,
                setup=task.setup,
                options=task.options,
                task_id=str(uuid.uuid4()),
            )
            prompt = self.format_prompt(item)
        finally:
            _EVALUATING.reset(token)
        return _Rollout(scored, self._record(item, scored, evaluating=evaluating), prompt)

    async def collect_trajectory(self, item: Any) -> tuple[dict[str, Any] | None, list[Any]]:
        """One rollout, scored (reference API).

        **Cancellation**: the rollout's sandbox is released, shielded and bounded.
        """
        _require_asyncio("collect_trajectory")
        tools = self._current_group_tools or self._resolve_tools_for_group()
        async with self._rollout_resources() as (manager, clients):
            rollout = await self._run_rollout(
                item, tools, self._pick(clients), manager, evaluating=False
            )
        return scored_data_item(rollout.scored), []

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        """Run ``group_size`` rollouts of ``item`` concurrently and build the scored group.

        A rollout's failure never fails the group; ``failure_policy`` decides for the group.
        Returns ``(group, [])``, or ``(None, [])`` for a masked group.

        Raises:
            InferenceError: Every rollout failed at the model server before the model answered.
            Exception: What ``format_prompt`` or an ``on_rollout`` callback raised.
        **Cancellation**: reaches every rollout; every sandbox is released, shielded and bounded;
        the rollouts cut off count as ``cancelled``.
        """
        _require_asyncio("collect_trajectories")
        key = self._process_items.take_key() if self._process_items is not None else None
        group_key = key if key is not None else self.item_key(item)
        tools = self._resolve_tools_for_group()
        self._current_group_tools = tools
        custom = overrides(self, HermesAgentBaseEnv, "collect_trajectory")
        if not custom:
            await self._ensure_reachable()
        self._training_groups_running += 1
        self._training_groups_started += 1
        finished = 0

        def record(scored: ScoredRollout) -> None:
            nonlocal finished
            finished += 1
            summary = self._record(item, scored, evaluating=False)
            if self._samples_file is not None:
                sample = rollout_sample(
                    summary.label, prompt, scored, f"{group_key}/{finished}", mode="process"
                )
                self._samples_file.append({**sample, "group_key": group_key})

        waiting = self._waiting(
            f"a group of {self.config.group_size} rollouts of {self.item_label(item)!r}"
        )
        try:
            if custom:
                # The reference's extension point: each rollout through the subclass's override.
                with single_errors():
                    async with self.open_sandboxes():
                        return await collect_with_override(
                            self.collect_trajectory,
                            item,
                            self.config.group_size,
                            generation_params=self._generation_params(),
                        )
            with waiting:
                async with self._rollout_resources() as (manager, clients):
                    client = self._pick(clients)
                    task = self.rollout_task(
                        item,
                        token_server=isinstance(client, GenerateClient),
                        sandboxes=manager,
                        tools=tools,
                    )
                    prompt = str(task.messages[-1].get("content") or "")  # the user message
                    group = await run_group(
                        client,
                        task.messages,
                        task.tools,
                        size=self.config.group_size,
                        setup=task.setup,
                        options=task.options,
                        on_rollout=record,
                        staleness=self.config.build_staleness(self.policy_version_source),
                        snapshot=self.config.group_snapshot,
                    )
        except anyio.get_cancelled_exc_class():
            self.failure_tally.add_cancelled(self.config.group_size - finished)
            raise
        finally:
            self._training_groups_running -= 1
        self.failure_tally.add_group(group)
        if group.masked:
            return None, []
        scored: ScoredDataGroup = group.to_scored_data_group(
            generation_params=self._generation_params()
        )
        scored[ITEM_KEY] = group_key
        return scored, []

    def _generation_params(self) -> dict[str, Any]:
        return {
            "temperature": self.config.agent_temperature,
            "max_tokens": self.config.max_token_length,
        }

    # -------------------------------------------------------------- evaluation

    async def run_agent_eval(
        self,
        items: Sequence[Any],
        *,
        task_name: str | None = None,
        temperature: float | None = None,
        concurrency: int | None = None,
        log: bool = True,
    ) -> EvalReport:
        """Evaluate ``items`` with the full agent loop and tools; report via ``evaluate_log``.

        Runs the first ``eval_size`` items, ``eval_group_size`` times each, at most ``concurrency``
        at once. Failed items are recorded and left out of the reward means. Samples are appended
        to ``samples.jsonl`` as they finish, for ``--env.resume true``. Returns the
        :class:`EvalReport`: metrics, samples and summaries in item order.

        Raises:
            ConfigError: ``train_buffers`` names something that is not a list attribute.
        **Cancellation**: every eval rollout is cancelled and its sandbox released; the samples
        already written stay; nothing is logged.
        """
        _require_asyncio("run_agent_eval")
        start = time.time()
        items = select_eval_items(items, self.config.eval_size, self.config.eval_group_size)
        tools = self._resolve_tools_for_group()
        temp = self.config.eval_temperature if temperature is None else temperature
        before = train_buffer_lengths(self, self.train_buffers)
        started_before = self._training_groups_started
        labels = [self.item_label(item) for item in items]
        keys = item_keys(items, self.item_key)
        results = self._open_samples_file() if log else None
        done = results.done if results is not None else {}
        samples: list[JSONObject | None] = [done.get(key) for key in keys]
        summaries: list[RolloutSummary | None] = [
            summary_from_sample(sample) if sample is not None else None for sample in samples
        ]
        todo = [i for i, sample in enumerate(samples) if sample is None]
        try:
            with self._waiting(f"an evaluation of {len(todo)} items"):
                async with self._rollout_resources() as (manager, clients):

                    async def one(index: int) -> None:
                        rollout = await self._run_rollout(
                            items[index],
                            tools,
                            self._pick(clients),
                            manager,
                            evaluating=True,
                            temperature=temp,
                        )
                        sample = rollout_sample(
                            labels[index], rollout.prompt, rollout.scored, keys[index]
                        )
                        samples[index], summaries[index] = sample, rollout.summary
                        if results is not None:
                            results.append(sample)

                    _, failures = await run_items(
                        todo, one, concurrency=concurrency or self.config.eval_concurrency
                    )
            for position, error in failures.items():  # the rollout could not even start
                index = todo[position]
                sample = failed_sample(labels[index], error, keys[index])
                samples[index], summaries[index] = sample, summary_from_sample(sample)
                if results is not None:
                    results.append(sample)
        finally:
            if results is not None:
                results.close()
        if self._training_groups_running == 0 and self._training_groups_started == started_before:
            roll_back_buffers(self, before)
        report = eval_report(
            [s for s in samples if s is not None],
            [s for s in summaries if s is not None],
            start,
            time.time(),
        )
        if log:
            await self.evaluate_log(
                metrics=report.metrics,
                task_name=task_name,
                start_time=report.start_time,
                end_time=report.end_time,
                generation_parameters={
                    "temperature": temp,
                    "max_tokens": self.config.max_token_length,
                    "max_agent_turns": self.config.max_agent_turns,
                },
                # Written line by line already (ours); atroposlib would rewrite the file.
                samples=None if results is not None else report.samples,
                verbose=False,
            )
            if self.config.use_wandb and wandb.run is not None:
                wandb.log(report.metrics, step=self.curr_step)
        return report

    def _open_samples_file(self) -> ResultsFile | None:
        """``samples.jsonl`` of ``data_dir_to_save_evals``, resumed under ``--env.resume``."""
        directory = self.config.data_dir_to_save_evals
        if directory is None:
            return None
        resume = self.config.resume and self._entry == "evaluate"
        return ResultsFile(
            Path(directory) / "samples.jsonl", resume=resume, keep=lambda r: not errored(r)
        ).open()

    # -------------------------------------------------------------- wandb

    async def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        """Keep rollouts for the wandb table, formatted with tool calls and redacted.

        **Cancellation**: nothing to clean up.
        """
        keep = self.config.num_rollouts_per_group_for_logging
        rows = wandb_rows(scored_data, keep, lambda ids: str(self.tokenizer.decode(ids)))
        self.rollouts_for_wandb.append(rows)
        if len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
            self.rollouts_for_wandb.pop(0)

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """Add the tool error, failure and group counters to atroposlib's metrics.

        **Cancellation**: nothing to clean up.
        """
        metrics = dict(wandb_metrics or {})
        metrics.update(self.failure_tally.metrics())
        if self._tool_error_buffer:
            metrics["train/tool_errors_count"] = len(self._tool_error_buffer)
            details = format_tool_errors(self._tool_error_buffer)
            metrics["train/tool_error_details"] = details
            logger.info("tool errors since the last log:\n%s", details)
            self._tool_error_buffer.clear()
        else:
            metrics["train/tool_errors_count"] = 0
        await super().wandb_log(metrics)
