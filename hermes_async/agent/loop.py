"""HermesAgentLoop: the multi-turn tool-calling agent loop.

Why one module of this size: one concept, the turn loop of one rollout; the options, the abort
handle and the per-run state are read by every turn strategy, and the reference's attribute
names are views over them.

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
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, overload, runtime_checkable

import anyio

from hermes_async._otel import span
from hermes_async.agent._chat_turn import ChatTurns
from hermes_async.agent._reasoning import (
    TemplateKwargsTokenizer,
    check_reasoning,
    reasoning_request_fields,
    thinking_template_kwargs,
)
from hermes_async.agent._sampling import SamplingHook, end_of_turn_ids, resolve_sampling
from hermes_async.agent._token_turn import TokenTurns
from hermes_async.agent._tool_runner import RunTools, ToolSettings
from hermes_async.agent._transcript import first_user_content
from hermes_async.agent._watch import WatchedSandboxes
from hermes_async.agent.budget import DEFAULT_BUDGET, BudgetConfig
from hermes_async.agent.failures import RolloutFailure, worst_failure
from hermes_async.agent.result import AgentResult
from hermes_async.agent.versions import PauseProbe, VersionSource
from hermes_async.errors import ConfigError
from hermes_async.inference.generate import SamplingParams, TokenClient
from hermes_async.inference.pool import pool_session
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tools.registry import ToolRegistry, ToolRuntime
from hermes_async.tools.sandbox.base import SandboxProvider
from hermes_async.tools.sandbox.manager import (
    SandboxManager,
    current_sandbox_manager,
    use_sandbox_manager,
)
from hermes_async.tools.standalone import standalone_factory

__all__ = (
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "AgentOptions",
    "ChatServer",
    "HermesAgentLoop",
    "RunAbort",
    "resize_tool_pool",
)

logger = logging.getLogger(__name__)

#: The agent's name in telemetry (``gen_ai.agent.name``; spans ``invoke_agent hermes-agent``).
AGENT_NAME = "hermes-agent"

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

    Precedence (Phase 2): **a value given explicitly always wins over a default.** The loop's
    ``temperature`` / ``max_tokens`` override ``sampling``'s only when given (``None`` means not
    given: ``sampling=SamplingParams(temperature=0.3)`` samples at 0.3); ``extra_body`` merges
    into ``sampling.extra`` (the same key with two values is an error); a per-run ``seed`` beats
    ``sampling.seed``; a ``sampling_hook`` result is that turn's parameters. Details:
    :mod:`hermes_async.agent._sampling`.

    Attributes:
        max_turns: Maximum model calls per rollout.
        temperature: Sampling temperature; ``None``: not given (Phase 1 sends 1.0, on-policy
            sampling; Phase 2 uses ``sampling.temperature``, itself 1.0 by default).
        max_tokens: Per-turn completion cap (``None``: the server's default).
        extra_body: Extra request fields: merged into every chat request (Phase 1), and into
            the token requests' extras (Phase 2: checked against the server kind when the loop
            is built, e.g. ``{"structured_outputs": {"regex": ...}}``).
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
        split_reasoning: Phase 2: move a leading ``<think>`` block into ``reasoning_content``
            (``False`` keeps it in ``content``: the environment's ``preserve_think_blocks``).
        terminal_timeout: Default command timeout of the ``terminal`` tool in seconds
            (``None``: the run's ``use_tool_defaults``, else ``TERMINAL_TIMEOUT``, else 180 s);
            an explicit ``timeout`` wins.
        skills_dir: Where the ``skills`` tools read (``None``: ``~/.hermes/skills``, else the
            built-in examples).
        thinking_mode: Ask the model to reason (atroposlib's ``thinking_mode``).
        reasoning_effort: ``none``, ``minimal``, ``low``, ``medium``, ``high`` or ``xhigh``.
        max_reasoning_tokens: A reasoning token budget (Phase 1 only). See
            :mod:`hermes_async.agent._reasoning` for how the three reach each kind of server.
        sampling: Phase 2 sampling parameters (see the precedence above).
        split_reasoning: Phase 2: move a leading ``<think>`` block into ``reasoning_content``.
        sampling_hook: Phase 2: ``hook(turn, messages, params) -> SamplingParams | None``,
            called before each generation; a result replaces that turn's parameters (e.g. a
            different ``structured_outputs`` regex per turn).
        end_of_turn: Phase 2: the tokens (ids or texts) that end a model turn; ``None``: the
            tokenizer's (its ``end_of_turn_ids``, else ``eos_token_id``). They are the default
            stop ids and decide where the template's suffix starts.
        max_resumes: Phase 2: how many times one turn's generation may be resumed after the
            server aborted it (``finish_reason="abort"``, or a stream cut while
            ``pause_probe`` says paused); the prefix is kept and the next request asks for the
            remaining budget only. 8: a trainer aborts once per weight update, and a turn
            spanning eight updates is better re-run than kept. ``0``: an abort fails the
            rollout (``infra``).
        version_source: Phase 2: the trainer's policy version (``() -> int``, sync or async;
            :class:`~hermes_async.agent.versions.PolledVersion` for HTTP), read once per
            request at dispatch; every completion segment carries it
            (``managed_state["segments"]``), and ``run_group``'s ``staleness`` measures ages
            with it.
        pause_probe: Phase 2: ``() -> bool`` (sync or async): is the model server paused? With
            it, a resume waits until the server is back, and a stream that breaks while it is
            paused is resumed instead of failing. ``None``: resumes are sent at once (a paused
            vLLM holds them until it resumes).
        pause_timeout: Longest wait for a paused server, per pause (600 s: a weight update
            takes seconds to minutes; a server paused for ten minutes is stuck). The
            rollout's deadline bounds it too.
        incremental_rendering: Phase 2: render only each turn's new messages where the chat
            template is known to allow it (:mod:`hermes_async.inference.rendering`); ``False``
            renders the whole conversation every turn. Same text, same tokens; only the CPU
            differs.

    Raises:
        ValueError: ``max_turns`` < 1, a timeout that is not positive, an unknown
            ``reasoning_effort`` or a non-positive ``max_reasoning_tokens``.
    """

    max_turns: int = 30
    temperature: float | None = None
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
    terminal_timeout: float | None = None
    skills_dir: str | None = None
    thinking_mode: bool = False
    reasoning_effort: str | None = None
    max_reasoning_tokens: int | None = None
    # ---- Phase 2 fidelity (issue 22): per-turn sampling and the end-of-turn tokens
    sampling_hook: SamplingHook | None = None
    end_of_turn: tuple[int | str, ...] | None = None
    # ---- asynchronous RL (issue 20): resumed aborts, policy versions, paused servers
    max_resumes: int = 8
    version_source: VersionSource | None = None
    pause_probe: PauseProbe | None = None
    pause_timeout: float | None = 600.0
    incremental_rendering: bool = True

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_resumes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns!r}")
        if self.max_resumes < 0:
            raise ValueError(f"max_resumes must be >= 0, got {self.max_resumes!r}")
        for name in ("temperature", "max_tokens"):  # None: not given
            if (value := getattr(self, name)) is not None:
                SamplingParams.check(name, value, owner="AgentOptions")
        _check_timeout("pause_timeout", self.pause_timeout)
        _check_timeout("tool_timeout", self.tool_timeout)
        _check_timeout("turn_timeout", self.turn_timeout)
        _check_timeout("rollout_timeout", self.rollout_timeout)
        _check_timeout("terminal_timeout", self.terminal_timeout)
        check_reasoning(self.reasoning_effort, self.max_reasoning_tokens)


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


