"""HermesAgentLoop: the multi-turn tool-calling agent loop.

One :meth:`HermesAgentLoop.run` runs one rollout: ask the model, run the tool calls it makes,
append the results, repeat until the model answers without tools or ``max_turns`` is reached.

Two kinds of model server, and so two turn strategies, picked once when the loop is built:

* **Phase 1** — anything with ``async chat_completion(**kwargs)`` returning an OpenAI-shaped
  response (:class:`ChatServer`: our :class:`~hermes_async.inference.chat.ChatClient`, an
  atroposlib ``ServerManager``, ...). Structured ``tool_calls`` are used; when there are none but
  the content holds ``<tool_call>`` text, the hermes parser recovers the calls (the reference's
  fallback).
* **Phase 2** — a token server (our ``hermes_async.inference.generate`` clients) plus a
  tokenizer: the prompt is rendered with the chat template, completion tokens stream in, the
  parser sees them as they arrive, and each tool call is **dispatched the moment it is sealed**,
  while generation continues. The token sequence is kept exactly (prompt + sampled ids + rendered
  suffixes; never re-tokenized) and handed out as ``managed_state``.

The loop object holds only configuration; everything that belongs to one rollout (its result,
tool runtime, the turn in flight) lives in per-run objects, so one loop may run several
rollouts at once (``run(messages, task_id=...)`` for each); :attr:`HermesAgentLoop.partial` is
the result of the latest run started.

What is returned and what is raised: every failure the *model* causes (unknown tool, invalid
JSON, bad argument types, a tool timeout, a call cut off by ``max_tokens``) is a model-visible
message plus a :class:`~hermes_async.agent.result.ToolError`; a model-server failure (after the
client's retries) ends the rollout with ``finished_naturally=False`` and ``error`` set. Only
cancellation propagates.
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


class RunAbort:
    """Ends one :meth:`HermesAgentLoop.run` early, from anywhere (a tool, another task).

    Like the rollout deadline: the run stops where it is (the model request and running tools
    are cancelled, the turn in flight is closed) and returns its partial result with
    ``failure`` (and ``error``) set to what :meth:`abort` was given. The rollout core uses it to
    end a rollout the moment its sandbox dies, so a retry can start at once. Aborting before
    the run starts ends it at its first step; aborting twice keeps the first failure.
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


