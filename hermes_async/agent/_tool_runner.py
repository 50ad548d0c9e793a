"""Running one turn's tool calls: in order by default, in parallel on request, started early.

:class:`TurnToolRunner` starts each call as it is submitted (in Phase 2, when the parser seals
it) and keeps outcomes in the order the model wrote the calls. Its tasks live in the caller's
task group, so cancelling the turn cancels the tools. :class:`RunTools` is the per-run half
(runtime, turn in flight, recording); being per run lets one loop run several rollouts at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from hermes_async._otel import span
from hermes_async.agent._transcript import interrupted_turn, tool_message
from hermes_async.agent.budget import (
    DEFAULT_BUDGET,
    BudgetConfig,
    enforce_turn_budget,
    maybe_persist_tool_result,
)
from hermes_async.agent.options import AgentOptions
from hermes_async.agent.result import TOOL_ERROR_RESULT_MAX_CHARS, AgentResult, ToolError
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers.types import ToolCall, ToolCallTruncated
from hermes_async.tools.registry import (
    ToolOutcome,
    ToolRegistry,
    ToolRuntime,
    builtin_registry,
    dispatch,
)
from hermes_async.tools.sandbox.base import Sandbox

__all__ = ("PendingCall", "RunTools", "ToolSettings", "TurnToolRunner", "record_cut_calls")

logger = logging.getLogger("hermes_async.agent.loop")


@dataclass(slots=True, eq=False)
class PendingCall:
    """A tool call of the turn in flight: the call the model made and, once run, its outcome.

    Attributes:
        call: The call (for a malformed one, ``function.arguments`` is its text).
        raw_arguments: Phase 2: the arguments as the model wrote them, when they differ from
            ``call.arguments`` (the message shows these).
        raw: Phase 2: the call's JSON as the model wrote it, for whole-JSON formats (hermes,
            llama3_json) or a malformed call; templates that know it render the model's text.
        outcome: What the model is shown, once the call finished.
    """

    call: ToolCall
    raw_arguments: str | None = None
    raw: str | None = None
    index: int = -1
    outcome: ToolOutcome | None = None
    # Made only when someone waits before the call finished: an anyio.Event is ~1 KB, and
    # thousands of parked rollouts each hold a running call.
    _finished: bool = field(default=False, init=False, repr=False)
    _waiter: anyio.Event | None = field(default=None, init=False, repr=False)

    @property
    def finished(self) -> bool:
        return self._finished

    def mark_finished(self) -> None:
        self._finished = True
        if self._waiter is not None:
            self._waiter.set()

    async def wait_finished(self) -> None:
        """Wait until the call has finished (a checkpoint even if it already has).

        **Cancellation**: only the wait is cancelled.
        """
        if self._finished:
            await anyio.lowlevel.checkpoint()
            return
        if self._waiter is None:
            self._waiter = anyio.Event()
        await self._waiter.wait()


def record_cut_calls(result: AgentResult, turn: int, cut: Sequence[ToolCallTruncated]) -> None:
    """Calls cut off by ``max_tokens`` (decision 001): a ``ToolError`` each and one ``user``
    message telling the model why nothing ran."""
    if not cut:
        return
    for event in cut:
        result.tool_errors.append(
            ToolError(
                turn=turn,
                tool_name=event.name or "",
                arguments=event.raw,
                error=event.message,
                tool_result=event.message[:TOOL_ERROR_RESULT_MAX_CHARS],
                category="model",  # the model's call, cut off: never run
            )
        )
    text = "\n".join(dict.fromkeys(event.message for event in cut))
    result.messages.append({"role": "user", "content": text})


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """How a loop runs tools (fixed at construction, shared by all its runs).

    Attributes:
        registry: Where tools come from (``None``: the built-in tools).
        valid_names: Names the model was offered.
    """

    registry: ToolRegistry | None
    valid_names: frozenset[str]
    options: AgentOptions

    @property
    def budget(self) -> BudgetConfig:
        return self.options.budget or DEFAULT_BUDGET


class TurnToolRunner:
    """Start tool calls as they are submitted in ``tg``; collect outcomes in submission order."""

    def __init__(self, tg: TaskGroup, runtime: ToolRuntime, settings: ToolSettings) -> None:
        self._tg = tg
        self._runtime = runtime
        self._settings = settings
        self._started = 0  # calls submitted to run (not the rejected ones)
        self.calls: list[PendingCall] = []

    def submit(self, call: PendingCall) -> PendingCall:
        """Start ``call`` (or queue it behind the previous call of the turn); return it.

        Past ``max_tool_calls_per_turn`` the call does not run: it is answered with an error.
        """
        limit = self._settings.options.max_tool_calls_per_turn
        if self._started >= limit:
            return self.reject(
                call,
                f"not run: this turn already has {limit} tool calls, the most one turn may run "
                "(AgentOptions.max_tool_calls_per_turn); make fewer calls per turn",
            )
        self._started += 1
        previous = (
            self.calls[-1]
            if self.calls and not self._settings.options.parallel_tool_calls
            else None
        )
        call.index = len(self.calls)
        self.calls.append(call)
        self._tg.start_soon(self._run, call, previous, name=f"tool {call.call.name} #{call.index}")
        return call

    def reject(self, call: PendingCall, error: str) -> PendingCall:
        """Record a call that must not run; the model is shown ``{"error": error}`` in its place."""
        call.index = len(self.calls)
        call.outcome = ToolOutcome(
            json.dumps({"error": error}, ensure_ascii=False), error, malformed=True
        )
        call.mark_finished()
        self.calls.append(call)
        return call

    async def _run(self, call: PendingCall, previous: PendingCall | None) -> None:
        if previous is not None:
            await previous.wait_finished()
        settings = self._settings
        name = call.call.name
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call.call.id,
            "hermes_async.task_id": self._runtime.task_id,
        }
        try:
            with span(f"execute_tool {name}", attributes) as traced:
                call.outcome = await dispatch(
                    name,
                    call.call.arguments,
                    self._runtime,
                    registry=settings.registry,
                    valid_names=settings.valid_names,
                    timeout=settings.options.tool_timeout,
                )
                if call.outcome.error is not None:
                    traced.error(call.outcome.error)
        finally:
            call.mark_finished()

    async def wait(self) -> list[PendingCall]:
        """Wait until every submitted call has finished; return them in submission order.

        **Cancellation**: the calls run in the caller's task group; cancelling it cancels them.
        """
        for call in self.calls:
            await call.wait_finished()
        return list(self.calls)


class RunTools:
    """The tool side of one run: its runtime, the turn in flight, and recording a finished turn."""

    __slots__ = ("_inflight", "runtime", "settings")

    def __init__(self, settings: ToolSettings, runtime: ToolRuntime) -> None:
        self.settings = settings
        self.runtime = runtime
        # The turn whose tools are running: its assistant message and call records, so a
        # deadline or cancellation can still close it consistently.
        self._inflight: tuple[JSONObject, list[PendingCall]] | None = None

    @property
    def task_id(self) -> str:
        return self.runtime.task_id

    def runner(self, tg: TaskGroup) -> TurnToolRunner:
        return TurnToolRunner(tg, self.runtime, self.settings)

    def begin_turn(self, assistant: JSONObject, calls: list[PendingCall]) -> None:
        """Mark the turn ``(assistant, calls)`` as in flight (closed by :meth:`close_inflight`)."""
        self._inflight = (assistant, calls)

    # Synchronous, so it runs even while cancellation propagates.
    def close_inflight(self, result: AgentResult, reason: str) -> None:
        """Append the interrupted turn, if any: its assistant message and one result per call."""
        if self._inflight is None:
            return
        assistant, calls = self._inflight
        self._inflight = None
        result.messages.extend(interrupted_turn(assistant, calls, reason))

    async def run_calls(
        self,
        result: AgentResult,
        turn: int,
        calls: Sequence[PendingCall],
        timing: dict[str, float],
        assistant: JSONObject,
    ) -> None:
        """Run a turn whose calls are all known (Phase 1), then record it.

        **Cancellation**: running tools are cancelled; the turn stays in flight for
        :meth:`close_inflight`.
        """
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            runner = self.runner(tg)
            self.begin_turn(assistant, runner.calls)
            for call in calls:
                runner.submit(call)
        await self.record_turn(result, turn, runner.calls, timing, assistant)
        timing["tool_seconds"] = anyio.current_time() - start

    async def record_turn(
        self,
        result: AgentResult,
        turn: int,
        calls: Sequence[PendingCall],
        timing: dict[str, float],
        assistant: JSONObject,
    ) -> None:
        """Append the turn's assistant message and its tool messages (in call order) together.

        The budget is applied first, so a cancellation never leaves calls without results.

        **Cancellation**: nothing is appended; the turn stays in flight for
        :meth:`close_inflight`.
        """
        budget = self.settings.budget
        registry = self.settings.registry or builtin_registry()
        runtime = self.runtime

        def threshold(name: str) -> float:
            tool = registry.get(name)
            return budget.resolve_threshold(name, tool.max_result_size_chars if tool else None)

        # Only fetch (and so maybe create) the sandbox when something will be persisted: a
        # result over its threshold, or a turn over its budget. Most turns need neither.
        sizes = [(c.call.name, len(c.outcome.content)) for c in calls if c.outcome is not None]
        needs_sandbox = any(n > threshold(name) for name, n in sizes) or (
            sum(n for _, n in sizes) > budget.turn_budget
        )
        sandbox: Sandbox | None = None
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
            name = call.call.name
            timing[f"tool:{call.index}:{name}"] = outcome.duration_seconds
            if outcome.error is not None:
                result.tool_errors.append(
                    ToolError(
                        turn=turn,
                        tool_name=name,
                        arguments=call.call.arguments,
                        error=outcome.error,
                        tool_result=outcome.content[:TOOL_ERROR_RESULT_MAX_CHARS],
                        category="model" if outcome.malformed else "tool",
                    )
                )
            tool = registry.get(name)
            content = await maybe_persist_tool_result(
                outcome.content,
                name,
                call.call.id,
                sandbox,
                budget,
                tool_threshold=tool.max_result_size_chars if tool is not None else None,
            )
            turn_messages.append(tool_message(call.call.id, content))
            names.append(name)
        await enforce_turn_budget(turn_messages, sandbox, budget, tool_names=names)
        # From here on synchronous: the turn is appended whole or (cancelled above) not at all.
        self._inflight = None
        result.messages.append(assistant)
        result.messages.extend(turn_messages)
