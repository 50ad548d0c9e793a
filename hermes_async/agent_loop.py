"""HermesAgentLoop: the multi-turn tool-calling agent loop, and its result types.

One :class:`HermesAgentLoop` runs one rollout: ask the model, run the tool calls it makes, append
the results, repeat until the model answers without tools or ``max_turns`` is reached.

Two kinds of model server:

* **Phase 1** — anything with ``async chat_completion(**kwargs)`` returning an OpenAI-shaped
  response (our :class:`~hermes_async.inference.chat.ChatClient`, an atroposlib
  ``ServerManager``, ...). Structured ``tool_calls`` are used; when there are none but the content
  holds ``<tool_call>`` text, the configured parser recovers the calls (the reference's fallback).
* **Phase 2** — a token server (our ``hermes_async.inference.generate`` clients) plus a
  tokenizer: the prompt is rendered with the chat template, completion tokens stream in, the
  parser sees them as they arrive, and each tool call is **dispatched the moment it is sealed**,
  while generation continues. The token sequence is kept exactly (prompt + sampled ids + rendered
  suffixes; never re-tokenized) and handed out as ``managed_state``.

What is returned and what is raised: every failure the *model* causes (unknown tool, invalid
JSON, bad argument types, a tool timeout, a call cut off by ``max_tokens``) is a model-visible
message plus a :class:`ToolError`; a model-server failure (after the client's retries) ends the
rollout with ``finished_naturally=False`` and ``error`` set. Only cancellation propagates.

``AgentResult`` and ``ToolError`` keep the reference's field names, types and defaults; added
fields are additive and default to empty values.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import anyio
from anyio.abc import TaskGroup

from hermes_async._loop_tools import PendingCall, TurnToolRunner
from hermes_async._phase2 import Phase2Turn, split_think
from hermes_async.budget import (
    DEFAULT_BUDGET,
    BudgetConfig,
    enforce_turn_budget,
    maybe_persist_tool_result,
)
from hermes_async.errors import InferenceError
from hermes_async.inference.generate import SamplingParams, TokenClient
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.inference.trajectory import Trajectory
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tools.registry import ToolRegistry, ToolRuntime, builtin_registry
from hermes_async.tools.sandbox.base import Sandbox, SandboxProvider
from hermes_async.tools.sandbox.manager import current_sandbox_manager

__all__ = ["AgentResult", "ChatServer", "HermesAgentLoop", "ToolError"]

logger = logging.getLogger(__name__)

#: The reference truncates the raw argument string kept on a ToolError to this many characters.
TOOL_ERROR_ARGUMENTS_MAX_CHARS = 200
#: ... and the tool result kept on a ToolError to this many.
TOOL_ERROR_RESULT_MAX_CHARS = 500
#: The first user message is passed to tools as task context, capped like the reference.
USER_TASK_MAX_CHARS = 500
#: Default per-tool-call deadline. The reference had none (a hung tool blocked the rollout
#: forever); 300 s is the reference ToolContext's own wait and above the terminal tool's 120 s
#: default command timeout, so a command's own timeout always fires first.
DEFAULT_TOOL_TIMEOUT_SECONDS = 300.0
#: Deadline of the shielded sandbox release on cancellation (the manager bounds its own close
#: too; this is the outer bound, above the manager's default close timeout).
SANDBOX_RELEASE_GRACE_SECONDS = 60.0


@dataclass(slots=True)
class ToolError:
    """One tool call that failed, as recorded on :class:`AgentResult`.

    Attributes:
        turn: 1-based turn number on which the call was made.
        tool_name: The tool the model called (as the model spelled it).
        arguments: The raw argument string, truncated to 200 characters.
        error: A short description of what went wrong.
        tool_result: The exact string the model was shown for this call.
    """

    turn: int
    tool_name: str
    arguments: str
    error: str
    tool_result: str

    def __post_init__(self) -> None:
        if len(self.arguments) > TOOL_ERROR_ARGUMENTS_MAX_CHARS:
            self.arguments = self.arguments[:TOOL_ERROR_ARGUMENTS_MAX_CHARS]


@dataclass(slots=True)
class AgentResult:
    """What one rollout of the agent loop produced.

    ``messages`` is the very list passed to :meth:`HermesAgentLoop.run` (mutated in place), as in
    the reference. There is no ``final_response`` field: verifiers scan ``messages``.

    Attributes:
        messages: Full OpenAI-format history.
        managed_state: Phase 2 token state, ``{"nodes": [node]}`` where the node has ``tokens``,
            ``masked_tokens`` and ``logprobs`` aligned one to one; ``None`` in Phase 1.
        turns_used: Number of model calls made, including a failed one.
        finished_naturally: True iff the model ended with a turn that has no tool calls.
        reasoning_per_turn: One entry per successful model response (``None`` if it had none).
        tool_errors: Errors collected during the loop.
        error: Why the loop stopped early (model server failure, deadline), if it did.
        template_mismatches: Phase 2: turns where the decoded trajectory differed from the chat
            template's rendering of the messages; reported, never hidden.
        timings: One record per turn: ``turn``, ``time_to_first_token``, ``generation_seconds``,
            ``tool_seconds``, ``model_wait_seconds`` and ``tool:<index>:<name>`` durations.
    """

    messages: list[dict[str, Any]]
    managed_state: dict[str, Any] | None = None
    turns_used: int = 0
    finished_naturally: bool = False
    reasoning_per_turn: list[str | None] = field(default_factory=list)
    tool_errors: list[ToolError] = field(default_factory=list)
    error: str | None = None
    template_mismatches: int = 0
    timings: list[dict[str, float]] = field(default_factory=list)


@runtime_checkable
class ChatServer(Protocol):
    """A Phase 1 model server: OpenAI-style chat completions."""

    async def chat_completion(self, **kwargs: Any) -> Any:
        """Return an OpenAI ``ChatCompletion``-shaped object."""
        ...


# --------------------------------------------------------------------------------------------
# Helpers on OpenAI-shaped objects (attribute or dict access, as servers differ)


def _get(obj: object, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def extract_reasoning(message: object) -> str | None:
    """The reasoning text of a Phase 1 message, as the reference looked for it.

    First non-empty of ``reasoning_content``, ``reasoning``, then the ``text`` of the first
    ``reasoning_details`` entry that has one.
    """
    for attr in ("reasoning_content", "reasoning"):
        value = _get(message, attr)
        if isinstance(value, str) and value.strip():
            return value
    details = _get(message, "reasoning_details")
    if isinstance(details, Sequence) and not isinstance(details, str):
        for item in details:
            text = _get(item, "text")
            if isinstance(text, str) and text.strip():
                return text
    return None


@dataclass(frozen=True, slots=True)
class _Call:
    call_id: str
    name: str
    arguments: str


def _normalize_tool_calls(raw_calls: Sequence[object]) -> list[_Call]:
    """Turn object- or dict-shaped tool calls into (id, name, arguments string)."""
    calls: list[_Call] = []
    for raw in raw_calls:
        function = _get(raw, "function")
        name = _get(function, "name") if function is not None else _get(raw, "name")
        args = _get(function, "arguments") if function is not None else _get(raw, "arguments")
        if args is None:
            args_text = "{}"
        elif isinstance(args, str):
            args_text = args
        else:
            args_text = json.dumps(args, ensure_ascii=False)
        call_id = _get(raw, "id") or f"call_{uuid.uuid4().hex[:8]}"
        calls.append(_Call(str(call_id), str(name or ""), args_text))
    return calls


def _assistant_message(
    content: str | None, calls: Sequence[_Call], reasoning: str | None
) -> JSONObject:
    message: JSONObject = {"role": "assistant", "content": content or ""}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in calls
        ]
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def _first_user_content(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for message in messages:
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"]).strip()[:USER_TASK_MAX_CHARS]
    return None


# --------------------------------------------------------------------------------------------


class HermesAgentLoop:
    """Run one multi-turn tool-calling rollout.

    The positional arguments are the reference's, so code written for it constructs the loop
    unchanged; everything new is keyword-only with a safe default.

    Args:
        server: A Phase 1 chat server (``async chat_completion(**kw)``).
        tool_schemas: OpenAI tool schemas offered to the model.
        valid_tool_names: Names the loop will execute (others are "unknown tool").
        max_turns: Maximum model calls.
        task_id: The rollout's id (its sandbox's key); a fresh uuid4 if ``None``.
        temperature: Sampling temperature.
        max_tokens: Per-turn completion cap (``None``: the server's default).
        extra_body: Extra request fields merged into every model request.
        budget_config: Tool-result budget (:class:`~hermes_async.budget.BudgetConfig`; default
            100,000 chars per result, 200,000 per turn, 1,500-char previews). Oversized results
            are saved into the rollout's sandbox and replaced by a preview.
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
    """

    def __init__(
        self,
        server: Any,
        tool_schemas: Sequence[JSONObject],
        valid_tool_names: set[str] | Sequence[str],
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
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns!r}")
        self.server = server
        self.tool_schemas = list(tool_schemas)
        self.valid_tool_names = set(valid_tool_names)
        self.max_turns = max_turns
        self.task_id = task_id or str(uuid.uuid4())
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body) if extra_body else None
        self.budget_config = budget_config
        self.limits = limits or Limits()
        self.sandboxes = sandboxes
        self.registry = registry
        self.tool_timeout = tool_timeout
        self.turn_timeout = turn_timeout
        self.rollout_timeout = rollout_timeout
        self.parallel_tool_calls = parallel_tool_calls
        self.tokenizer = tokenizer
        self.tool_call_parser = tool_call_parser
        self.early_dispatch = early_dispatch
        self.sampling = sampling
        self.split_reasoning = split_reasoning
        self.release_sandbox = release_sandbox
        if isinstance(server, TokenClient) and tokenizer is None:
            raise ValueError(
                "a token server (Phase 2) needs a tokenizer: pass tokenizer=load_tokenizer(...)"
            )
        if not isinstance(server, TokenClient) and not isinstance(server, ChatServer):
            raise TypeError(
                f"server must have `async chat_completion(**kw)` (Phase 1) or be a token client "
                f"with `stream(prompt_ids, params)` (Phase 2); got {type(server).__name__}"
            )
        #: The result so far; consistent after every step, readable after a cancellation.
        self.partial: AgentResult | None = None
        # The turn whose tools are running: its assistant message and call records, so a
        # deadline or cancellation can still close it consistently.
        self._inflight: tuple[JSONObject, list[PendingCall]] | None = None

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        """Run the rollout on ``messages`` (mutated in place) and return the result.

        Returns:
            The :class:`AgentResult`. A model-server failure or the rollout deadline ends the
            loop early with ``finished_naturally=False`` and ``error`` set; the messages so far
            are kept.

        **Cancellation**: an outer cancellation cancels the model request (closing its HTTP
        stream) and any running tool (its process group is killed), releases the rollout's
        sandbox (shielded, bounded) and propagates; the result so far stays readable as
        :attr:`partial`, internally consistent (tokens, masks and logprobs aligned; messages of
        a turn appended only once the turn finished, in Phase 2).
        """
        result = AgentResult(messages=messages)
        self.partial = result
        runtime = ToolRuntime(
            task_id=self.task_id,
            limits=self.limits,
            user_task=_first_user_content(messages),
            sandboxes=self.sandboxes or current_sandbox_manager(),
        )
        try:
            with anyio.move_on_after(
                self.rollout_timeout if self.rollout_timeout is not None else float("inf")
            ) as deadline:
                if isinstance(self.server, TokenClient):
                    await self._run_phase2(result, runtime)
                else:
                    await self._run_phase1(result, runtime)
        except anyio.get_cancelled_exc_class():
            self._close_inflight(result, "the rollout was cancelled")
            # Nobody will compute a reward on this rollout: free its sandbox now.
            await self._release_sandbox(runtime)
            raise
        finally:
            if self.release_sandbox:
                await self._release_sandbox(runtime)
        if deadline.cancelled_caught:
            result.finished_naturally = False
            result.error = f"rollout deadline of {self.rollout_timeout:g} s exceeded"
            self._close_inflight(result, result.error)
        return result

    def _close_inflight(self, result: AgentResult, reason: str) -> None:
        """Append the interrupted turn: its assistant message and one result per call.

        Calls that finished keep their results; the others get ``{"error": ...}`` naming why
        they were cut short. Synchronous, so it runs even while cancellation propagates.
        """
        if self._inflight is None:
            return
        assistant, calls = self._inflight
        self._inflight = None
        result.messages.append(assistant)
        for call in calls:
            content = (
                call.outcome.content
                if call.outcome is not None
                else json.dumps({"error": f"Tool call not completed: {reason}"})
            )
            result.messages.append(
                {"role": "tool", "tool_call_id": call.call_id, "content": content}
            )

    async def _release_sandbox(self, runtime: ToolRuntime) -> None:
        """Release the rollout's sandbox: shielded, bounded, never raising."""
        if runtime.sandboxes is None:
            return
        with anyio.move_on_after(SANDBOX_RELEASE_GRACE_SECONDS, shield=True) as scope:
            try:
                await runtime.sandboxes.release(self.task_id)
            except Exception as exc:  # cleanup must not mask the rollout's own outcome
                logger.warning("task %s: sandbox release failed: %s", self.task_id, exc)
        if scope.cancelled_caught:
            logger.warning(
                "task %s: sandbox release did not finish within %g s",
                self.task_id,
                SANDBOX_RELEASE_GRACE_SECONDS,
            )

    # ---------------------------------------------------------------- Phase 1

    def _request_kwargs(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "messages": messages,
            "n": 1,
            "temperature": self.temperature,
        }
        if self.tool_schemas:
            kwargs["tools"] = self.tool_schemas
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    async def _run_phase1(self, result: AgentResult, runtime: ToolRuntime) -> None:
        messages = result.messages
        for turn in range(self.max_turns):
            timing: dict[str, float] = {"turn": float(turn + 1)}
            result.timings.append(timing)
            result.turns_used = turn + 1
            start = anyio.current_time()
            try:
                with anyio.fail_after(
                    self.turn_timeout if self.turn_timeout is not None else float("inf")
                ):
                    response = await self.server.chat_completion(**self._request_kwargs(messages))
            except TimeoutError:
                result.error = f"model call timed out after {self.turn_timeout:g} s"
                return
            except Exception as exc:
                logger.warning("task %s: model call failed: %s", self.task_id, exc)
                result.error = f"model call failed: {type(exc).__name__}: {exc}"
                return
            timing["generation_seconds"] = anyio.current_time() - start
            choices = _get(response, "choices") if response is not None else None
            if not choices:
                result.error = "model returned no choices"
                return
            message = _get(choices[0], "message")
            reasoning = extract_reasoning(message)
            result.reasoning_per_turn.append(reasoning)
            content = _get(message, "content")
            raw_calls = _get(message, "tool_calls") or []
            calls = _normalize_tool_calls(raw_calls)
            if not calls and self.tool_schemas and isinstance(content, str):
                content, calls = self._fallback_parse(content)
            if not calls:
                messages.append(_assistant_message(content, (), reasoning))
                result.finished_naturally = True
                return
            assistant = _assistant_message(content, calls, reasoning)
            await self._run_tools(result, runtime, turn + 1, calls, timing, assistant)

    def _fallback_parse(self, content: str) -> tuple[str | None, list[_Call]]:
        """Recover ``<tool_call>`` blocks from Phase 1 content (the reference's fallback)."""
        if "<tool_call>" not in content:
            return content, []
        try:
            from hermes_async.parsers import get_parser

            parsed = get_parser("hermes", tools=self.tool_schemas).parse(content)
        except Exception:  # a parser bug must not end the rollout; the text stays content
            logger.warning("task %s: fallback tool-call parse failed", self.task_id, exc_info=True)
            return content, []
        if not parsed.tool_calls:
            return content, []
        return parsed.content, _normalize_tool_calls(parsed.tool_calls)

    # ---------------------------------------------------------------- Phase 2

    def _sampling(self) -> SamplingParams:
        base = self.sampling or SamplingParams()
        assert self.tokenizer is not None
        stop_ids = base.stop_token_ids or (self.tokenizer.eos_token_id,)
        return replace(
            base,
            temperature=self.temperature,
            max_tokens=self.max_tokens if self.max_tokens is not None else base.max_tokens,
            stop_token_ids=stop_ids,
        )

    async def _run_phase2(self, result: AgentResult, runtime: ToolRuntime) -> None:
        tokenizer = self.tokenizer
        assert tokenizer is not None
        messages = result.messages
        tools = self.tool_schemas or None
        prompt_text = tokenizer.apply_chat_template(messages, tools, add_generation_prompt=True)
        trajectory = Trajectory(tokenizer.encode(prompt_text))
        try:
            await self._phase2_turns(result, runtime, tokenizer, trajectory)
        finally:
            # Built once, on every exit path (cancellation included): keeping three Python lists
            # per rollout up to date every turn would cost memory while thousands wait on tools.
            result.managed_state = trajectory.managed_state()

    async def _phase2_turns(
        self,
        result: AgentResult,
        runtime: ToolRuntime,
        tokenizer: Tokenizer,
        trajectory: Trajectory,
    ) -> None:
        messages = result.messages
        sampling = self._sampling()
        for turn in range(self.max_turns):
            timing: dict[str, float] = {"turn": float(turn + 1)}
            result.timings.append(timing)
            result.turns_used = turn + 1
            step = Phase2Turn(
                tokenizer=tokenizer,
                parser_name=self.tool_call_parser,
                tool_schemas=self.tool_schemas,
                early_dispatch=self.early_dispatch,
            )
            start = anyio.current_time()
            failure: str | None = None
            # Stream errors are caught inside the task group's body (an exception escaping the
            # body would arrive wrapped in an ExceptionGroup); tools already started by early
            # dispatch are then cancelled with the turn.
            async with anyio.create_task_group() as tg:
                runner = self._runner(tg, runtime)
                try:
                    with anyio.fail_after(
                        self.turn_timeout if self.turn_timeout is not None else float("inf")
                    ):
                        async with self.server.stream(trajectory.tokens, sampling) as deltas:
                            async for delta in deltas:
                                step.feed(delta, runner, anyio.current_time() - start)
                    step.finish(runner)
                except TimeoutError:
                    failure = f"generation timed out after {self.turn_timeout:g} s"
                    tg.cancel_scope.cancel()
                except InferenceError as exc:
                    logger.warning("task %s: generation failed: %s", self.task_id, exc)
                    failure = f"model call failed: {type(exc).__name__}: {exc}"
                    tg.cancel_scope.cancel()
                timing["generation_seconds"] = anyio.current_time() - start
            if step.ttft is not None:
                timing["time_to_first_token"] = step.ttft
            if failure is not None:
                result.error = failure
                return
            timing["tool_seconds"] = anyio.current_time() - start - timing["generation_seconds"]
            trajectory.add_completion(step.token_ids, step.logprobs)
            content, reasoning = step.content, None
            if self.split_reasoning:
                content, reasoning = split_think(content)
            result.reasoning_per_turn.append(reasoning)
            calls = [_Call(c.call_id, c.name, c.arguments) for c in runner.calls]
            assistant = _assistant_message(content, calls, reasoning)
            self._inflight = (assistant, runner.calls)
            await self._record_tools(result, runtime, turn + 1, runner.calls, timing, assistant)
            if not runner.calls:
                result.finished_naturally = True
                rendered = tokenizer.apply_chat_template(
                    messages, self.tool_schemas or None, add_generation_prompt=False
                )
                self._check_template(result, trajectory, tokenizer, rendered, final=True)
                return
            ended_on_eos = bool(step.token_ids) and step.token_ids[-1] == tokenizer.eos_token_id
            suffix, rendered = self._suffix_ids(messages, tokenizer, ended_on_eos)
            trajectory.add_suffix(suffix)
            self._check_template(result, trajectory, tokenizer, rendered, final=False)

    def _suffix_ids(
        self, messages: list[dict[str, Any]], tokenizer: Tokenizer, ended_on_eos: bool
    ) -> tuple[list[int], str]:
        """Ids between the sampled completion and the next generation, and the full rendering.

        The template renders an assistant turn as ``...<|im_end|>`` + separator; what follows
        the assistant's end-of-turn token in the full rendering (tool responses, the next
        generation prompt) is the suffix. If the model did not stop on the end-of-turn token
        (length), the loop adds it, masked.
        """
        tools = self.tool_schemas or None
        last_assistant = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
        before = tokenizer.apply_chat_template(
            messages[: last_assistant + 1], tools, add_generation_prompt=False
        )
        full = tokenizer.apply_chat_template(messages, tools, add_generation_prompt=True)
        eos_text = tokenizer.decode([tokenizer.eos_token_id])
        cut = before.rfind(eos_text) + len(eos_text)
        prefix = [] if ended_on_eos else [tokenizer.eos_token_id]
        return prefix + tokenizer.encode(full[cut:]), full

    def _check_template(
        self,
        result: AgentResult,
        trajectory: Trajectory,
        tokenizer: Tokenizer,
        rendered: str,
        *,
        final: bool,
    ) -> None:
        """Count a mismatch between the decoded tokens and the template's ``rendered`` text."""
        decoded = tokenizer.decode(trajectory.tokens)
        # After the final turn the template's separator following <|im_end|> (whitespace) was
        # never sampled: only that may remain of the rendering.
        if final:
            matches = rendered.startswith(decoded) and not rendered[len(decoded) :].strip()
        else:
            matches = decoded == rendered
        if not matches:
            result.template_mismatches += 1
            logger.info(
                "task %s: trajectory differs from the template rendering (turn %d)",
                self.task_id,
                result.turns_used,
            )

    # ---------------------------------------------------------------- tools

    async def _run_tools(
        self,
        result: AgentResult,
        runtime: ToolRuntime,
        turn: int,
        calls: Sequence[_Call],
        timing: dict[str, float],
        assistant: JSONObject,
    ) -> None:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            runner = self._runner(tg, runtime)
            self._inflight = (assistant, runner.calls)
            for call in calls:
                runner.submit(call.call_id, call.name, call.arguments)
        await self._record_tools(result, runtime, turn, runner.calls, timing, assistant)
        timing["tool_seconds"] = anyio.current_time() - start

    def _runner(self, tg: TaskGroup, runtime: ToolRuntime) -> TurnToolRunner:
        return TurnToolRunner(
            tg,
            runtime,
            registry=self.registry,
            valid_names=self.valid_tool_names,
            timeout=self.tool_timeout,
            parallel=self.parallel_tool_calls,
        )

    async def _record_tools(
        self,
        result: AgentResult,
        runtime: ToolRuntime,
        turn: int,
        calls: Sequence[PendingCall],
        timing: dict[str, float],
        assistant: JSONObject,
    ) -> None:
        """Append the turn's assistant message and its tool messages (in call order) together.

        Errors are recorded and the result budget applied first, so a cancellation in between
        never leaves an assistant message whose calls have no results.
        """
        budget = self.budget_config if isinstance(self.budget_config, BudgetConfig) else None
        budget = budget or DEFAULT_BUDGET
        registry = self.registry or builtin_registry()
        sandbox: Sandbox | None = None

        def threshold(name: str) -> float:
            tool = registry.get(name)
            return budget.resolve_threshold(name, tool.max_result_size_chars if tool else None)

        # Only fetch (and so maybe create) the sandbox when something will be persisted: a
        # result over its threshold, or a turn over its budget. Most turns need neither.
        sizes = [(c.name, len(c.outcome.content)) for c in calls if c.outcome is not None]
        needs_sandbox = any(n > threshold(name) for name, n in sizes) or (
            sum(n for _, n in sizes) > budget.turn_budget
        )
        if needs_sandbox and runtime.sandboxes is not None:
            try:
                sandbox = await runtime.sandboxes.get(runtime.task_id)
            except Exception as exc:  # the preview then says the output could not be saved
                logger.warning("task %s: no sandbox for the result budget: %s", self.task_id, exc)
        turn_messages: list[JSONObject] = []
        names: list[str | None] = []
        for call in calls:
            outcome = call.outcome
            assert outcome is not None  # every call finished before the task group exited
            timing[f"tool:{call.index}:{call.name}"] = outcome.duration_seconds
            if outcome.error is not None:
                result.tool_errors.append(
                    ToolError(
                        turn=turn,
                        tool_name=call.name,
                        arguments=call.arguments,
                        error=outcome.error,
                        tool_result=outcome.content[:TOOL_ERROR_RESULT_MAX_CHARS],
                    )
                )
            tool = registry.get(call.name)
            content = await maybe_persist_tool_result(
                outcome.content,
                call.name,
                call.call_id,
                sandbox,
                budget,
                tool_threshold=tool.max_result_size_chars if tool is not None else None,
            )
            message: JSONObject = {"role": "tool", "tool_call_id": call.call_id, "content": content}
            turn_messages.append(message)
            names.append(call.name)
        await enforce_turn_budget(turn_messages, sandbox, budget, tool_names=names)
        self._inflight = None
        result.messages.append(assistant)
        result.messages.extend(turn_messages)
