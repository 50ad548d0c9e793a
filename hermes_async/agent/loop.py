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

import logging
import math
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import anyio

from hermes_async.agent._chat_turn import ChatTurns
from hermes_async.agent._token_turn import TokenTurns
from hermes_async.agent._tool_runner import RunTools, ToolSettings
from hermes_async.agent._transcript import first_user_content
from hermes_async.agent.budget import DEFAULT_BUDGET, BudgetConfig
from hermes_async.agent.failures import RolloutFailure, worst_failure
from hermes_async.agent.result import AgentResult
from hermes_async.inference.generate import SamplingParams, TokenClient
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tools.registry import ToolRegistry, ToolRuntime
from hermes_async.tools.sandbox.base import SandboxProvider
from hermes_async.tools.sandbox.manager import current_sandbox_manager

__all__ = (
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "AgentOptions",
    "ChatServer",
    "HermesAgentLoop",
    "RunAbort",
)

logger = logging.getLogger(__name__)

#: Default per-tool-call deadline. The reference had none (a hung tool blocked the rollout
#: forever); 300 s is the reference ToolContext's own wait and above the terminal tool's 120 s
#: default command timeout, so a command's own timeout always fires first.
DEFAULT_TOOL_TIMEOUT_SECONDS = 300.0


@runtime_checkable
class ChatServer(Protocol):
    """A Phase 1 model server: OpenAI-style chat completions."""

    async def chat_completion(self, **kwargs: Any) -> Any:
        """Return an OpenAI ``ChatCompletion``-shaped object."""
        ...