class HermesAgentLoop:
    """Run multi-turn tool-calling rollouts (see the module docstring).

    The positional arguments are the reference's, so code written for it constructs the loop
    unchanged. Everything else is keyword-only: the options whole, and the plumbing.

    Args:
        server: A Phase 1 chat server (``async chat_completion(**kw)``) or a Phase 2 token
            client (``stream(prompt_ids, params)``; needs ``tokenizer``).
        tool_schemas: OpenAI tool schemas offered to the model.
        valid_tool_names: Names the loop will execute (others are "unknown tool").
        max_turns, temperature, max_tokens, extra_body, budget_config: The reference's
            arguments, the :class:`AgentOptions` fields of those names (``budget_config`` is
            ``budget``; an object that is not a ``BudgetConfig`` means the default). A value
            other than the default replaces that field of ``options``.
        task_id: The rollout's id (its sandbox's key); a fresh uuid4 if ``None``. A run may
            override it (``run(messages, task_id=...)``).
        options: Every other option (default: ``AgentOptions()``).
        tokenizer: Phase 2: renders prompts and decodes the stream (required with a token
            server).
        limits: Shared limiters (default: a private :class:`Limits`).
        sandboxes: Where tools get the rollout's sandbox (default: the current
            ``SandboxManager`` of the context). With none, each :meth:`run` opens a private
            manager on the configured backend (``TERMINAL_ENV``, default ``local``) and
            releases the sandbox when it returns. To verify in the same sandbox afterwards,
            open a manager around both (``async with open_sandbox_manager(): ...``).
        registry: Tool implementations (default: the built-in tools).
        release_sandbox: Release the rollout's sandbox when :meth:`run` returns. Default
            ``False``: a reward function usually inspects it afterwards. On an outer
            cancellation it is released regardless.

    Raises:
        ValueError: Bad options, or a token server without a tokenizer.
        ConfigError: A name in ``valid_tool_names`` is not a tool of ``registry`` (the
            built-in tools when ``None``): a custom registry not passed along.
        TypeError: ``server`` is neither kind of server, or ``options`` is not an
            ``AgentOptions``.
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
        base = options if options is not None else AgentOptions()
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
        self.options = dataclasses.replace(base, **given) if given else base
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
        """Run one rollout on ``messages`` (mutated in place) and return the result.

        Args:
            messages: The conversation so far; the rollout appends to this very list.
            task_id: This run's task id (its sandbox's key); default :attr:`task_id`. Runs
                that overlap need different ids, or they share one sandbox.
            seed: This run's Phase 2 sampling seed (default: ``sampling.seed``); ignored by
                chat servers.
            deadline: This run's deadline on the ``anyio.current_time()`` clock, instead of
                ``rollout_timeout`` from now (the rollout core passes the rollout's whole
                deadline, which also covers the reward and the release).
            sandboxes: This run's sandbox provider (default: the loop's).
            abort: Ends the run early from outside (see :class:`RunAbort`).

        Returns:
            The :class:`AgentResult`. A model-server failure, the rollout deadline or an abort
            ends the loop early with ``finished_naturally=False`` and ``error`` / ``failure``
            set; the messages so far are kept.

        Traced as one ``invoke_agent hermes-agent`` span (OpenTelemetry GenAI conventions),
        also when cancelled.

        **Cancellation**: an outer cancellation cancels the model request (closing its HTTP
        stream) and any running tool (its process group is killed), releases the rollout's
        sandbox (through the manager, which shields and bounds it) and propagates; the result
        so far stays readable as :attr:`partial`, internally consistent (tokens, masks and
        logprobs aligned; messages of a turn appended only once the turn finished, in Phase 2).
        """
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
                        result = await self._run(messages, task_id, seed, private, deadline, abort)
            else:
                result = await self._run(messages, task_id, seed, provider, deadline, abort)
            traced.set("hermes_async.turns", result.turns_used)
            traced.set("hermes_async.finished_naturally", result.finished_naturally)
            if result.failure is not None:
                traced.error(result.failure.message)
            return result

    async def _run(
        self,
        messages: list[dict[str, Any]],
        task_id: str,
        seed: int | None,
        sandboxes: SandboxProvider,
        deadline: float | None,
        abort: RunAbort | None,
    ) -> AgentResult:
        result = AgentResult(messages=messages)
        self.partial = result
        options = self.options
        runtime = ToolRuntime(
            task_id=task_id,
            limits=self.limits,
            user_task=first_user_content(messages),
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
        return result


async def _release(
    sandboxes: SandboxProvider | None, task_id: str, *, interrupted: bool = False
) -> None:
    """Release ``task_id``'s sandbox; never raises.

    No bound here: the provider's ``release`` shields and bounds itself (``SandboxManager``:
    ``close_timeout``), and a second bound around it would only hide the real one.
    """
    if sandboxes is None:
        return
    try:
        await sandboxes.release(task_id, interrupted=interrupted)
    except Exception as exc:  # cleanup must not mask the rollout's own outcome
        logger.warning("task %s: sandbox release failed: %s", task_id, exc)


def resize_tool_pool(max_workers: int, *, limits: Limits | None = None) -> Limits:
    """Resize the ``tool_calls`` limiter (the reference resized its tool thread pool).

    There is no thread pool: this resizes the limiter of tool calls running at once of the
    **current run** -- the limits of the current ``SandboxManager``, which the environment's
    rollouts, loops and ``ToolContext`` s share. Pass ``limits=`` to resize another
    :class:`~hermes_async.limits.Limits`. Outside a run there is no shared pool (each standalone
    loop has private limits), and that is a ``ConfigError`` saying so, not a silent no-op.

    Args:
        max_workers: Tool calls allowed to run at once (>= 1).
        limits: The limits to resize (default: the current run's).

    Returns:
        The :class:`~hermes_async.limits.Limits` that was resized.

    Raises:
        ConfigError: No ``limits`` given and no run is current.
        ValueError: ``max_workers`` < 1.
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
    """Refuse to offer the model a tool the loop cannot run.

    The usual cause: a custom tool registered in a ``ToolRegistry`` of your own, its schemas
    offered (``get_tool_definitions(..., registry=mine)``), but the registry not passed to the
    loop, which then runs tools from the built-in one. Every call of the model would fail as an
    "Unknown tool", blamed on the model.

    Raises:
        ConfigError: Names the missing tools and the fix.
    """
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
