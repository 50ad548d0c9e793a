"""Running one turn's tool calls: in order by default, in parallel on request, started early.

The agent loop submits each tool call the moment it is known (in Phase 2: the moment the parser
seals it, while the model is still generating). :class:`TurnToolRunner` starts it at once — or,
in sequential mode, as soon as the previous call of the same turn has finished — and keeps the
outcomes in call order, so the tool messages appended afterwards are in the order the model wrote
the calls, whatever order they finished in.

All tasks live in the task group the caller passes in; the caller's scope owns them, so a
deadline or a cancellation of the turn cancels running tools too (their handlers kill their
process groups on the way out).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from hermes_async.tools.registry import ToolOutcome, ToolRegistry, ToolRuntime, dispatch

__all__ = ["PendingCall", "TurnToolRunner"]


@dataclass(slots=True)
class PendingCall:
    """One tool call of the current turn and, once done, its outcome."""

    index: int
    call_id: str
    name: str
    arguments: str
    submitted_at: float
    started_at: float | None = None
    outcome: ToolOutcome | None = None
    done: anyio.Event = field(default_factory=anyio.Event)


class TurnToolRunner:
    """Start tool calls as they are submitted; collect outcomes in submission order.

    Args:
        tg: The task group the calls run in (owned by the caller's turn).
        runtime: The rollout's tool runtime.
        registry: Where tools come from.
        valid_names: Names the model was offered.
        timeout: Per-call deadline in seconds (``None``: no per-call deadline).
        parallel: Run calls of one turn concurrently instead of one after another.
    """

    def __init__(
        self,
        tg: TaskGroup,
        runtime: ToolRuntime,
        *,
        registry: ToolRegistry | None,
        valid_names: Iterable[str],
        timeout: float | None,
        parallel: bool = False,
    ) -> None:
        self._tg = tg
        self._runtime = runtime
        self._registry = registry
        self._valid = set(valid_names)
        self._timeout = timeout
        self._parallel = parallel
        self.calls: list[PendingCall] = []

    def submit(self, call_id: str, name: str, arguments: str) -> PendingCall:
        """Start (or queue behind the previous call) one tool call; return its record."""
        previous = self.calls[-1] if self.calls and not self._parallel else None
        call = PendingCall(len(self.calls), call_id, name, arguments, anyio.current_time())
        self.calls.append(call)
        self._tg.start_soon(self._run, call, previous, name=f"tool {name} #{call.index}")
        return call

    def reject(self, call_id: str, name: str, arguments: str, error: str) -> PendingCall:
        """Record a call that must not run (malformed, or cut off by ``max_tokens``).

        It keeps its place in the turn's order, and the model is shown ``{"error": error}`` as
        its result, like any other failed call.
        """
        now = anyio.current_time()
        content = json.dumps({"error": error}, ensure_ascii=False)
        call = PendingCall(len(self.calls), call_id, name, arguments, now, now)
        call.outcome = ToolOutcome(content, error)
        call.done.set()
        self.calls.append(call)
        return call

    async def _run(self, call: PendingCall, previous: PendingCall | None) -> None:
        if previous is not None:
            await previous.done.wait()
        call.started_at = anyio.current_time()
        try:
            call.outcome = await dispatch(
                call.name,
                call.arguments,
                self._runtime,
                registry=self._registry,
                valid_names=self._valid,
                timeout=self._timeout,
            )
        finally:
            call.done.set()

    async def wait(self) -> list[PendingCall]:
        """Wait until every submitted call has finished; return them in submission order.

        **Cancellation**: the calls run in the caller's task group; cancelling it cancels them.
        """
        for call in self.calls:
            await call.done.wait()
        return list(self.calls)
