"""Phase 2 turns: stream tokens, decode incrementally, parse, dispatch sealed calls early.

:class:`TokenTurns` runs the turns of one rollout against a token server. The token sequence
is kept exactly (prompt, sampled ids, rendered suffixes; never re-tokenized). Each tool call
is dispatched the moment the parser seals it. An aborted generation is resumed with the same
decoder and parser and the remaining token budget. The rules and their reasons:
docs/decisions/071-phase2-turns.md.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence

import anyio

from hermes_async._json import loads
from hermes_async._otel import span
from hermes_async.agent._prompt_ids import PROMPT_IDS
from hermes_async.agent._reasoning import TemplateKwargsTokenizer, thinking_template_kwargs
from hermes_async.agent._sampling import end_of_turn_ids, resolve_sampling, turn_sampling
from hermes_async.agent._segments import place_turn
from hermes_async.agent._start_ramp import first_prompt_gate
from hermes_async.agent._tool_runner import PendingCall, RunTools, TurnToolRunner, record_cut_calls
from hermes_async.agent._transcript import assistant_message
from hermes_async.agent.failures import RolloutFailure, classify_exception
from hermes_async.agent.options import AgentOptions
from hermes_async.agent.result import AgentResult
from hermes_async.agent.versions import (
    probe_paused,
    read_version,
    wait_while_paused,
)
from hermes_async.errors import InferenceError
from hermes_async.inference import (
    InvalidTokenDataError,
    ServerConnectError,
    ServerTimeoutError,
    StreamInterruptedError,
)
from hermes_async.inference.generate import (
    GenerateClient,
    SamplingParams,
    TokenClient,
    TokenDelta,
    TokenStream,
)
from hermes_async.inference.rendering import ChatRenderer
from hermes_async.inference.tokenizer import IncrementalDecoder, Tokenizer
from hermes_async.inference.trajectory import Trajectory
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers import ToolCallParser, get_parser, list_parsers
from hermes_async.parsers.types import (
    ArgumentsDelta,
    FunctionCall,
    ParserEvent,
    ToolCall,
    ToolCallInvalid,
    ToolCallSealed,
    ToolCallTruncated,
)

__all__ = ("TokenTurns",)

logger = logging.getLogger("hermes_async.agent.loop")

_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


def _split_think(content: str) -> tuple[str, str | None]:
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


class _Phase2Turn:
    """State of one streamed completion.

    Args:
        parser: A fresh parser for this completion.
        decoder: A fresh incremental decoder for this completion.
        stop_ids: End-of-turn ids: sampled (and trained on) but not text for the parser.
        early_dispatch: As AgentOptions.early_dispatch.
    """

    def __init__(
        self,
        parser: ToolCallParser,
        decoder: IncrementalDecoder,
        stop_ids: set[int],
        *,
        early_dispatch: bool,
    ) -> None:
        self.parser = parser
        self.decoder = decoder
        # Ids let the parser put back markers a decoder dropped (IncrementalDecoder says when not).
        self._parse_ids = not getattr(decoder, "spells_special_tokens", False)
        self.early_dispatch = early_dispatch
        # Compact arrays (4 and 8 bytes per token, not a Python object each): the turn is held
        # while its tools run, by thousands of rollouts at once.
        self.token_ids: array[int] = array("i")
        self.logprobs: array[float] = array("d")
        self.ttft: float | None = None
        self.finish_reason: str | None = None
        self.content = ""
        #: Calls cut off by the end of the stream: content, never executed.
        self.cut: list[ToolCallTruncated] = []
        self._stop_ids = stop_ids
        self._held: list[ToolCallSealed | ToolCallInvalid] = []
        self._text: list[str] = []
        self._fragments: dict[int, list[str]] = {}
        #: ``(first token, policy version)`` of each request of this turn (resumes included).
        self.requests: list[tuple[int, int | None]] = []

    def begin_request(self, version: int | None) -> None:
        """A (first or resumed) request starts: its tokens are sampled by ``version``."""
        self.requests.append((len(self.token_ids), version))
        self.finish_reason = None

    @property
    def resumes(self) -> int:
        """How many times this turn's generation was resumed."""
        return max(len(self.requests) - 1, 0)

    @property
    def ended_on_stop(self) -> bool:
        """Whether the last sampled id ends the turn."""
        return bool(self.token_ids) and self.token_ids[-1] in self._stop_ids

    def segments(self) -> Iterator[tuple[int, int, int | None]]:
        """``(start, end, version)`` of the turn's ids, split where the version changed.

        Requests of one version are one segment; an empty completion is one empty segment.
        """
        marks = self.requests or [(0, None)]
        merged: list[tuple[int, int | None]] = []
        for start, version in marks:
            if merged and merged[-1][1] == version:
                continue
            merged.append((start, version))
        # Requests that sampled nothing before a version change give empty ranges: skipped.
        bounds = [start for start, _ in merged[1:]] + [len(self.token_ids)]
        spans = [(s, e, v) for (s, v), e in zip(merged, bounds, strict=True)]
        kept = [span for span in spans if span[1] > span[0]]
        yield from kept or [(0, len(self.token_ids), merged[-1][1])]

    @property
    def stop_ids(self) -> frozenset[int]:
        """The ids that end this completion (not parsed as text)."""
        return frozenset(self._stop_ids)

    @property
    def text(self) -> str:
        """Everything the parser was fed: the completion's text without end-of-turn tokens."""
        return "".join(self._text)

    def feed(self, deltas: Sequence[TokenDelta], runner: TurnToolRunner, elapsed: float) -> None:
        """Take deltas that arrived together: keep their ids, decode and parse them at once
        (the parsers give the same results however the text is cut), submit sealed calls."""
        stop = self._stop_ids
        ids: list[int] = []
        for delta in deltas:
            self.token_ids.extend(delta.token_ids)
            self.logprobs.extend(delta.logprobs)
            if delta.finish_reason is not None:
                self.finish_reason = delta.finish_reason
            ids += [i for i in delta.token_ids if i not in stop]
        if self.ttft is None and self.token_ids:
            self.ttft = elapsed
        text = self.decoder.decode(ids)
        if text:
            self._text.append(text)
            self._handle(self.parser.feed(text, ids if self._parse_ids else None), runner)

    def finish(self, runner: TurnToolRunner) -> None:
        """End of stream: flush the decoder, close the parser, submit what is left."""
        tail = self.decoder.flush()
        if tail:
            self._text.append(tail)
            self._handle(self.parser.feed(tail, None), runner)
        result = self.parser.finish()
        self._handle(result.final_events, runner)
        for event in self._held:
            self._submit(event, runner)
        self._held.clear()
        self._fragments = {}  # an empty one: a cleared dict keeps its table
        self.content = result.content or ""
        # The stream is over: the parser's and the decoder's state would only be held while the
        # turn's tools run (a rollout parks here), and so would one string object per delta.
        del self.parser, self.decoder
        self._text = [self.text]

    def _handle(self, events: Sequence[ParserEvent], runner: TurnToolRunner) -> None:
        for event in events:
            if isinstance(event, ArgumentsDelta):
                self._fragments.setdefault(event.index, []).append(event.fragment)
            elif isinstance(event, ToolCallTruncated):
                self.cut.append(event)
            elif isinstance(event, ToolCallSealed | ToolCallInvalid):
                if self.early_dispatch:
                    self._submit(event, runner)
                else:
                    self._held.append(event)

    def _raw_arguments(self, event: ToolCallSealed) -> str | None:
        """The arguments exactly as written, if the preview fragments spell the same object.

        JSON formats stream the argument text as the model writes it; the XML formats stream
        a re-serialization, and a JSON-encoded string argument is decoded once: those keep the
        canonical string (``None`` here).
        """
        text = "".join(self._fragments.pop(event.index, ()))
        if not text or text == event.arguments:
            return None
        try:
            same = loads(text) == loads(event.arguments)
        except ValueError:
            return None
        return text if same else None

    def _submit(self, event: ToolCallSealed | ToolCallInvalid, runner: TurnToolRunner) -> None:
        if isinstance(event, ToolCallSealed):
            raw_arguments = self._raw_arguments(event)
            shown = raw_arguments if raw_arguments is not None else event.arguments
            raw = event.raw if event.raw and event.raw != shown else None
            runner.submit(PendingCall(event.call, raw_arguments, raw))
        else:
            # Malformed: kept in order, never executed; the model is told why.
            self._fragments.pop(event.index, None)
            call = ToolCall(event.id, FunctionCall(event.name or "", event.raw), index=event.index)
            runner.reject(PendingCall(call, raw=event.raw.strip() or None), event.message)

    def assistant_content(self, has_calls: bool) -> str:
        """The turn's content: the parser's, or, when a call was cut off and there is no other
        call, exactly the text the model produced (the cut call included)."""
        if not self.cut:
            return self.content
        if not has_calls:
            return self.text
        # The cut text follows calls the message lists separately: the template renders them
        # after the content, so this ordering cannot match the sampled text (counted).
        return "\n".join(part for part in (self.content, *(c.raw for c in self.cut)) if part)


