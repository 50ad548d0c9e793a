"""HermesAgentLoop: the multi-turn tool-calling agent loop.

:meth:`HermesAgentLoop.run` runs one rollout: ask the model, run its tool calls, append the
results, repeat. One turn strategy per server kind, picked once: chat servers (Phase 1) or
token servers with streamed, early-dispatched tool calls (Phase 2). The loop holds only
configuration, so it may run several rollouts at once. Model mistakes become tool errors,
server failures end the run with ``error`` set; only cancellation propagates.
See docs/architecture.md, "The flow of one rollout".
"""

from __future__ import annotations

import dataclasses
import logging
import math
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import anyio

from hermes_async._otel import span
from hermes_async.agent._chat_turn import ChatServer, ChatTurns
from hermes_async.agent._start_ramp import StartRamp
from hermes_async.agent._token_turn import TokenTurns
from hermes_async.agent._tool_runner import RunTools, ToolSettings
from hermes_async.agent._transcript import first_user_content
from hermes_async.agent._watch import WatchedSandboxes
from hermes_async.agent.budget import BudgetConfig
from hermes_async.agent.failures import RolloutFailure, worst_failure
from hermes_async.agent.options import AgentOptions
from hermes_async.agent.result import AgentResult
from hermes_async.errors import ConfigError
from hermes_async.inference.generate import TokenClient
from hermes_async.inference.pool import pool_session
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tools.registry import (
    NOT_AVAILABLE_IN_RL,
    ToolRegistry,
    ToolRuntime,
    builtin_registry,
)
from hermes_async.tools.sandbox.base import SandboxProvider
from hermes_async.tools.sandbox.manager import (
    SandboxManager,
    current_sandbox_manager,
    use_sandbox_manager,
)
from hermes_async.tools.standalone import standalone_factory

__all__ = ("ChatServer", "HermesAgentLoop", "RunAbort", "resize_tool_pool")

logger = logging.getLogger(__name__)

#: The agent's name in telemetry (``gen_ai.agent.name``; spans ``invoke_agent hermes-agent``).
_AGENT_NAME = "hermes-agent"
# The default options with the reference's arguments applied, by those arguments. A loop per
# rollout (the reference's use) would otherwise build and check the same options each time.
_DERIVED: dict[tuple[tuple[str, type, object], ...], AgentOptions] = {}
_DERIVED_MAX = 64
_DEFAULT_OPTIONS = AgentOptions()  # frozen: one serves every loop built without options


class RunAbort:
    """Ends one :meth:`HermesAgentLoop.run` early, from anywhere (a tool, another task).

    Like the rollout deadline, the run stops where it is and returns its partial result with
    ``failure`` set. The rollout core uses it when a sandbox dies, so a retry starts at once.
    Aborting twice keeps the first failure.
    """

    __slots__ = ("_scope", "failure")

    def __init__(self) -> None:
        self.failure: RolloutFailure | None = None
        self._scope: anyio.CancelScope | None = None

    def abort(self, failure: RolloutFailure) -> None:
        """End the run with ``failure`` (synchronous; safe to call from any task of the run)."""
        if self.failure is not None:
            return
        self.failure = failure
        if self._scope is not None:
            self._scope.cancel(reason=failure.message)

    def _bind(self, scope: anyio.CancelScope) -> None:
        self._scope = scope
        if self.failure is not None:
            scope.cancel(reason=self.failure.message)


class _TurnStrategy(Protocol):
    async def run(self, result: AgentResult, tools: RunTools, *, seed: int | None = None) -> None:
        """Run one rollout's turns into ``result``."""
        ...


