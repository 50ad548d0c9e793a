"""Phase 2 turns: stream tokens, decode incrementally, parse, dispatch sealed calls early.

:class:`TokenTurns` runs the turns of one rollout against a token server (our
``hermes_async.inference.generate`` clients) plus a tokenizer: the prompt is rendered with the
chat template, completion tokens stream in, the parser sees them as they arrive, and each tool
call is **dispatched the moment it is sealed**, while generation continues. The token sequence is
kept exactly (prompt + sampled ids + rendered suffixes; never re-tokenized) and handed out as
``managed_state``.

:class:`Phase2Turn` holds the state of one streamed completion, and nothing else: the ids and
logprobs exactly as sampled, a UTF-8-safe incremental decoder, and a fresh streaming parser. Every
tool call the parser *seals* is handed to the turn's
:class:`~hermes_async.agent._tool_runner.TurnToolRunner` at once (early dispatch) — so a tool
runs while the model is still writing the next call.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import replace

import anyio

from hermes_async.agent._tool_runner import RunTools, ToolCall, TurnToolRunner
from hermes_async.agent._transcript import assistant_message, suffix_ids, template_matches
from hermes_async.agent.failures import RolloutFailure, classify_exception
from hermes_async.agent.result import AgentResult
from hermes_async.errors import InferenceError
from hermes_async.inference.generate import SamplingParams, TokenClient, TokenDelta
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.inference.trajectory import Trajectory
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers import get_parser
from hermes_async.parsers.types import (
    ParserEvent,
    ToolCallInvalid,
    ToolCallSealed,
    ToolCallTruncated,
)

__all__ = ("Phase2Turn", "TokenTurns", "split_think")

logger = logging.getLogger("hermes_async.agent.loop")

_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


def split_think(content: str) -> tuple[str, str | None]:
    """Split a leading ``<think>...</think>`` block off ``content``.

    Returns:
        ``(content without the block, reasoning or None)``. A ``<think>`` that is never closed
        (the model ran out of tokens while thinking) is all reasoning.
    """
    match = _THINK.match(content)
    if match:
        return content[match.end() :], match.group(1).strip("\n") or None
    stripped = content.lstrip()
    if stripped.startswith("<think>") and "</think>" not in stripped:
        return "", stripped[len("<think>") :].strip("\n") or None
    return content, None


class Phase2Turn:
    """State of one streamed completion.

    Args:
        tokenizer: Decodes the stream.
        parser_name: Tool-call parser for this turn.
        tool_schemas: Offered tools (parsers type parameters from them).
        early_dispatch: Submit calls as soon as they are sealed; else at :meth:`finish`.
    """

    def __init__(
        self,
        *,
        tokenizer: Tokenizer,
        parser_name: str,
        tool_schemas: Sequence[JSONObject],
        early_dispatch: bool,
    ) -> None:
        self.parser = get_parser(parser_name, tools=list(tool_schemas) or None, tokenizer=tokenizer)
        self.decoder = tokenizer.incremental_decoder()
        self.early_dispatch = early_dispatch
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.ttft: float | None = None
        self.finish_reason: str | None = None
        self.content = ""
        # End-of-turn ids are sampled (and trained on) but are not text for the parser.
        self._stop_ids = {tokenizer.eos_token_id}
        endoftext = tokenizer.special_tokens.get("<|endoftext|>")
        if endoftext is not None:
            self._stop_ids.add(endoftext)
        self._held: list[ToolCallSealed | ToolCallInvalid | ToolCallTruncated] = []

    def feed(self, delta: TokenDelta, runner: TurnToolRunner, elapsed: float) -> None:
        """Take one delta: keep its ids, decode, parse, and submit sealed calls."""
        if self.ttft is None and delta.token_ids:
            self.ttft = elapsed
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        ids = [i for i in delta.token_ids if i not in self._stop_ids]
        text = self.decoder.decode(ids)
        if text:
            self._handle(self.parser.feed(text, ids), runner)

    def finish(self, runner: TurnToolRunner) -> None:
        """End of stream: flush the decoder, close the parser, submit what is left."""
        tail = self.decoder.flush()
        if tail:
            self._handle(self.parser.feed(tail, None), runner)
        result = self.parser.finish()
        self._handle(result.final_events, runner)
        for event in self._held:
            self._submit(event, runner)
        self._held.clear()
        self.content = result.content or ""

    def _handle(self, events: Sequence[ParserEvent], runner: TurnToolRunner) -> None:
        for event in events:
            if isinstance(event, ToolCallSealed | ToolCallInvalid | ToolCallTruncated):
                if self.early_dispatch:
                    self._submit(event, runner)
                else:
                    self._held.append(event)

    @staticmethod
    def _submit(
        event: ToolCallSealed | ToolCallInvalid | ToolCallTruncated, runner: TurnToolRunner
    ) -> None:
        if isinstance(event, ToolCallSealed):
            runner.submit(ToolCall(event.id, event.name, event.arguments))
        else:
            # Malformed or cut off: kept in order, never executed; the model is told why.
            runner.reject(ToolCall(event.id, event.name or "", event.raw), event.message)


class TokenTurns:
    """The Phase 2 turn strategy: stream a completion per turn, dispatching calls as they seal.

    Args:
        server: The token server.
        tokenizer: Renders prompts and decodes the stream.
        tool_schemas: Tools offered to the model.
        max_turns: Maximum generations.
        parser_name: The tool-call parser.
        early_dispatch: Start each call the moment it is sealed (else at the end of the turn).
        split_reasoning: Move a leading ``<think>`` block into ``reasoning_content``.
        sampling: Sampling parameters of every generation (stop ids already set).
        turn_timeout: Deadline of one generation in seconds (``None``: none).
    """

    def __init__(
        self,
        server: TokenClient,
        *,
        tokenizer: Tokenizer,
        tool_schemas: Sequence[JSONObject],
        max_turns: int,
        parser_name: str,
        early_dispatch: bool,
        split_reasoning: bool,
        sampling: SamplingParams,
        turn_timeout: float | None,
    ) -> None:
        self._server = server
        self._tokenizer = tokenizer
        self._schemas = list(tool_schemas)
        self._max_turns = max_turns
        self._parser_name = parser_name
        self._early_dispatch = early_dispatch
        self._split_reasoning = split_reasoning
        self._sampling = sampling
        self._turn_timeout = turn_timeout

    async def run(self, result: AgentResult, tools: RunTools, *, seed: int | None = None) -> None:
        """Run the rollout's turns; ``managed_state`` is set on every exit path.

        Args:
            result: The run's result (its ``messages`` are the conversation).
            tools: The run's tool side.
            seed: This run's sampling seed (``None``: the configured one).

        **Cancellation**: the generation stream is closed and running tools are cancelled;
        ``managed_state`` still holds the aligned trajectory so far.
        """
        tokenizer = self._tokenizer
        sampling = self._sampling if seed is None else replace(self._sampling, seed=seed)
        prompt = tokenizer.apply_chat_template(
            result.messages, self._schemas or None, add_generation_prompt=True
        )
        trajectory = Trajectory(tokenizer.encode(prompt))
        try:
            await self._turns(result, tools, trajectory, sampling)
        finally:
            # Built once, on every exit path (cancellation included): keeping three Python lists
            # per rollout up to date every turn would cost memory while thousands wait on tools.
            result.managed_state = trajectory.managed_state()

    async def _turns(
        self,
        result: AgentResult,
        tools: RunTools,
        trajectory: Trajectory,
        sampling: SamplingParams,
    ) -> None:
        tokenizer = self._tokenizer
        messages = result.messages
        schemas = self._schemas or None
        deadline = self._turn_timeout if self._turn_timeout is not None else math.inf
        for turn in range(self._max_turns):
            timing: dict[str, float] = {"turn": float(turn + 1)}
            result.timings.append(timing)
            result.turns_used = turn + 1
            step = Phase2Turn(
                tokenizer=tokenizer,
                parser_name=self._parser_name,
                tool_schemas=self._schemas,
                early_dispatch=self._early_dispatch,
            )
            start = anyio.current_time()
            failure: RolloutFailure | None = None
            # Stream errors are caught inside the task group's body (an exception escaping the
            # body would arrive wrapped in an ExceptionGroup); tools already started by early
            # dispatch are then cancelled with the turn.
            async with anyio.create_task_group() as tg:
                runner = tools.runner(tg)
                try:
                    with anyio.fail_after(deadline):
                        async with self._server.stream(trajectory.tokens, sampling) as deltas:
                            async for delta in deltas:
                                step.feed(delta, runner, anyio.current_time() - start)
                    step.finish(runner)
                except TimeoutError:
                    failure = RolloutFailure.of(
                        "agent_timeout",
                        f"generation timed out after {self._turn_timeout:g} s",
                        source="deadline",
                        deadline="turn_timeout",
                    )
                    tg.cancel_scope.cancel(reason=failure.message)
                except InferenceError as exc:
                    failure = classify_exception(exc, source="model_server")
                    logger.warning("task %s: generation failed: %s", tools.task_id, failure.message)
                    tg.cancel_scope.cancel(reason="generation failed")
                timing["generation_seconds"] = anyio.current_time() - start
            if step.ttft is not None:
                timing["time_to_first_token"] = step.ttft
            if failure is not None:
                result.failure = failure
                result.error = failure.message
                return
            timing["tool_seconds"] = anyio.current_time() - start - timing["generation_seconds"]
            trajectory.add_completion(step.token_ids, step.logprobs)
            content, reasoning = step.content, None
            if self._split_reasoning:
                content, reasoning = split_think(content)
            result.reasoning_per_turn.append(reasoning)
            assistant = assistant_message(content, runner.calls, reasoning)
            tools.begin_turn(assistant, runner.calls)
            await tools.record_turn(result, turn + 1, runner.calls, timing, assistant)
            if not runner.calls:
                result.finished_naturally = True
                rendered = tokenizer.apply_chat_template(
                    messages, schemas, add_generation_prompt=False
                )
                self._check_template(result, trajectory, rendered, tools.task_id, final=True)
                return
            ended_on_eos = bool(step.token_ids) and step.token_ids[-1] == tokenizer.eos_token_id
            suffix, rendered = suffix_ids(messages, tokenizer, schemas, ended_on_eos=ended_on_eos)
            trajectory.add_suffix(suffix)
            self._check_template(result, trajectory, rendered, tools.task_id, final=False)

    def _check_template(
        self,
        result: AgentResult,
        trajectory: Trajectory,
        rendered: str,
        task_id: str,
        *,
        final: bool,
    ) -> None:
        """Count a mismatch between the decoded tokens and the template's ``rendered`` text."""
        if not template_matches(self._tokenizer.decode(trajectory.tokens), rendered, final=final):
            result.template_mismatches += 1
            logger.info(
                "task %s: trajectory differs from the template rendering (turn %d)",
                task_id,
                result.turns_used,
            )