class TokenTurns:
    """The Phase 2 turn strategy: stream a completion per turn, dispatching calls as they seal.

    Args:
        server: The token server.
        tokenizer: Renders prompts and decodes the stream.
        tool_schemas: Tools offered to the model.
        options: The loop's options.

    Raises:
        ValueError: Sampling options that contradict each other, or extras the server does not
            take.
        UnknownParserError: ``options.tool_call_parser`` is not registered.
    """

    def __init__(
        self,
        server: TokenClient,
        tokenizer: Tokenizer,
        tool_schemas: Sequence[JSONObject],
        options: AgentOptions,
    ) -> None:
        self._server = server
        # This library's clients only read the prompt: they get the compact array (see
        # _prompt_ids); any other TokenClient the list of ints it has always been given.
        self._array_prompts = isinstance(server, GenerateClient)
        switch = thinking_template_kwargs(
            options.thinking_mode, options.reasoning_effort, options.max_reasoning_tokens
        )
        if switch:
            tokenizer = TemplateKwargsTokenizer(tokenizer, switch)
        self._tokenizer = tokenizer
        self._vocab_size = len(tokenizer)
        self._schemas = list(tool_schemas)
        parser = options.tool_call_parser
        if parser not in list_parsers():  # every turn would fail: refuse it when built
            get_parser(parser)  # raises UnknownParserError, naming the registered ones
        # One parser per turn, on the schemas of one built here (as ToolCallParser.parse
        # shares them).
        first = get_parser(parser, tools=self._schemas or None, tokenizer=tokenizer)
        self._new_parser = functools.partial(
            type(first), tools=self._schemas or None, tokenizer=tokenizer, schemas=first.schemas
        )
        self._end_of_turn = end_of_turn_ids(tokenizer, options.end_of_turn)
        self._stop_ids = {tokenizer.eos_token_id, *self._end_of_turn}
        self._stop_texts: dict[int, str] = {}
        endoftext = tokenizer.special_tokens.get("<|endoftext|>")
        if endoftext is not None:
            self._stop_ids.add(endoftext)
        self._sampling = resolve_sampling(
            options.sampling,
            temperature=options.temperature,
            max_tokens=options.max_tokens,
            extra_body=options.extra_body,
            stop_ids=self._end_of_turn,
        )
        check = getattr(server, "check_sampling", None)
        self._check_sampling: Callable[[SamplingParams], None] | None = (
            check if callable(check) else None
        )
        if self._check_sampling is not None:
            self._check_sampling(self._sampling)  # a key the server refuses fails here
        self._options = options

    async def run(self, result: AgentResult, tools: RunTools, *, seed: int | None = None) -> None:
        """Run the rollout's turns; ``managed_state`` is set on every exit path.

        Args:
            result: The run's result (its ``messages`` are the conversation).
            tools: The run's tool side.
            seed: This run's sampling seed (``None``: the configured one).

        **Cancellation**: the generation stream is closed and running tools are cancelled;
        ``managed_state`` still holds the aligned trajectory so far.
        """
        renderer = ChatRenderer(
            self._tokenizer, self._schemas, incremental=self._options.incremental_rendering
        )
        async with first_prompt_gate():  # a few per loop pass: rollouts started at once
            prompt, trajectory = _first_prompt(self._tokenizer, renderer, result.messages)
        try:
            await self._turns(result, tools, trajectory, renderer, prompt, seed)
        finally:
            # Built once, on every exit path (cancellation included): keeping three Python lists
            # per rollout up to date every turn would cost memory while thousands wait on tools.
            result.managed_state = trajectory.managed_state()

    async def _turns(
        self,
        result: AgentResult,
        tools: RunTools,
        trajectory: Trajectory,
        renderer: ChatRenderer,
        prompt: str,
        seed: int | None,
    ) -> None:
        tokenizer = self._tokenizer
        messages = result.messages
        deadline = (
            self._options.turn_timeout if self._options.turn_timeout is not None else math.inf
        )
        for turn in range(1, self._options.max_turns + 1):
            with span("turn", {"hermes_async.task_id": tools.task_id, "hermes_async.turn": turn}):
                timing: dict[str, float] = {"turn": float(turn)}
                result.timings.append(timing)
                result.turns_used = turn
                sampling = turn_sampling(
                    self._sampling,
                    turn=turn,
                    messages=messages,
                    hook=self._options.sampling_hook,
                    seed=seed,
                )
                if sampling is not self._sampling and self._check_sampling is not None:
                    self._check_sampling(sampling)
                step = _Phase2Turn(
                    self._new_parser(),
                    tokenizer.incremental_decoder(),
                    self._stop_ids.union(sampling.stop_token_ids),
                    early_dispatch=self._options.early_dispatch,
                )
                start = anyio.current_time()
                failure: RolloutFailure | None = None
                # Stream errors are caught inside the task group's body (an exception escaping the
                # body would arrive wrapped in an ExceptionGroup); tools already started by early
                # dispatch are then cancelled with the turn.
                async with anyio.create_task_group() as tg:
                    runner = tools.runner(tg)
                    try:
                        # No locals for the prompt: this frame is kept while the tools run.
                        failure = await self._bounded(
                            deadline,
                            self._generate(
                                step, runner, self._prompt_ids(trajectory), sampling, start
                            ),
                        )
                        if failure is None:
                            step.finish(runner)
                        else:
                            tg.cancel_scope.cancel(reason=failure.message)
                    except InferenceError as exc:
                        failure = classify_exception(exc, source="model_server")
                        logger.warning(
                            "task %s: generation failed: %s", tools.task_id, failure.message
                        )
                        tg.cancel_scope.cancel(reason="generation failed")
                    timing["generation_seconds"] = anyio.current_time() - start
                if step.ttft is not None:
                    timing["time_to_first_token"] = step.ttft
                if step.resumes:
                    timing["resumes"] = float(step.resumes)
                    trajectory.resumes += step.resumes
                if failure is not None:
                    result.failure = failure
                    result.error = failure.message
                    return
                timing["tool_seconds"] = anyio.current_time() - start - timing["generation_seconds"]
                for begin, end, version in step.segments():
                    trajectory.add_completion(
                        step.token_ids[begin:end],
                        step.logprobs[begin:end],
                        turn=turn,
                        version=version,
                    )
                content, reasoning = step.assistant_content(bool(runner.calls)), None
                if self._options.split_reasoning:
                    content, reasoning = _split_think(content)
                result.reasoning_per_turn.append(reasoning)
                assistant = assistant_message(content, runner.calls, reasoning)
                tools.begin_turn(assistant, runner.calls)
                await tools.record_turn(result, turn, runner.calls, timing, assistant)
                at = len(messages) - 1 - len(runner.calls)  # the assistant message just appended
                record_cut_calls(result, turn, step.cut)
                final = not runner.calls and not step.cut
                if final:
                    result.finished_naturally = True
                prompt = self._place(
                    result,
                    trajectory,
                    renderer,
                    turn,
                    step,
                    prompt,
                    at,
                    final=final,
                    task_id=tools.task_id,
                )
                if final:
                    return

    def _prompt_ids(self, trajectory: Trajectory) -> Sequence[int]:
        """The next request's prompt: a compact array for this library's clients, which only
        read it (thousands of requests wait for a slot at once, each holding its prompt); the
        list of ints any other :class:`~hermes_async.inference.generate.TokenClient` has always
        been given.
        """
        if self._array_prompts:
            segments = trajectory.segments
            # The first turn's prompt is the prompt segment itself (no copy; nothing writes it).
            return segments[0].token_ids if len(segments) == 1 else trajectory.token_array()
        return trajectory.tokens

    async def _bounded(
        self, seconds: float, generation: Coroutine[object, None, RolloutFailure | None]
    ) -> RolloutFailure | None:
        """Await ``generation`` (a :meth:`_generate`) within the turn's deadline, ``seconds``
        from now.

        A bare scope, not ``fail_after`` (a generator context manager per turn, held by every
        rollout waiting for a model-request slot), and one that goes with this frame, not one
        the turn loop keeps while the turn's tools run.
        """
        with anyio.CancelScope(deadline=anyio.current_time() + seconds):
            return await generation
        return RolloutFailure.of(
            "agent_timeout",
            f"generation timed out after {self._options.turn_timeout:g} s",
            source="deadline",
            deadline="turn_timeout",
        )

    async def _generate(
        self,
        step: _Phase2Turn,
        runner: TurnToolRunner,
        prompt: Sequence[int],
        sampling: SamplingParams,
        start: float,
    ) -> RolloutFailure | None:
        """Stream the turn's completion into ``step``, resuming aborted requests.

        Returns the failure that ends the rollout (resumes used up, the server paused past
        ``pause_timeout``, more tokens than the budget), else ``None``. Raises the stream's
        :class:`InferenceError` when it is not an abort.
        """
        budget = sampling.max_tokens
        while True:
            if self._options.pause_probe is not None:
                # Not dispatched into a pause: a request the server holds through a weight
                # update would be sampled by the new weights but labelled with the old version.
                try:
                    await wait_while_paused(
                        self._options.pause_probe, timeout=self._options.pause_timeout
                    )
                except TimeoutError:
                    return _server_failure(
                        step,
                        f"the model server stayed paused for more than {self._options.pause_timeout:g} s "
                        "(pause_timeout)",
                    )
            # Read once, at dispatch: these tokens are labelled with this value, whatever the
            # source says later (AReaL #1569: reading it twice mislabelled tokens).
            version = (
                await read_version(self._options.version_source)
                if self._options.version_source is not None
                else None
            )
            sent = len(step.token_ids)
            params = (
                sampling if not sent else dataclasses.replace(sampling, max_tokens=budget - sent)
            )
            step.begin_request(version)
            broken: InferenceError | None = None
            try:
                async with self._server.stream(_joined(prompt, step.token_ids), params) as deltas:
                    next_batch = _batches(deltas, self._vocab_size)
                    while (batch := await next_batch()) is not None:
                        self._take(step, runner, batch, start, deltas)
            except (StreamInterruptedError, ServerTimeoutError, ServerConnectError) as exc:
                # A stream cut by a pausing server is an abort; any other break is a failure.
                if self._options.pause_probe is None or not await probe_paused(
                    self._options.pause_probe
                ):
                    raise
                broken = exc
            if len(step.token_ids) > budget:
                return _server_failure(
                    step,
                    f"the server sent {len(step.token_ids)} tokens for a budget of {budget} "
                    f"(after {step.resumes} resumes)",
                )
            if broken is None and step.finish_reason != "abort":
                return None
            if step.ended_on_stop or len(step.token_ids) >= budget:
                # Aborted on its last token: nothing is left to sample.
                step.finish_reason = "stop" if step.ended_on_stop else "length"
                return None
            if step.resumes >= self._options.max_resumes:
                return _server_failure(
                    step,
                    f"generation aborted by the server {step.resumes + 1} times "
                    f"(max_resumes={self._options.max_resumes}); {len(step.token_ids)} tokens kept",
                    aborted=True,  # trainers report it as their own "aborted" status
                )
            logger.debug(
                "generation aborted after %d tokens (%s); resuming with %d left",
                len(step.token_ids),
                "stream cut while paused" if broken is not None else "finish_reason abort",
                budget - len(step.token_ids),
            )

    def _take(
        self,
        step: _Phase2Turn,
        runner: TurnToolRunner,
        batch: list[TokenDelta],
        start: float,
        stream: object,
    ) -> None:
        """Feed ``batch`` to ``step`` once every id in it is checked."""
        size = self._vocab_size
        # The clock only until the first token (time to first token).
        elapsed = anyio.current_time() - start if step.ttft is None else 0.0
        for at, delta in enumerate(batch):
            ids = delta.token_ids
            # Whatever client this is: an id the tokenizer cannot have made never reaches the
            # trajectory (a client built without vocab_size lets it by). The deltas before it
            # are taken, as one by one.
            # (The rule of inference's private ids_outside, which this package may not import.)
            if ids and not 0 <= min(ids) <= max(ids) < size:
                if at:
                    step.feed(batch[:at], runner, elapsed)
                raise _outside_vocabulary(ids, size, step, stream)
        step.feed(batch, runner, elapsed)

    def _place(
        self,
        result: AgentResult,
        trajectory: Trajectory,
        renderer: ChatRenderer,
        turn: int,
        step: _Phase2Turn,
        prompt: str,
        at: int,
        *,
        final: bool,
        task_id: str,
    ) -> str:
        """Check the turn against the template, append its suffix; return the next prompt."""
        tokenizer = self._tokenizer
        messages = result.messages
        schemas = self._schemas or None
        # The whole conversation's text, rendered for this turn's messages only where the
        # template allows: the check below costs O(new tokens) (the completion's ids decoded).
        full = renderer.render(messages, add_generation_prompt=not final)
        ids = step.token_ids
        ended = bool(ids) and ids[-1] in step.stop_ids
        stops = [self._stop_text(ids[-1])] if ended else self._end_texts()
        placement = place_turn(
            turn=turn,
            prompt=prompt,
            full=full,
            completion=tokenizer.decode(ids.tolist()),
            stop_texts=stops,
            ended_on_stop=ended,
            final=final,
            before=lambda: tokenizer.apply_chat_template(
                messages[: at + 1], schemas, add_generation_prompt=False
            ),
        )
        for check in placement.checks:
            result.template_checks.append(check)
            if check.counted:
                result.template_mismatches += 1
                logger.info("task %s: template check: %s", task_id, check.describe())
        if placement.suffix:
            trajectory.add_suffix(tokenizer.encode(placement.suffix), turn=turn)
        return full

    def _end_texts(self) -> list[str]:
        return [self._stop_text(i) for i in self._end_of_turn]

    def _stop_text(self, token_id: int) -> str:
        """The text of one end-of-turn id, decoded once (there are a handful)."""
        text = self._stop_texts.get(token_id)
        if text is None:
            text = self._stop_texts[token_id] = self._tokenizer.decode([token_id])
        return text