def _options_with(base: AgentOptions, given: dict[str, Any]) -> AgentOptions:
    """``dataclasses.replace(base, **given)``, built once per hashable ``given`` when ``base``
    is the default.

    Only the default's: a table keyed by the caller's own options would keep them (and the
    hooks they hold) alive. Shared, not copied: the options are frozen. The value's type is in
    the key: ``temperature=1`` and ``1.0`` stay apart.
    """
    if base is not _DEFAULT_OPTIONS:
        return dataclasses.replace(base, **given)
    key = tuple((name, type(value), value) for name, value in sorted(given.items()))
    try:
        derived = _DERIVED.get(key)
    except TypeError:  # an unhashable value (extra_body, a budget with a dict): not kept
        return dataclasses.replace(base, **given)
    if derived is None:
        derived = dataclasses.replace(base, **given)
        if len(_DERIVED) >= _DERIVED_MAX:
            _DERIVED.clear()
        _DERIVED[key] = derived
    return derived


class HermesAgentLoop:
    """Run multi-turn tool-calling rollouts.

    The positional arguments are the reference's; the rest is keyword-only.

    Args:
        server: A chat server (``async chat_completion(**kw)``) or a token client (needs
            ``tokenizer``).
        max_turns, temperature, max_tokens, extra_body, budget_config: The reference's names
            for :class:`AgentOptions` fields (``budget_config`` is ``budget``); a value other
            than the default replaces that field of ``options``.
        task_id: The sandbox's key; a fresh uuid4 if ``None``.
        sandboxes: Default: the context's current ``SandboxManager``, else a private one per
            :meth:`run` that releases the sandbox when the run returns.
        release_sandbox: Release the sandbox when :meth:`run` returns; off by default, since a
            reward usually inspects it. An outer cancellation releases it regardless.

    Raises:
        ConfigError: A name in ``valid_tool_names`` is not a tool of ``registry``.
    """

    def __init__(
        self,
        server: Any,
        tool_schemas: Sequence[JSONObject],
        valid_tool_names: Collection[str],
        max_turns: int = 30,
        task_id: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        budget_config: Any = None,
        *,
        options: AgentOptions | None = None,
        tokenizer: Tokenizer | None = None,
        limits: Limits | None = None,
        sandboxes: SandboxProvider | None = None,
        registry: ToolRegistry | None = None,
        release_sandbox: bool = False,
    ) -> None:
        base = options if options is not None else _DEFAULT_OPTIONS
        if not isinstance(base, AgentOptions):
            raise TypeError(f"options must be an AgentOptions, got {type(base).__name__}")
        given: dict[str, Any] = {}
        if max_turns != 30:
            given["max_turns"] = max_turns
        if temperature is not None:
            given["temperature"] = temperature
        if max_tokens is not None:
            given["max_tokens"] = max_tokens
        if extra_body:
            given["extra_body"] = dict(extra_body)
        if isinstance(budget_config, BudgetConfig):
            given["budget"] = budget_config
        self.options = _options_with(base, given) if given else base
        self.server = server
        self.tool_schemas: list[JSONObject] = list(tool_schemas)
        self.valid_tool_names: set[str] = set(valid_tool_names)
        _check_offered_tools(self.valid_tool_names, registry)
        self.task_id = task_id or str(uuid.uuid4())
        self.limits = limits or Limits()
        self.sandboxes = sandboxes
        self.registry = registry
        self.tokenizer = tokenizer
        self.release_sandbox = release_sandbox
        self._tools = ToolSettings(registry, frozenset(self.valid_tool_names), self.options)
        self._turns = self._strategy(server, tokenizer)
        #: The result of the latest run started: consistent after every step, readable after a
        #: cancellation.
        self.partial: AgentResult | None = None

    def _strategy(self, server: Any, tokenizer: Tokenizer | None) -> _TurnStrategy:
        """Pick the turn strategy for ``server``, once."""
        if isinstance(server, TokenClient):
            if tokenizer is None:
                raise ValueError(
                    "a token server (Phase 2) needs a tokenizer: pass tokenizer=load_tokenizer(...)"
                )
            return TokenTurns(server, tokenizer, self.tool_schemas, self.options)
        if isinstance(server, ChatServer):
            return ChatTurns(server, self.tool_schemas, self.options)
        raise TypeError(
            f"server must have `async chat_completion(**kw)` (Phase 1) or be a token client "
            f"with `stream(prompt_ids, params)` (Phase 2); got {type(server).__name__}"
        )

    # The reference's attribute names, read from the options (fixed once built).
    @property
    def max_turns(self) -> int:
        """Maximum model calls."""
        return self.options.max_turns

    @property
    def temperature(self) -> float:
        """The sampling temperature in effect (given, else ``sampling``'s, else 1.0)."""
        if self.options.temperature is not None:
            return self.options.temperature
        if self.options.sampling is not None and isinstance(self.server, TokenClient):
            return self.options.sampling.temperature
        return 1.0

    @property
    def max_tokens(self) -> int | None:
        """Per-turn completion cap."""
        return self.options.max_tokens

    @property
    def extra_body(self) -> dict[str, Any] | None:
        """Extra request fields (a copy)."""
        return dict(self.options.extra_body) if self.options.extra_body else None

    @property
    def budget_config(self) -> BudgetConfig | None:
        """The tool-result budget (``None``: the default)."""
        return self.options.budget

    async def run(
        self,
        messages: list[dict[str, Any]],
        *,
        task_id: str | None = None,
        seed: int | None = None,
        deadline: float | None = None,
        sandboxes: SandboxProvider | None = None,
        abort: RunAbort | None = None,
    ) -> AgentResult:
        """Run one rollout, appending to ``messages``, and return the result.

        Args:
            task_id: Default :attr:`task_id`; overlapping runs need different ids, or they
                share one sandbox.
            seed: The token path's sampling seed (default ``sampling.seed``).
            deadline: On the ``anyio.current_time()`` clock, instead of ``rollout_timeout``
                from now.
            abort: Ends the run early from outside.

        A server failure, the deadline or an abort ends the run with
        ``finished_naturally=False`` and ``error`` set. Traced as one ``invoke_agent
        hermes-agent`` span, also when cancelled.

        **Cancellation**: the model request and running tools are cancelled, the sandbox is
        released and the cancellation propagates; :attr:`partial` stays consistent.
        """
        result = AgentResult(messages=messages)
        self.partial = result  # this run's, from the start: also if cancelled before it begins
        # Thousands started in one pass wait here, before any of their set-up.
        async with StartRamp():
            task_id = task_id or self.task_id
            attributes = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": _AGENT_NAME,
                "hermes_async.task_id": task_id,
            }
            # One invoke_agent span per run, whoever started it (a rollout's span is its parent).
            with span(f"invoke_agent {_AGENT_NAME}", attributes) as traced:
                provider = sandboxes or self.sandboxes or current_sandbox_manager()
                if provider is None:
                    # Reference-style use outside an environment: this run owns a private manager.
                    # What open_sandbox_manager does, without its generator frame held for the run.
                    async with SandboxManager(
                        standalone_factory()[1], limits=self.limits, idle_timeout=None
                    ) as private:
                        with use_sandbox_manager(private):
                            await self._run(result, task_id, seed, private, deadline, abort)
                else:
                    await self._run(result, task_id, seed, provider, deadline, abort)
                traced.set("hermes_async.turns", result.turns_used)
                traced.set("hermes_async.finished_naturally", result.finished_naturally)
                if result.failure is not None:
                    traced.error(result.failure.message)
                return result

    async def _run(
        self,
        result: AgentResult,
        task_id: str,
        seed: int | None,
        sandboxes: SandboxProvider,
        deadline: float | None,
        abort: RunAbort | None,
    ) -> None:
        options = self.options
        runtime = ToolRuntime(
            task_id=task_id,
            limits=self.limits,
            user_task=first_user_content(result.messages),
            sandboxes=sandboxes,
            terminal_timeout=options.terminal_timeout,
            skills_dir=options.skills_dir,
            # A lost browser session (a SandboxError a tool raised) ends a watched rollout as
            # infra, as a lost sandbox does.
            on_sandbox_lost=sandboxes.lost if isinstance(sandboxes, WatchedSandboxes) else None,
        )
        tools = RunTools(self._tools, runtime)
        timeout = options.rollout_timeout
        if deadline is None:
            deadline = anyio.current_time() + (timeout if timeout is not None else math.inf)
        release = self.release_sandbox
        interrupted = False
        stop = abort if abort is not None else RunAbort()
        try:
            # One pool session per run: a ServerPool keeps the run's turns on one server (its
            # prefix cache); without a pool this is one context variable set and reset.
            # One scope for the deadline and an abort (a parked rollout holds every scope it is
            # in, ~0.6 KB each): which one ended the run is told by stop.failure below.
            with pool_session(task_id), anyio.CancelScope(deadline=deadline) as scope:
                stop._bind(scope)
                await self._turns.run(result, tools, seed=seed)
        except anyio.get_cancelled_exc_class():
            tools.close_inflight(result, "the rollout was cancelled")
            release = True  # nobody will compute a reward on this rollout: free its sandbox now
            interrupted = True
            raise
        finally:
            stop._scope = None
            if release:
                await _release(sandboxes, task_id, interrupted=interrupted)
        ended: RolloutFailure | None = None
        if scope.cancelled_caught and stop.failure is not None:
            ended = stop.failure
        elif scope.cancelled_caught:
            what = f"{timeout:g} s" if timeout is not None else "its deadline"
            ended = RolloutFailure.of(
                "agent_timeout",
                f"rollout deadline of {what} exceeded",
                source="deadline",
                deadline="rollout_timeout",
            )
        if ended is not None:
            result.finished_naturally = False
            tools.close_inflight(result, ended.message)
        # An abort that came after the last turn still marks the rollout (its sandbox died).
        failure = worst_failure([result.failure, ended, stop.failure])
        if failure is not None and failure is not result.failure:
            result.failure = failure
            result.error = failure.message


