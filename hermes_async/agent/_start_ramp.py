"""Rollouts started together begin a few per pass of the event loop.

A caller may start thousands of rollouts in one pass (``start_soon`` in a loop). Each would then
do its set-up (sandbox manager, spans, scopes) and render its first prompt in the same next
pass: 20,000 stalled the loop for seconds (``bench/concurrency.py``). Two gates, one per event
loop, spread that out. A holder does its step without awaiting and releases; a release hands
the slot to one waiter, for the next pass:

* :class:`StartRamp`, the first thing a rollout does: at most :data:`STARTS_PER_PASS` begin
  per pass, and a waiting rollout costs the pass one limiter wait. Work started inside an
  admitted rollout (a group's rollouts, a run inside ``run_rollout``) is not held back again.
* :func:`first_prompt_gate`, around the token path's first render and encode: at most
  :data:`FIRST_PROMPTS_PER_PASS` per pass.

The gates cannot shorten the caller's own pass of ``start_soon`` calls; the library's batch
starters pace theirs (:func:`hermes_async._paced.start_paced`).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType

import anyio
from anyio.lowlevel import RunVar

from hermes_async._paced import STARTS_PER_PASS

__all__ = (
    "FIRST_PROMPTS_PER_PASS",
    "STARTS_PER_PASS",
    "StartRamp",
    "first_prompt_gate",
    "start_gate",
)

#: First prompts rendered and encoded per pass of the event loop.
FIRST_PROMPTS_PER_PASS = 32
_START_GATE: RunVar[anyio.CapacityLimiter] = RunVar("hermes_async.start_gate")
_FIRST_PROMPT_GATE: RunVar[anyio.CapacityLimiter] = RunVar("hermes_async.first_prompt_gate")
_ADMITTED: ContextVar[bool] = ContextVar("hermes_async.start_ramp.admitted", default=False)


def _loop_gate(var: RunVar[anyio.CapacityLimiter], total: int) -> anyio.CapacityLimiter:
    # One per event loop: the stall is the loop's.
    try:
        return var.get()
    except LookupError:
        gate = anyio.CapacityLimiter(total)
        var.set(gate)
        return gate


def start_gate() -> anyio.CapacityLimiter:
    """This event loop's gate of rollout starts."""
    return _loop_gate(_START_GATE, STARTS_PER_PASS)


def first_prompt_gate() -> anyio.CapacityLimiter:
    """This event loop's gate of first prompts."""
    return _loop_gate(_FIRST_PROMPT_GATE, FIRST_PROMPTS_PER_PASS)


class StartRamp:
    """Wait for this rollout's turn to begin; the rest of the block runs admitted."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token: Token[bool] | None = None

    async def __aenter__(self) -> None:
        if _ADMITTED.get():
            return
        async with start_gate():
            pass
        self._token = _ADMITTED.set(True)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _ADMITTED.reset(self._token)
            self._token = None
