"""HermesAgentBaseEnv: an atroposlib ``BaseEnv`` whose rollouts are multi-turn tool-using agents.

A subclass implements only the task: ``config_init``, ``setup``, ``get_next_item``,
``format_prompt``, ``async compute_reward(item, result, ctx)`` and ``evaluate`` (usually one
call to :meth:`HermesAgentBaseEnv.run_agent_eval`). ``cli()`` is atroposlib's: ``serve``,
``process`` and ``evaluate``, with its flags (``--env.*``, ``--openai.*``, ``--config``) and its
priority (CLI > YAML > ``config_init``).

What the base does per group (``collect_trajectories``):

1. Resolve the tools once (a toolset ``distribution`` is sampled with the env's seeded RNG).
2. Open the model clients (our anyio clients, never atroposlib's ``ManagedServer``; a dead
   server is reported within ``server_connect_timeout``) and take the run's
   :class:`~hermes_async.tools.sandbox.manager.SandboxManager` (one per run, opened by the
   ``serve``/``process``/``evaluate`` entry points; one per group when called directly).
3. Run ``group_size`` rollouts in one anyio task group: :class:`HermesAgentLoop`, then
   ``compute_reward`` with a :class:`ToolContext` on the rollout's own sandbox, then the
   sandbox's release, shielded and bounded, whatever happened (reward raised, group
   cancelled). A rollout that *raises* cancels its siblings and the exception propagates
   (unwrapped from the ``ExceptionGroup``); a reward function that raises scores 0.0, as in
   the reference.
4. Build the ``ScoredDataGroup`` itself (atroposlib's default drops ``inference_logprobs``):
   ``tokens``, ``masks``, ``scores``, ``messages`` and ``inference_logprobs``, aligned.

**Phase 2** (``server_type`` ``vllm``/``sglang``): exact prompt + sampled + suffix token ids,
masks (-100 off-policy) and the sampled logprobs (1.0 at masked positions) — trainable.
**Phase 1** (``server_type`` ``openai``): placeholder tokens as in the reference (the
conversation's text re-tokenized, first token masked, logprobs 1.0) — **not trainable**; good
for SFT-style data and evaluation.

atroposlib is asyncio-only, so is this module: every async entry point checks the running
library and raises :class:`AsyncBackendError` under trio (the agent loop, ToolContext and
sandboxes themselves run under trio; use them directly there).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import (
    AbstractContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.abc import TaskStatus
from pydantic import Field

try:
    import wandb
    from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "hermes_async.envs needs atroposlib and its dependencies: "
        f"pip install 'hermes-async[atropos]' ({exc})"
    ) from exc

from hermes_async._redact import redact
from hermes_async.agent_loop import AgentResult, HermesAgentLoop
from hermes_async.budget import BudgetConfig
from hermes_async.envs._display import format_trajectory_for_display
from hermes_async.envs._servers import (
    ModelClient,
    ServerSpec,
    check_reachable,
    open_model_clients,
    server_specs,
)
from hermes_async.errors import HermesAsyncError, InferenceError
from hermes_async.gc_tuning import gc_tuned_for_rollouts
from hermes_async.inference.generate import GenerateClient, SamplingParams
from hermes_async.inference.tokenizer import QWEN_OFFLINE_NAME, Tokenizer, load_tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tool_context import ToolContext
from hermes_async.tools.registry import ToolRegistry, get_tool_definitions
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.sandbox.manager import (
    SandboxFactory,
    SandboxManager,
    current_sandbox_manager,
    use_sandbox_manager,
)
from hermes_async.tools.toolsets import sample_toolsets_from_distribution

__all__ = [
    "AsyncBackendError",
    "EvalReport",
    "HermesAgentBaseEnv",
    "HermesAgentEnvConfig",
    "RolloutSummary",
]

logger = logging.getLogger(__name__)

#: How many rollout summaries an environment keeps (for the demo's table and for tests).
MAX_ROLLOUT_SUMMARIES = 10_000

_EVALUATING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "hermes_async_env_evaluating", default=False
)


class AsyncBackendError(HermesAsyncError, RuntimeError):
    """An atroposlib-based environment was run under an async library other than asyncio."""

    phase = "config"


def _running_library() -> str | None:
    """``"asyncio"``, ``"trio"``, another name, or ``None`` outside any event loop."""
    try:
        asyncio.get_running_loop()
        return "asyncio"
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
            return "trio"
        except RuntimeError:
            pass
    return None


def _require_asyncio(what: str) -> None:
    library = _running_library()
    if library is None or library == "asyncio":
        return
    raise AsyncBackendError(
        f"{what}: hermes_async environments run on asyncio only, because atroposlib "
        f"(BaseEnv, its server manager and its trajectory-API client) is asyncio-only; "
        f"this code is running under {library!r}. Run it through the environment's cli() "
        "or anyio.run(..., backend='asyncio'). HermesAgentLoop, ToolContext and the "
        "sandboxes do run under trio: use them directly there."
    )


# ------------------------------------------------------------------------------------------
# Config


class HermesAgentEnvConfig(BaseEnvConfig):  # type: ignore[misc]
    """Config of a :class:`HermesAgentBaseEnv`: the reference's fields and defaults, plus new ones.

    Reference fields keep their names and defaults (``max_agent_turns=30``,
    ``terminal_backend="local"``, ``tool_call_parser="hermes"``, ...). Differences:

    * ``tokenizer_name`` defaults to ``"qwen-offline"``: the built-in offline Qwen tokenizer,
      written out once as an HF tokenizer directory (atroposlib loads it with
      ``AutoTokenizer``). Any HF name or local directory still works.
    * ``tool_pool_size`` (deprecated) no longer sizes a thread pool (there is none): it sets the
      ``tool_calls`` limiter, the number of tool calls running at once across all rollouts.
    * ``terminal_timeout`` is the local sandbox's default command timeout;
      ``terminal_lifetime`` the idle time after which a sandbox is reaped. No process-wide
      environment variables are set.
    """

    enabled_toolsets: list[str] | None = Field(
        default=None, description="Toolsets offered to the model (None: all)."
    )
    disabled_toolsets: list[str] | None = Field(
        default=None, description="Toolsets removed after enabled/distribution."
    )
    distribution: str | None = Field(
        default=None,
        description="Toolset distribution sampled once per group (wins over enabled_toolsets).",
    )
    max_agent_turns: int = Field(default=30, description="Maximum model calls per rollout.")
    system_prompt: str | None = Field(default=None, description="System message, if any.")
    agent_temperature: float = Field(default=1.0, description="Sampling temperature.")
    terminal_backend: str = Field(default="local", description="local, docker or modal.")
    terminal_timeout: int = Field(default=120, description="Default command timeout (s).")
    terminal_lifetime: int = Field(default=3600, description="Idle sandbox lifetime (s).")
    dataset_name: str | None = Field(default=None, description="HF dataset name.")
    dataset_split: str = Field(default="train", description="HF dataset split.")
    prompt_field: str = Field(default="prompt", description="Item field holding the prompt.")
    tool_pool_size: int = Field(
        default=128,
        description="Deprecated: concurrent tool calls across rollouts (the tool_calls limiter).",
    )
    tool_call_parser: str = Field(default="hermes", description="Phase 2 tool-call parser.")
    default_result_size_chars: int = Field(
        default=100_000, description="Tool results longer than this are saved to the sandbox."
    )
    turn_budget_chars: int = Field(default=200_000, description="Tool output per turn.")
    preview_size_chars: int = Field(default=1_500, description="Preview of a saved result.")
    tool_result_overrides: dict[str, int] | None = Field(
        default=None, description="Per-tool result-size thresholds."
    )
    extra_body: dict[str, Any] | None = Field(
        default=None, description="Extra fields for chat requests (Phase 1)."
    )
    tokenizer_name: str = Field(
        default=QWEN_OFFLINE_NAME,
        description="HF tokenizer name or directory; 'qwen-offline' is the built-in one.",
    )
    # ---- new in hermes_async
    token_endpoint: str = Field(
        default="auto",
        description="Phase 2 protocol: auto, vllm (/inference/v1/generate), atropos "
        "(/generate of atroposlib's vllm_api_server) or sglang.",
    )
    early_dispatch: bool = Field(
        default=True, description="Start each tool call as soon as it is parsed (Phase 2)."
    )
    parallel_tool_calls: bool = Field(
        default=False, description="Run one turn's tool calls concurrently."
    )
    tool_timeout: float | None = Field(default=300.0, description="Per-tool-call deadline (s).")
    turn_timeout: float | None = Field(default=None, description="Per-generation deadline (s).")
    rollout_timeout: float | None = Field(default=None, description="Per-rollout deadline (s).")
    seed: int | None = Field(
        default=None, description="Seeds toolset sampling and per-rollout sampling seeds."
    )
    eval_concurrency: int = Field(default=8, description="Eval rollouts running at once.")
    eval_temperature: float = Field(default=0.0, description="Temperature for evaluation.")
    server_connect_timeout: float = Field(
        default=10.0, description="Seconds to wait for the model server to answer at all."
    )
    model_request_limit: int = Field(default=64, description="Concurrent model requests.")
    sandbox_create_limit: int = Field(default=16, description="Concurrent sandbox creations.")
    sandbox_exec_limit: int = Field(default=128, description="Concurrent sandbox commands.")
    sandbox_release_timeout: float = Field(
        default=30.0, description="Deadline for releasing one sandbox (s)."
    )
    sandbox_options: dict[str, Any] | None = Field(
        default=None, description="Options of the terminal_backend (e.g. docker image)."
    )
    tune_gc: bool = Field(
        default=True,
        description="Apply hermes_async.gc_tuning.tune_gc_for_rollouts() for the run of "
        "serve/process/evaluate (fewer, shorter garbage-collector pauses with many rollouts).",
    )

    def build_budget_config(self) -> BudgetConfig:
        """The tool-result budget from the ``*_chars`` fields (reference v2)."""
        return BudgetConfig(
            default_result_size=self.default_result_size_chars,
            turn_budget=self.turn_budget_chars,
            preview_size=self.preview_size_chars,
            tool_overrides=dict(self.tool_result_overrides or {}),
        )


# ------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class RolloutSummary:
    """One finished rollout, for progress displays, tables and tests.

    Attributes:
        label: The item's label (:meth:`HermesAgentBaseEnv.item_label`).
        task_id: The rollout's task id (its sandbox's key).
        reward: The score.
        turns: Model calls made.
        tokens: Tokens in the trajectory (Phase 2: exact; Phase 1: placeholder count).
        seconds: Wall time of the rollout, reward included.
        finished_naturally: The model ended without a tool call.
        tool_errors: Number of failed tool calls.
        error: Why the loop stopped early, or why the reward failed, if either happened.
        evaluating: Part of an evaluation, not training.
    """

    label: str
    task_id: str
    reward: float
    turns: int
    tokens: int
    seconds: float
    finished_naturally: bool
    tool_errors: int
    error: str | None
    evaluating: bool


@dataclass(frozen=True, slots=True)
class EvalReport:
    """What :meth:`HermesAgentBaseEnv.run_agent_eval` measured.

    Attributes:
        metrics: ``eval/*`` metrics (also passed to ``evaluate_log``).
        samples: One dict per item (prompt, response, reward, turns, tokens, tool errors).
        rollouts: One :class:`RolloutSummary` per item, in item order.
        start_time: Unix time the evaluation started.
        end_time: Unix time it ended.
    """

    metrics: dict[str, float]
    samples: list[JSONObject]
    rollouts: list[RolloutSummary]
    start_time: float
    end_time: float


@dataclass(slots=True)
class _Rollout:
    summary: RolloutSummary
    scored: dict[str, Any]
    result: AgentResult
    prompt: str


# ------------------------------------------------------------------------------------------
# Server configs handed to atroposlib


def _atropos_safe(server_configs: Any) -> Any:
    """Server configs for atroposlib's ``ServerManager`` that cannot hang or go online.

    ``self.server`` stays a working chat server for user code (an LLM judge), but: every
    server is built as an ``openai`` server (a ``vllm``/``sglang`` server would load another HF
    tokenizer at construction), ``health_check`` is off (its wait loops forever on a dead
    server), and an empty ``api_key`` becomes ``"x"`` (the OpenAI SDK refuses an empty one).
    """

    def fix(config: Any) -> Any:
        if not isinstance(config, ServerBaseline):
            return config
        update: dict[str, Any] = {"server_type": "openai"}
        if isinstance(config, APIServerConfig):
            update["health_check"] = False
            if not config.api_key:
                update["api_key"] = "x"
        return config.model_copy(update=update)

    if isinstance(server_configs, list):
        return [fix(c) for c in server_configs]
    return fix(server_configs)


def _resolve_tokenizer(name: str) -> tuple[str, bool]:
    """``(directory or name for AutoTokenizer, is_builtin)`` for a ``tokenizer_name``."""
    if name == QWEN_OFFLINE_NAME:
        from hermes_async.inference.hf import qwen_offline_hf_dir

        return str(qwen_offline_hf_dir()), True
    path = Path(name).expanduser()
    builtin = path.is_dir() and (path / "hermes_async_tokenizer.json").is_file()
    return name, builtin


_BUILTIN_TOKENIZER: Tokenizer | None = None


def _builtin_tokenizer() -> Tokenizer:
    global _BUILTIN_TOKENIZER
    if _BUILTIN_TOKENIZER is None:
        _BUILTIN_TOKENIZER = load_tokenizer(None)
    return _BUILTIN_TOKENIZER


def _final_response(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant" and message.get("content"):
            return str(message["content"])
    return ""


def _node_field(node: Any, name: str) -> list[Any]:
    value = node.get(name) if isinstance(node, Mapping) else getattr(node, name, None)
    return list(value or [])


def _unwrap_group(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The single exception of a task group's error, or the group itself."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return group


@contextmanager
def _single_errors() -> Iterator[None]:
    """Re-raise a task group's lone exception as itself (nested groups included).

    The sandbox manager and the rollouts each have a task group, so one failure arrives
    wrapped once or twice; callers (atroposlib's loops, users) get the exception itself.
    Several concurrent failures stay an ``ExceptionGroup``.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        raise _unwrap_group(group) from None


# ------------------------------------------------------------------------------------------
# The environment


class HermesAgentBaseEnv(BaseEnv):  # type: ignore[misc]
    """Base class of tool-using agent environments (see the module docstring).

    Class attributes a subclass may set: ``name``, ``env_config_cls`` (a subclass of
    :class:`HermesAgentEnvConfig`) and ``tool_registry`` (default: the built-in tools).

    Attributes set here that subclasses and callers use:
        limits: The shared limiters (model requests, sandbox creation and exec, tool calls).
        rollout_summaries: :class:`RolloutSummary` of every finished rollout (bounded).
        on_rollout: Called with each :class:`RolloutSummary` as it finishes (progress bars).
        model_transport: An httpx transport for the model clients (tests; ``None``: network).
    """

    name: str | None = "hermes-agent"
    env_config_cls: type[HermesAgentEnvConfig] = HermesAgentEnvConfig
    tool_registry: ToolRegistry | None = None

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
        resolved, self._builtin_tokenizer = _resolve_tokenizer(config.tokenizer_name)
        config.tokenizer_name = resolved
        if config.wandb_name is None:
            # atroposlib means to default it to the class name but never does; /register-env
            # rejects a null name.
            config.wandb_name = self.name or type(self).__name__
        super().__init__(config, _atropos_safe(server_configs), slurm=slurm, testing=testing)
        self.config: HermesAgentEnvConfig = config
        if "tool_pool_size" in config.model_fields_set:
            logger.info(
                "tool_pool_size=%d is deprecated: there is no tool thread pool; it sets the "
                "tool_calls limiter (concurrent tool calls across rollouts)",
                config.tool_pool_size,
            )
        self.limits = Limits(
            model_requests=config.model_request_limit,
            sandbox_create=config.sandbox_create_limit,
            sandbox_exec=config.sandbox_exec_limit,
            tool_calls=config.tool_pool_size,
        )
        self._rng = random.Random(config.seed)
        self._current_group_tools: tuple[list[JSONObject], set[str]] | None = None
        self._tool_error_buffer: list[dict[str, Any]] = []
        self._reachable: set[str] = set()
        self._next_server = 0
        self._training_groups_running = 0
        self._training_groups_started = 0
        self._warned_all_tools = False
        self.rollout_summaries: list[RolloutSummary] = []
        self.on_rollout: Callable[[RolloutSummary], None] | None = None
        self.model_transport: httpx.AsyncBaseTransport | None = None
        self.loop_tokenizer: Tokenizer | None = None
        if self.phase == 2:
            self.loop_tokenizer = (
                _builtin_tokenizer()
                if self._builtin_tokenizer
                else load_tokenizer(config.tokenizer_name)
            )

    # -------------------------------------------------------------- what subclasses implement

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

    def item_label(self, item: Any) -> str:
        """A short name for ``item`` in tables and progress output."""
        if isinstance(item, Mapping):
            for key in ("name", "task_id", "id", "task"):
                if isinstance(item.get(key), str | int):
                    return str(item[key])
        text = str(item)
        return text if len(text) <= 40 else text[:37] + "..."

    # -------------------------------------------------------------- properties

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

    def _use_managed_server(self) -> bool:
        """Reference name: True when rollouts use a token server (Phase 2)."""
        return self.phase == 2

    # -------------------------------------------------------------- entry points

    async def env_manager(self) -> None:
        """``serve``: atroposlib's loop, inside one sandbox manager for the run.

        **Cancellation**: every sandbox is released (shielded, bounded) on the way out; so does
        SIGTERM, which then exits with status 143.
        """
        await self._run_entry("serve", super().env_manager)

    async def process_manager(self) -> None:
        """``process``: atroposlib's loop, inside one sandbox manager for the run.

        **Cancellation**: every sandbox is released (shielded, bounded) on the way out; so does
        SIGTERM, which then exits with status 143.
        """
        await self._run_entry("process", super().process_manager)

    async def _run_evaluate(self) -> None:
        """``evaluate``: ``setup()`` then ``evaluate()``, inside one sandbox manager.

        **Cancellation**: every sandbox is released (shielded, bounded) on the way out; so does
        SIGTERM, which then exits with status 143.
        """
        await self._run_entry("evaluate", super()._run_evaluate)

    async def _run_entry(self, what: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run an atroposlib entry point with a run-level sandbox manager.

        SIGTERM (what orchestrators send) cancels the run instead of killing the process on
        the spot, so sandboxes are released; SIGINT already cancels through ``asyncio.run``.
        """
        _require_asyncio(what)
        terminated = False
        tuned: AbstractContextManager[object] = (
            gc_tuned_for_rollouts() if self.config.tune_gc else nullcontext()
        )
        try:
            with tuned, _single_errors():
                async with self.open_sandboxes(), anyio.create_task_group() as tg:

                    async def on_sigterm(*, task_status: TaskStatus[None]) -> None:
                        nonlocal terminated
                        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                            task_status.started()
                            async for _ in signals:
                                logger.warning("SIGTERM: stopping %s, releasing sandboxes", what)
                                terminated = True
                                tg.cancel_scope.cancel()
                                return

                    if threading.current_thread() is threading.main_thread():
                        await tg.start(on_sigterm)
                    await run()
                    tg.cancel_scope.cancel()
        finally:
            await self._close_atropos_clients()
        if terminated:
            raise SystemExit(128 + signal.SIGTERM)

    async def _close_atropos_clients(self) -> None:
        """Close the OpenAI SDK clients atroposlib's servers opened (it never does)."""
        with anyio.move_on_after(5, shield=True):
            for server in getattr(self.server, "servers", []):
                client = getattr(server, "openai", None)
                close = getattr(client, "close", None)
                if close is not None:
                    try:
                        await close()
                    except Exception:  # closing is best effort; the run's result stands
                        logger.debug("closing an atroposlib client failed", exc_info=True)

    # -------------------------------------------------------------- resources

    def make_sandbox_factory(self) -> SandboxFactory:
        """The sandbox factory for ``terminal_backend`` (override to plug in your own)."""
        options = dict(self.config.sandbox_options or {})
        if self.config.terminal_backend == "local":
            options.setdefault("default_timeout", float(self.config.terminal_timeout))
        return make_backend_factory(self.config.terminal_backend, **options)

    @asynccontextmanager
    async def open_sandboxes(self) -> AsyncIterator[SandboxManager]:
        """The current sandbox manager, or a new one (made current) for the block.

        **Cancellation**: a manager opened here releases all its sandboxes on exit, shielded
        and bounded.
        """
        current = current_sandbox_manager()
        if current is not None:
            yield current
            return
        async with SandboxManager(
            self.make_sandbox_factory(),
            limits=self.limits,
            idle_timeout=float(self.config.terminal_lifetime),
            close_timeout=self.config.sandbox_release_timeout,
        ) as manager:
            with use_sandbox_manager(manager):
                yield manager

    @asynccontextmanager
    async def open_model_clients(self) -> AsyncIterator[list[ModelClient]]:
        """Clients for the configured servers, checked reachable first (bounded).

        Raises:
            ServerUnreachableError: A server did not answer within ``server_connect_timeout``.

        **Cancellation**: the connection pools are closed, shielded and bounded.
        """
        await self._ensure_reachable()
        async with open_model_clients(
            self._specs,
            token_endpoint=self.config.token_endpoint,
            limiter=self.limits.model_requests,
            transport=self.model_transport,
        ) as clients:
            yield clients

    async def _ensure_reachable(self) -> None:
        """Check each server answers, once per environment (bounded by
        ``server_connect_timeout``)."""
        for spec in self._specs:
            if spec.base_url not in self._reachable:
                await check_reachable(
                    spec,
                    timeout=self.config.server_connect_timeout,
                    transport=self.model_transport,
                )
                self._reachable.add(spec.base_url)

    def _pick(self, clients: Sequence[ModelClient]) -> ModelClient:
        client = clients[self._next_server % len(clients)]
        self._next_server += 1
        return client

    # -------------------------------------------------------------- tools

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

    # -------------------------------------------------------------- one rollout

    def _make_loop(
        self,
        client: ModelClient,
        tools: tuple[list[JSONObject], set[str]],
        task_id: str,
        temperature: float,
        manager: SandboxManager,
    ) -> HermesAgentLoop:
        config = self.config
        sampling: SamplingParams | None = None
        if isinstance(client, GenerateClient):
            seed = self._rng.randrange(2**31) if config.seed is not None else None
            sampling = SamplingParams(max_tokens=config.max_token_length, seed=seed)
        return HermesAgentLoop(
            client,
            tools[0],
            tools[1],
            max_turns=config.max_agent_turns,
            task_id=task_id,
            temperature=temperature,
            max_tokens=config.max_token_length,
            extra_body=config.extra_body,
            budget_config=config.build_budget_config(),
            limits=self.limits,
            sandboxes=manager,
            registry=self.tool_registry,
            tool_timeout=config.tool_timeout,
            turn_timeout=config.turn_timeout,
            rollout_timeout=config.rollout_timeout,
            parallel_tool_calls=config.parallel_tool_calls,
            tokenizer=self.loop_tokenizer if isinstance(client, GenerateClient) else None,
            tool_call_parser=config.tool_call_parser,
            early_dispatch=config.early_dispatch,
            sampling=sampling,
        )

    async def _score(
        self, item: Any, result: AgentResult, task_id: str, manager: SandboxManager
    ) -> tuple[float, str | None]:
        if result.turns_used == 0 or all(
            m.get("role") in ("system", "user") for m in result.messages
        ):
            return 0.0, None  # the model never answered: nothing to verify (reference)
        ctx = ToolContext(task_id, manager=manager, registry=self.tool_registry)
        try:
            return float(await self.compute_reward(item, result, ctx)), None
        except Exception as exc:  # the reference's rule: a failing reward scores 0.0
            message = redact(f"{type(exc).__name__}: {exc}")
            logger.warning("task %s: compute_reward failed (%s); reward 0.0", task_id, message)
            return 0.0, f"reward failed: {message}"

    def _scored_item(self, result: AgentResult, reward: float) -> dict[str, Any]:
        nodes = (result.managed_state or {}).get("nodes") or []
        if nodes:
            node = nodes[-1]
            tokens = [int(t) for t in _node_field(node, "tokens")]
            masks = [int(t) for t in _node_field(node, "masked_tokens")]
            logprobs = [float(x) for x in _node_field(node, "logprobs")]
        else:
            # Phase 1 placeholder, as the reference: NOT trainable (text re-tokenized).
            text = "\n".join(
                str(m["content"])
                for m in result.messages
                if isinstance(m.get("content"), str) and m["content"]
            )
            if self.tokenizer is not None:
                tokens = list(self.tokenizer.encode(text, add_special_tokens=True))
            else:
                tokens = list(range(min(len(text) // 4, 128)))
            masks = [-100, *tokens[1:]] if tokens else []
            logprobs = [1.0] * len(tokens)
        return {
            "tokens": tokens,
            "masks": masks,
            "scores": reward,
            "inference_logprobs": logprobs,
            "messages": result.messages,
        }

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
        task_id = str(uuid.uuid4())
        start = anyio.current_time()
        token = _EVALUATING.set(evaluating)
        try:
            prompt = self.format_prompt(item)
            messages: list[dict[str, Any]] = []
            if self.config.system_prompt:
                messages.append({"role": "system", "content": self.config.system_prompt})
            messages.append({"role": "user", "content": prompt})
            temp = self.config.agent_temperature if temperature is None else temperature
            loop = self._make_loop(client, tools, task_id, temp, manager)
            result = await loop.run(messages)
            reward, reward_error = await self._score(item, result, task_id, manager)
        finally:
            with anyio.move_on_after(self.config.sandbox_release_timeout + 1, shield=True):
                await manager.release(task_id)
            _EVALUATING.reset(token)
        scored = self._scored_item(result, reward)
        summary = RolloutSummary(
            label=self.item_label(item),
            task_id=task_id,
            reward=reward,
            turns=result.turns_used,
            tokens=len(scored["tokens"]),
            seconds=anyio.current_time() - start,
            finished_naturally=result.finished_naturally,
            tool_errors=len(result.tool_errors),
            error=redact(result.error) if result.error else reward_error,
            evaluating=evaluating,
        )
        if not evaluating:
            for err in result.tool_errors:
                self._tool_error_buffer.append(
                    {
                        "turn": err.turn,
                        "tool": err.tool_name,
                        "args": redact(err.arguments[:150]),
                        "error": redact(err.error[:300]),
                        "result": redact(err.tool_result[:300]),
                    }
                )
        self.rollout_summaries.append(summary)
        del self.rollout_summaries[:-MAX_ROLLOUT_SUMMARIES]
        if self.on_rollout is not None:
            self.on_rollout(summary)
        return _Rollout(summary=summary, scored=scored, result=result, prompt=prompt)

    async def collect_trajectory(self, item: Any) -> tuple[dict[str, Any] | None, list[Any]]:
        """One rollout, scored (reference API; :meth:`collect_trajectories` runs whole groups).

        **Cancellation**: the rollout's sandbox is released, shielded and bounded.
        """
        _require_asyncio("collect_trajectory")
        tools = self._current_group_tools or self._resolve_tools_for_group()
        await self._ensure_reachable()
        with _single_errors():
            async with self.open_sandboxes() as manager, self.open_model_clients() as clients:
                rollout = await self._run_rollout(
                    item, tools, self._pick(clients), manager, evaluating=False
                )
        return rollout.scored, []

    # -------------------------------------------------------------- one group

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        """Run ``group_size`` rollouts of ``item`` concurrently and build the scored group.

        Returns:
            ``(group, [])``. The group has ``tokens``, ``masks``, ``scores``, ``messages`` and
            ``inference_logprobs`` per rollout, aligned.

        Raises:
            InferenceError: Every rollout failed before the model answered (server down,
                unreachable within ``server_connect_timeout``, ...).
            Exception: Whatever a rollout raised (not the reward: that scores 0.0); the
                siblings are cancelled first, their sandboxes released. A single exception is
                re-raised as itself, not as an ``ExceptionGroup``.

        **Cancellation**: reaches every rollout (generation streams closed, tools killed);
        every sandbox is released, shielded and bounded.
        """
        _require_asyncio("collect_trajectories")
        tools = self._resolve_tools_for_group()
        self._current_group_tools = tools
        size = self.config.group_size
        rollouts: list[_Rollout | None] = [None] * size
        await self._ensure_reachable()
        self._training_groups_running += 1
        self._training_groups_started += 1
        try:
            with _single_errors():
                async with AsyncExitStack() as stack:
                    manager = await stack.enter_async_context(self.open_sandboxes())
                    clients = await stack.enter_async_context(self.open_model_clients())

                    async def one(index: int) -> None:
                        rollouts[index] = await self._run_rollout(
                            item, tools, self._pick(clients), manager, evaluating=False
                        )

                    async with anyio.create_task_group() as tg:
                        for index in range(size):
                            tg.start_soon(one, index)
        finally:
            self._training_groups_running -= 1
        done = [r for r in rollouts if r is not None]
        if done and all(
            r.result.error and all(m.get("role") != "assistant" for m in r.result.messages)
            for r in done
        ):
            raise InferenceError(
                f"every rollout of the group failed before the model answered: "
                f"{done[0].summary.error}"
            )
        return self._build_group(done), []

    def _build_group(self, rollouts: Sequence[_Rollout]) -> ScoredDataGroup:
        group: dict[str, Any] = {
            "tokens": [r.scored["tokens"] for r in rollouts],
            "masks": [r.scored["masks"] for r in rollouts],
            "scores": [r.scored["scores"] for r in rollouts],
            "inference_logprobs": [r.scored["inference_logprobs"] for r in rollouts],
            "messages": [r.scored["messages"] for r in rollouts],
            "advantages": None,
            "ref_logprobs": None,
            "generation_params": {
                "temperature": self.config.agent_temperature,
                "max_tokens": self.config.max_token_length,
            },
            "group_overrides": {},
            "overrides": None,
            "images": None,
        }
        return group

    # -------------------------------------------------------------- evaluation

    def _buffer_lengths(self) -> dict[str, int]:
        return {
            name: len(value)
            for name, value in vars(self).items()
            if name.endswith("_buffer") and isinstance(value, list)
        }

    async def _eval_all(
        self,
        items: Sequence[Any],
        tools: tuple[list[JSONObject], set[str]],
        limiter: anyio.CapacityLimiter,
        temperature: float,
        rollouts: list[_Rollout | None],
        failures: dict[int, str],
    ) -> None:
        async with self.open_sandboxes() as manager, self.open_model_clients() as clients:

            async def one(index: int, item: Any) -> None:
                async with limiter:
                    try:
                        rollouts[index] = await self._run_rollout(
                            item,
                            tools,
                            self._pick(clients),
                            manager,
                            evaluating=True,
                            temperature=temperature,
                        )
                    except Exception as exc:  # one broken item must not end the evaluation
                        failures[index] = redact(f"{type(exc).__name__}: {exc}")
                        logger.warning("eval item %d failed: %s", index, failures[index])

            async with anyio.create_task_group() as tg:
                for index, item in enumerate(items):
                    tg.start_soon(one, index, item)

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

        Each item runs one rollout (``eval_temperature``, default 0.0) and is scored by
        ``compute_reward`` through a ``ToolContext`` on its own sandbox; at most
        ``concurrency`` (default ``eval_concurrency``) run at once. A rollout that raises is
        recorded as reward 0.0 with its error; the evaluation goes on.

        Eval rewards stay out of the training metrics: ``is_evaluating`` is True inside the
        eval rollouts, and list attributes named ``*_buffer`` that grew during the evaluation
        are cut back to their length before it (when no training group ran meanwhile).

        Returns:
            The :class:`EvalReport` (``eval/mean_reward``, ``eval/accuracy`` = share of
            reward >= 1, ``eval/num_samples``, ``eval/mean_turns``, ``eval/tool_errors``,
            ``eval/evaluation_time_seconds``).

        **Cancellation**: every eval rollout is cancelled and its sandbox released; nothing
        is logged.
        """
        _require_asyncio("run_agent_eval")
        start = time.time()
        tools = self._resolve_tools_for_group()
        limiter = anyio.CapacityLimiter(max(1, concurrency or self.config.eval_concurrency))
        temp = self.config.eval_temperature if temperature is None else temperature
        before = self._buffer_lengths()
        started_before = self._training_groups_started
        rollouts: list[_Rollout | None] = [None] * len(items)
        failures: dict[int, str] = {}
        await self._ensure_reachable()
        with _single_errors():
            await self._eval_all(items, tools, limiter, temp, rollouts, failures)

        if self._training_groups_running == 0 and self._training_groups_started == started_before:
            for name, length in before.items():
                del getattr(self, name)[length:]
        end = time.time()
        samples: list[JSONObject] = []
        summaries: list[RolloutSummary] = []
        for index, item in enumerate(items):
            rollout = rollouts[index]
            if rollout is None:
                summary = RolloutSummary(
                    self.item_label(item), "", 0.0, 0, 0, 0.0, False, 0, failures.get(index), True
                )
                summaries.append(summary)
                samples.append({"task": summary.label, "reward": 0.0, "error": summary.error})
                continue
            summaries.append(rollout.summary)
            samples.append(
                {
                    "task": rollout.summary.label,
                    "prompt": rollout.prompt,
                    "response": redact(_final_response(rollout.result.messages)),
                    "reward": rollout.summary.reward,
                    "turns": rollout.summary.turns,
                    "tokens": rollout.summary.tokens,
                    "finished_naturally": rollout.summary.finished_naturally,
                    "tool_errors": [
                        redact(f"[turn {e.turn}] {e.tool_name}: {e.error}")
                        for e in rollout.result.tool_errors
                    ],
                    "error": rollout.summary.error,
                    "trajectory": format_trajectory_for_display(rollout.result.messages),
                }
            )
        rewards = [s.reward for s in summaries]
        count = max(len(rewards), 1)
        metrics = {
            "eval/mean_reward": sum(rewards) / count,
            "eval/accuracy": sum(1 for r in rewards if r >= 1.0) / count,
            "eval/num_samples": float(len(rewards)),
            "eval/mean_turns": sum(s.turns for s in summaries) / count,
            "eval/tool_errors": float(sum(s.tool_errors for s in summaries)),
            "eval/evaluation_time_seconds": end - start,
        }
        if log:
            await self.evaluate_log(
                metrics=metrics,
                task_name=task_name,
                start_time=start,
                end_time=end,
                generation_parameters={
                    "temperature": temp,
                    "max_tokens": self.config.max_token_length,
                    "max_agent_turns": self.config.max_agent_turns,
                },
                samples=samples,
                verbose=False,
            )
            if self.config.use_wandb and wandb.run is not None:
                wandb.log(metrics, step=self.curr_step)
        return EvalReport(metrics, samples, summaries, start, end)

    # -------------------------------------------------------------- wandb

    async def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        """Keep rollouts for the wandb table, formatted with tool calls and redacted.

        **Cancellation**: nothing to clean up.
        """
        keep = self.config.num_rollouts_per_group_for_logging
        scores = list(scored_data.get("scores") or [])
        if keep == -1:
            keep = len(scores)
        messages = scored_data.get("messages") or []
        rows: list[tuple[str, float]] = []
        for index in range(min(keep, len(scores))):
            if index < len(messages) and messages[index]:
                text = format_trajectory_for_display(messages[index])
            else:
                text = redact(str(self.tokenizer.decode(scored_data["tokens"][index])))
            rows.append((text, scores[index]))
        self.rollouts_for_wandb.append(rows)
        if len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
            self.rollouts_for_wandb.pop(0)

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """Add ``train/tool_errors_count`` and ``train/tool_error_details`` (redacted).

        **Cancellation**: nothing to clean up.
        """
        metrics = dict(wandb_metrics or {})
        if self._tool_error_buffer:
            metrics["train/tool_errors_count"] = len(self._tool_error_buffer)
            details = "\n".join(
                f"[turn {e['turn']}] {e['tool']}({e['args'][:80]}) -> {e['error'][:150]}"
                for e in self._tool_error_buffer
            )
            metrics["train/tool_error_details"] = details
            logger.info("tool errors since the last log:\n%s", details)
            self._tool_error_buffer.clear()
        else:
            metrics["train/tool_errors_count"] = 0
        await super().wandb_log(metrics)