async def _release(
    sandboxes: SandboxProvider | None, task_id: str, *, interrupted: bool = False
) -> None:
    """Release ``task_id``'s sandbox; never raises. The provider bounds its own release."""
    if sandboxes is None:
        return
    try:
        await sandboxes.release(task_id, interrupted=interrupted)
    except Exception as exc:  # cleanup must not mask the rollout's own outcome
        logger.warning("task %s: sandbox release failed: %s", task_id, exc)


def resize_tool_pool(max_workers: int, *, limits: Limits | None = None) -> Limits:
    """Resize the ``tool_calls`` limiter; the reference resized its tool thread pool.

    Resizes ``limits``, else the current ``SandboxManager``'s, which the run's rollouts, loops
    and ``ToolContext`` s share. Outside a run there is none: a ``ConfigError``, not a no-op.
    Returns the :class:`~hermes_async.limits.Limits` resized.
    """
    target = limits
    if target is None:
        manager = current_sandbox_manager()
        if manager is None:
            raise ConfigError(
                f"resize_tool_pool({max_workers}) needs a run to resize: there is no tool "
                "thread pool, only the tool_calls limiter of the current run (inside an "
                "environment's serve/process/evaluate or a use_sandbox_manager block); set "
                "tool_pool_size in the environment's config, or pass limits=..."
            )
        target = manager.limits
    target.tool_calls.set_total(max_workers)
    return target


def _check_offered_tools(names: Collection[str], registry: ToolRegistry | None) -> None:
    """Refuse to offer a tool the loop cannot run (usually: a custom registry not passed)."""
    known = registry if registry is not None else builtin_registry()
    missing = sorted(n for n in names if n not in known and n not in NOT_AVAILABLE_IN_RL)
    if missing:
        where = "the built-in tools" if registry is None else "the registry passed as registry="
        raise ConfigError(
            f"tools offered to the model are not in {where}: {missing}; a tool registered in a "
            "ToolRegistry of your own needs that registry passed too: registry=my_registry "
            "(HermesAgentLoop, RolloutSetup for run_group / run_rollout; environments: the "
            "tool_registry class attribute), else every call to it fails as an unknown tool"
        )