_T = TypeVar("_T")


class _Option(Generic[_T]):
    """A read-only loop attribute under the reference's name, read from the loop's options."""

    def __init__(self, field: str | None = None) -> None:
        self._field = field

    def __set_name__(self, owner: type, name: str) -> None:
        self._field = self._field or name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _Option[_T]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> _T: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> _T | _Option[_T]:
        if obj is None:
            return self
        value: _T = getattr(obj.options, self._field or "")  # type: ignore[attr-defined]
        return value

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(
            f"{self._field} is fixed once the loop is built (its turn strategy was configured "
            "from it): build another HermesAgentLoop, or pass AgentOptions"
        )


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
        temperature: Sampling temperature; ``None``: not given (1.0 for chat servers;
            ``sampling``'s for token servers; see :class:`AgentOptions` for the precedence).
        max_tokens: Per-turn completion cap (``None``: the server's default).
        extra_body: Extra request fields merged into every model request (Phase 2: checked
            against the token server's accepted extras when the loop is built).
        budget_config: Tool-result budget (:class:`~hermes_async.agent.budget.BudgetConfig`;
            default 100,000 chars per result, 200,000 per turn, 1,500-char previews). Oversized
            results are saved into the rollout's sandbox and replaced by a preview. Anything
            else (the reference accepted any object) means the default.
        limits: Shared limiters (default: a private :class:`Limits`).
        sandboxes: Where tools get the rollout's sandbox (default: the current
            ``SandboxManager`` of the context, see ``use_sandbox_manager``). With none --
            reference-style code outside an environment -- each :meth:`run` opens a private
            manager on the configured backend (``TERMINAL_ENV``, default ``local``) and
            **the run owns the sandbox**: it is released when ``run`` returns. To verify in the
            same sandbox afterwards, open a manager around both (``async with
            open_sandbox_manager(): ...``; ``ToolContext(task_id)`` inside finds it).
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
        sampling: Phase 2 sampling parameters; ``temperature``, ``max_tokens`` and
            ``extra_body`` above override or extend them when given.
        split_reasoning: Move a leading ``<think>...</think>`` block of the completion into
            ``reasoning_content`` (Phase 2).
        terminal_timeout: Default command timeout of ``terminal`` calls (seconds).
        skills_dir: Directory of the ``skills`` tools.
        thinking_mode: Ask the model to reason (see :class:`AgentOptions`).
        reasoning_effort: Reasoning effort (see :class:`AgentOptions`).
        max_reasoning_tokens: Reasoning token budget (Phase 1; see :class:`AgentOptions`).
        release_sandbox: Release the rollout's sandbox when :meth:`run` returns. Default
            ``False``: a reward function usually inspects the sandbox afterwards, and whoever
            owns the manager releases it. On an outer cancellation it is released regardless.
        sampling_hook: Phase 2 per-turn sampling (see :class:`AgentOptions`).
        end_of_turn: Phase 2 end-of-turn tokens (see :class:`AgentOptions`).
        incremental_rendering: Phase 2 incremental chat-template rendering (see
            :class:`AgentOptions`).

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
        temperature: float | None = None,
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
        terminal_timeout: float | None = None,
        skills_dir: str | None = None,
        thinking_mode: bool = False,
        reasoning_effort: str | None = None,
        max_reasoning_tokens: int | None = None,
        sampling_hook: SamplingHook | None = None,
        end_of_turn: Sequence[int | str] | None = None,
        incremental_rendering: bool = True,
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
            terminal_timeout=terminal_timeout,
            skills_dir=skills_dir,
            thinking_mode=thinking_mode,
            reasoning_effort=reasoning_effort,
            max_reasoning_tokens=max_reasoning_tokens,
            sampling_hook=sampling_hook,
            end_of_turn=tuple(end_of_turn) if end_of_turn is not None else None,
            incremental_rendering=incremental_rendering,
        )
        self._configure(
            server,
            tool_schemas,
            valid_tool_names,
            options,
            task_id=task_id,
            tokenizer=tokenizer,
            limits=limits,
            sandboxes=sandboxes,
            registry=registry,
            release_sandbox=release_sandbox,
        )

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
        loop = cls.__new__(cls)
        loop._configure(
            server,
            tool_schemas,
            valid_tool_names,
            options,
            task_id=task_id,
            tokenizer=tokenizer,
            limits=limits,
            sandboxes=sandboxes,
            registry=registry,
            release_sandbox=release_sandbox,
        )
        return loop

    def _configure(
        self,
        server: Any,
        tool_schemas: Sequence[JSONObject],
        valid_tool_names: Collection[str],
        options: AgentOptions,
        *,
        task_id: str | None,
        tokenizer: Tokenizer | None,
        limits: Limits | None,
        sandboxes: SandboxProvider | None,
        registry: ToolRegistry | None,
        release_sandbox: bool,
    ) -> None:
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

    def _strategy(self, server: Any, tokenizer: Tokenizer | None) -> _TurnStrategy:
        """Pick the turn strategy for ``server``, once."""
        options = self.options
        if isinstance(server, TokenClient):
            if tokenizer is None:
                raise ValueError(
                    "a token server (Phase 2) needs a tokenizer: pass tokenizer=load_tokenizer(...)"
                )
            switch = thinking_template_kwargs(
                options.thinking_mode, options.reasoning_effort, options.max_reasoning_tokens
            )
            if switch:
                tokenizer = TemplateKwargsTokenizer(tokenizer, switch)
            # The precedence rule and the extras check live in agent/_sampling.py.
            end_of_turn = end_of_turn_ids(tokenizer, options.end_of_turn)
            sampling = resolve_sampling(
                options.sampling,
                temperature=options.temperature,
                max_tokens=options.max_tokens,
                extra_body=options.extra_body,
                stop_ids=end_of_turn,
            )
            check = getattr(server, "check_sampling", None)
            if callable(check):
                check(sampling)  # a key the server does not accept fails here, not silently
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
                end_of_turn=end_of_turn,
                sampling_hook=options.sampling_hook,
                check_sampling=check if callable(check) else None,
                max_resumes=options.max_resumes,
                version_source=options.version_source,
                pause_probe=options.pause_probe,
                pause_timeout=options.pause_timeout,
                incremental_rendering=options.incremental_rendering,
            )
        if isinstance(server, ChatServer):
            return ChatTurns(
                server.chat_completion,
                tool_schemas=self.tool_schemas,
                max_turns=options.max_turns,
                temperature=options.temperature if options.temperature is not None else 1.0,
                max_tokens=options.max_tokens,
                extra_body=options.extra_body,
                turn_timeout=options.turn_timeout,
                reasoning=reasoning_request_fields(
                    options.thinking_mode,
                    options.reasoning_effort,
                    options.max_reasoning_tokens,
                    base_url=_base_url(server),
                ),
            )
        raise TypeError(
            f"server must have `async chat_completion(**kw)` (Phase 1) or be a token client "
            f"with `stream(prompt_ids, params)` (Phase 2); got {type(server).__name__}"
        )

    # The reference's attribute names, read from the options (fixed once built: the turn
    # strategy was configured from them).
    max_turns: _Option[int] = _Option()
    """Maximum model calls."""

    @property
    def temperature(self) -> float:
        """The sampling temperature in effect (given, else ``sampling``'s, else 1.0)."""
        if self.options.temperature is not None:
            return self.options.temperature
        if self.options.sampling is not None and isinstance(self.server, TokenClient):
            return self.options.sampling.temperature
        return 1.0

    max_tokens: _Option[int | None] = _Option()
    """Per-turn completion cap."""

    @property
    def extra_body(self) -> dict[str, Any] | None:
        """Extra request fields (a copy)."""
        return dict(self.options.extra_body) if self.options.extra_body else None

    budget_config: _Option[BudgetConfig | None] = _Option("budget")
    """The tool-result budget (``None``: the default)."""

    tool_timeout: _Option[float | None] = _Option()
    """Per-tool-call deadline in seconds."""

    turn_timeout: _Option[float | None] = _Option()
    """Per-model-call deadline in seconds."""

    rollout_timeout: _Option[float | None] = _Option()
    """Whole-rollout deadline in seconds."""

    parallel_tool_calls: _Option[bool] = _Option()
    """Whether one turn's calls run concurrently."""

    tool_call_parser: _Option[str] = _Option()
    """The Phase 2 parser name."""

    early_dispatch: _Option[bool] = _Option()
    """Whether sealed calls start while generation continues."""

    sampling: _Option[SamplingParams | None] = _Option()
    """The Phase 2 sampling parameters as given."""

    split_reasoning: _Option[bool] = _Option()
    """Whether a leading ``<think>`` block becomes ``reasoning_content``."""

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
            "gen_ai.agent.name": AGENT_NAME,
            "hermes_async.task_id": task_id,
        }
        # One invoke_agent span per run, whoever started it (a rollout's span is its parent).
        with span(f"invoke_agent {AGENT_NAME}", attributes) as traced:
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


def _base_url(server: Any) -> str | None:
    """The server's base URL, when it tells (our clients, atroposlib's server configs)."""
    for candidate in (server, getattr(server, "connection", None), getattr(server, "config", None)):
        url = getattr(candidate, "base_url", None)
        if isinstance(url, str):
            return url
    return None


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