def _batches(
    deltas: AsyncIterator[TokenDelta], vocab_size: int
) -> Callable[[], Awaitable[list[TokenDelta] | None]]:
    """The next deltas of ``deltas``, ``None`` at its end: this library's streams give every
    delta already received at once, joined (an id outside the vocabulary comes alone, so the
    ones before it are taken), any other client's one at a time."""
    if isinstance(deltas, TokenStream):
        return functools.partial(deltas.next_joined, vocab_size)

    async def one() -> list[TokenDelta] | None:
        try:
            return [await anext(deltas)]
        except StopAsyncIteration:
            return None

    return one


def _first_prompt(
    tokenizer: Tokenizer, renderer: ChatRenderer, messages: Sequence[JSONObject]
) -> tuple[str, Trajectory]:
    """The first prompt's text and the trajectory it starts, encoded once per group prompt:
    the group's rollouts hold one text and one id array (:meth:`PromptIds.share`). In its own
    frame, so an uncached prompt's list of ints is not kept for the whole run."""
    prompt = renderer.render(messages, add_generation_prompt=True)
    prompt, ids = PROMPT_IDS.share(tokenizer, prompt)
    renderer.share(prompt)
    return prompt, Trajectory(ids)


def _server_failure(step: _Phase2Turn, message: str, *, aborted: bool = False) -> RolloutFailure:
    """An ``infra`` failure at the model server during ``step``'s generation, with the count of
    completion tokens it had sampled (a server that sampled none counts as down:
    :func:`~hermes_async.agent.rollout.run_group`); ``aborted``: the server kept aborting it."""
    detail: dict[str, object] = {"completion_tokens": len(step.token_ids)}
    if aborted:
        detail["aborted"] = True
    return RolloutFailure.of("infra", message, source="model_server", **detail)


def _outside_vocabulary(
    ids: Sequence[int], vocab_size: int, step: _Phase2Turn, stream: object
) -> InvalidTokenDataError:
    bad = next(i for i in ids if not 0 <= i < vocab_size)
    return InvalidTokenDataError(
        f"token id {bad} is outside the tokenizer's vocabulary [0, {vocab_size}): the server "
        "samples from another vocabulary than the tokenizer's (wrong model or tokenizer?)",
        endpoint=str(getattr(stream, "endpoint", "the model server")),
        token_ids=step.token_ids,
        logprobs=step.logprobs,
    )


def _joined(prompt: Sequence[int], sent: array[int]) -> Sequence[int]:
    """A resumed request's prompt: the prompt and what was sampled so far (the prompt itself on
    the first request: no copy), in the prompt's own kind (array or list)."""
    if not sent:
        return prompt
    if isinstance(prompt, array):
        return prompt + sent
    return [*prompt, *sent]