def _check_timeout(name: str, value: float | None) -> None:
    if value is not None and not value > 0:  # also rejects NaN
        raise ValueError(f"{name} must be > 0 seconds or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Everything :class:`HermesAgentLoop` takes beyond the server, the tools and the plumbing.

    One value for a whole batch: :func:`~hermes_async.agent.rollout.run_group` and
    :func:`~hermes_async.agent.rollout.run_rollout` take it, and
    :meth:`HermesAgentLoop.from_options` builds a loop from it. Defaults are the loop's (and the
    reference's, where it had the knob).

    Attributes:
        max_turns: Maximum model calls per rollout.
        temperature: Sampling temperature (1.0: on-policy sampling).
        max_tokens: Per-turn completion cap (``None``: the server's default).
        extra_body: Extra request fields merged into every chat request (Phase 1).
        budget: Tool-result budget (``None``: 100,000 chars per result, 200,000 per turn).
        tool_timeout: Per-tool-call deadline in seconds (300 s: above the terminal tool's own
            120 s command timeout, so the command's timeout fires first).
        turn_timeout: Deadline for one model call or generation (``None``: none).
        rollout_timeout: Deadline for the whole rollout; on expiry the partial result is
            returned with ``error`` set.
        parallel_tool_calls: Run one turn's calls concurrently (default: in order, like the
            reference).
        tool_call_parser: Phase 2 parser name.
        early_dispatch: Phase 2: start each call the moment it is sealed.
        sampling: Phase 2 sampling parameters; ``temperature`` and ``max_tokens`` override
            theirs.
        split_reasoning: Phase 2: move a leading ``<think>`` block into ``reasoning_content``.

    Raises:
        ValueError: ``max_turns`` < 1, or a timeout that is not positive.
    """

    max_turns: int = 30
    temperature: float = 1.0
    max_tokens: int | None = None
    extra_body: Mapping[str, Any] | None = None
    budget: BudgetConfig | None = None
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT_SECONDS
    turn_timeout: float | None = None
    rollout_timeout: float | None = None
    parallel_tool_calls: bool = False
    tool_call_parser: str = "hermes"
    early_dispatch: bool = True
    sampling: SamplingParams | None = None
    split_reasoning: bool = True

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns!r}")
        _check_timeout("tool_timeout", self.tool_timeout)
        _check_timeout("turn_timeout", self.turn_timeout)
        _check_timeout("rollout_timeout", self.rollout_timeout)


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
    unchanged; everything new is keyword-only with a safe default. :meth:`from_options` builds
    the same loop from an :class:`AgentOptions`.

    Args:
        server: A Phase 1 chat server (``async chat_completion(**kw)``) or a Phase 2 token
            client (``stream(prompt_ids, params)``; needs ``tokenizer``).
        tool_schemas: OpenAI tool schemas offered to the model.
        valid_tool_names: Names the loop will execute (others are "unknown tool").
        max_turns: Maximum model calls.
        task_id: The rollout's id (its sandbox's key); a fresh uuid4 if ``None``. A run may
            override it (``run(messages, task_id=...)``).
        temperature: Sampling temperature.
        max_tokens: Per-turn completion cap (``None``: the server's default).
        extra_body: Extra request fields merged into every model request.
        budget_config: Tool-result budget (:class:`~hermes_async.agent.budget.BudgetConfig`;
            default 100,000 chars per result, 200,000 per turn, 1,500-char previews). Oversized
            results are saved into the rollout's sandbox and replaced by a preview. Anything
            else (the reference accepted any object) means the default.
        limits: Shared limiters (default: a private :class:`Limits`).
        sandboxes: Where tools get the rollout's sandbox (default: the current
            ``SandboxManager`` of the context, see ``use_sandbox_manager``; with none, sandbox
            tools report an error to the model).
        registry: Tool implementations (default: the built-in tools).
        tool_timeout: Per-tool-call deadline in seconds; a call that passes it is cancelled and
            reported to the model as timed out (a ``ToolError``).
        turn_timeout: Deadline for one model call (Phase 1) or one generation (Phase 2).
        rollout_timeout: Deadline for the whole rollout; on expiry the partial result is returned
            with ``error`` set.
        parallel_tool_calls: Run the calls of one turn concurrently (default: one after another,
            in order, like the reference).
        tokenizer: Phase 2: renders prompts and decodes the stream (required with a token
            server).
        tool_call_parser: Phase 2 parser name (and the Phase 1 fallback uses ``hermes``).
        early_dispatch: Phase 2: start each tool call the moment the parser seals it, while
            generation continues (default). ``False`` waits for the end of the completion.
        sampling: Phase 2 sampling parameters; ``temperature`` and ``max_tokens`` above
            override theirs.
        split_reasoning: Move a leading ``<think>...</think>`` block of the completion into
            ``reasoning_content`` (Phase 2).
        release_sandbox: Release the rollout's sandbox when :meth:`run` returns. Default
            ``False``: a reward function usually inspects the sandbox afterwards, and whoever
            owns the manager releases it. On an outer cancellation it is released regardless.

    Raises:
        ValueError: ``max_turns`` < 1, a non-positive timeout, or a token server without a
            tokenizer.
        TypeError: ``server`` is neither kind of server.
    """

    def __init__(
        self,
        server: Any,
        tool_schemas: Sequence[JSONObject],
        valid_tool_names: Collection[str],
        max_turns: int = 30,
        task_id: str | None = None,
        temperature: float = 1.0,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        budget_config: Any = None,
        *,
        limits: Limits | None = None,
        sandboxes: SandboxProvider | None = None,
        registry: ToolRegistry | None = None,
        tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT_SECONDS,
        turn_timeout: float | None = None,
        rollout_timeout: float | None = None,
        parallel_tool_calls: bool = False,
        tokenizer: Tokenizer | None = None,
        tool_call_parser: str = "hermes",
        early_dispatch: bool = True,
        sampling: SamplingParams | None = None,
        split_reasoning: bool = True,
        release_sandbox: bool = False,
    ) -> None:
        options = AgentOptions(
            max_turns=max_turns,
            temperature=temperature,
            max_tokens=max_tokens,
            extra_body=dict(extra_body) if extra_body else None,
            budget=budget_config if isinstance(budget_config, BudgetConfig) else None,
            tool_timeout=tool_timeout,
            turn_timeout=turn_timeout,
            rollout_timeout=rollout_timeout,
            parallel_tool_calls=parallel_tool_calls,
            tool_call_parser=tool_call_parser,
            early_dispatch=early_dispatch,
            sampling=sampling,
            split_reasoning=split_reasoning,
        )
        self.options = options
        self.server = server
        self.tool_schemas: list[JSONObject] = list(tool_schemas)
        self.valid_tool_names: set[str] = set(valid_tool_names)
        self.task_id = task_id or str(uuid.uuid4())
        self.limits = limits or Limits()
        self.sandboxes = sandboxes
        self.registry = registry
        self.tokenizer = tokenizer
        self.release_sandbox = release_sandbox
        self._tools = ToolSettings(
            registry=registry,
            valid_names=frozenset(self.valid_tool_names),
            timeout=options.tool_timeout,
            parallel=options.parallel_tool_calls,
            budget=options.budget or DEFAULT_BUDGET,
        )
        self._turns = self._strategy(server, tokenizer)
        #: The result of the latest run started: consistent after every step, readable after a
        #: cancellation.
        self.partial: AgentResult | None = None

    @classmethod
    def from_options(
        cls,
        server: Any,
        tool_schemas: Sequence[JSONObject],
        valid_tool_names: Collection[str],
        options: AgentOptions,
        *,
        task_id: str | None = None,
        tokenizer: Tokenizer | None = None,
        limits: Limits | None = None,
        sandboxes: SandboxProvider | None = None,
        registry: ToolRegistry | None = None,
        release_sandbox: bool = False,
    ) -> HermesAgentLoop:
        """The loop for ``options`` (the constructor's other arguments as keywords)."""
        return cls(
            server,
            tool_schemas,
            valid_tool_names,
            max_turns=options.max_turns,
            task_id=task_id,
            temperature=options.temperature,
            max_tokens=options.max_tokens,
            extra_body=options.extra_body,
            budget_config=options.budget,
            limits=limits,
            sandboxes=sandboxes,
            registry=registry,
            tool_timeout=options.tool_timeout,
            turn_timeout=options.turn_timeout,
            rollout_timeout=options.rollout_timeout,
            parallel_tool_calls=options.parallel_tool_calls,
            tokenizer=tokenizer,
            tool_call_parser=options.tool_call_parser,
            early_dispatch=options.early_dispatch,
            sampling=options.sampling,
            split_reasoning=options.split_reasoning,
            release_sandbox=release_sandbox,
        )

    def _strategy(self, server: Any, tokenizer: Tokenizer | None) -> _TurnStrategy:
        """Pick the turn strategy for ``server``, once."""
        options = self.options
        if isinstance(server, TokenClient):
            if tokenizer is None:
                raise ValueError(
                    "a token server (Phase 2) needs a tokenizer: pass tokenizer=load_tokenizer(...)"
                )
            base = options.sampling or SamplingParams()
            sampling = replace(
                base,
                temperature=options.temperature,
                max_tokens=options.max_tokens
                if options.max_tokens is not None
                else base.max_tokens,
                stop_token_ids=base.stop_token_ids or (tokenizer.eos_token_id,),
            )
            return TokenTurns(
                server,
                tokenizer=tokenizer,
                tool_schemas=self.tool_schemas,
                max_turns=options.max_turns,
                parser_name=options.tool_call_parser,
                early_dispatch=options.early_dispatch,
                split_reasoning=options.split_reasoning,
                sampling=sampling,
                turn_timeout=options.turn_timeout,
            )
        if isinstance(server, ChatServer):
            return ChatTurns(
                server.chat_completion,
                tool_schemas=self.tool_schemas,
                max_turns=options.max_turns,
                temperature=options.temperature,
                max_tokens=options.max_tokens,
                extra_body=options.extra_body,
                turn_timeout=options.turn_timeout,
            )
        raise TypeError(
            f"server must have `async chat_completion(**kw)` (Phase 1) or be a token client "
            f"with `stream(prompt_ids, params)` (Phase 2); got {type(server).__name__}"
        )

    # The reference's attribute names, read from the options (fixed once built: the turn
    # strategy was configured from them).
    @property
    def max_turns(self) -> int:
        """Maximum model calls."""
        return self.options.max_turns

    @property
    def temperature(self) -> float:
        """Sampling temperature."""
        return self.options.temperature

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

    @property
    def tool_timeout(self) -> float | None:
        """Per-tool-call deadline in seconds."""
        return self.options.tool_timeout

    @property
    def turn_timeout(self) -> float | None:
        """Per-model-call deadline in seconds."""
        return self.options.turn_timeout

    @property
    def rollout_timeout(self) -> float | None:
        """Whole-rollout deadline in seconds."""
        return self.options.rollout_timeout

    @property
    def parallel_tool_calls(self) -> bool:
        """Whether one turn's calls run concurrently."""
        return self.options.parallel_tool_calls

    @property
    def tool_call_parser(self) -> str:
        """The Phase 2 parser name."""
        return self.options.tool_call_parser

    @property
    def early_dispatch(self) -> bool:
        """Whether sealed calls start while generation continues."""
        return self.options.early_dispatch

    @property
    def sampling(self) -> SamplingParams | None:
        """The Phase 2 sampling parameters as given."""
        return self.options.sampling

    @property
    def split_reasoning(self) -> bool:
        """Whether a leading ``<think>`` block becomes ``reasoning_content``."""
        return self.options.split_reasoning

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

        **Cancellation**: an outer cancellation cancels the model request (closing its HTTP
        stream) and any running tool (its process group is killed), releases the rollout's
        sandbox (through the manager, which shields and bounds it) and propagates; the result
        so far stays readable as :attr:`partial`, internally consistent (tokens, masks and
        logprobs aligned; messages of a turn appended only once the turn finished, in Phase 2).
        """
        task_id = task_id or self.task_id
        result = AgentResult(messages=messages)
        self.partial = result
        if sandboxes is None:
            sandboxes = self.sandboxes or current_sandbox_manager()
        runtime = ToolRuntime(
            task_id=task_id,
            limits=self.limits,
            user_task=first_user_content(messages),
            sandboxes=sandboxes,
        )
        tools = RunTools(self._tools, runtime)
        timeout = self.options.rollout_timeout
        if deadline is None:
            deadline = anyio.current_time() + (timeout if timeout is not None else math.inf)
        release = self.release_sandbox
        interrupted = False
        stop = abort if abort is not None else RunAbort()
        try:
            with anyio.move_on_at(deadline) as deadline_scope, anyio.CancelScope() as abort_scope:
                stop._bind(abort_scope)
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
        if abort_scope.cancelled_caught:
            ended = stop.failure
        elif deadline_scope.cancelled_caught:
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
