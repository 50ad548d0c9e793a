"""The start ramp: at most :data:`STARTS_PER_PASS` rollouts begin per pass of the event loop.

A caller may start thousands of rollouts in one pass (``start_soon`` in a loop). Each then does
its set-up (sandbox manager, spans, scopes, first prompt) in the next pass, all in the same one:
20,000 stalled the loop for over a second (``bench/concurrency.py``). Entering the ramp is the
first thing a rollout does, so a waiting rollout costs the pass one limiter wait and nothing
more. Work started inside an admitted rollout (a group's rollouts, a run inside
``run_rollout``) is not held back again.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType

import anyio
from anyio.lowlevel import RunVar

__all__ = ("STARTS_PER_PASS", "StartRamp", "start_gate")

#: Rollouts (or groups) admitted per pass of the event loop.
STARTS_PER_PASS = 32
_GATE: RunVar[anyio.CapacityLimiter] = RunVar("hermes_async.start_ramp")
_ADMITTED: ContextVar[bool] = ContextVar("hermes_async.start_ramp.admitted", default=False)


def start_gate() -> anyio.CapacityLimiter:
    """This event loop's start gate (one per loop: the stall is the loop's)."""
    try:
        return _GATE.get()
    except LookupError:
        gate = anyio.CapacityLimiter(STARTS_PER_PASS)
        _GATE.set(gate)
        return gate


class StartRamp:
    """Wait for this rollout's turn to begin; the rest of the block runs admitted."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token: Token[bool] | None = None

    async def __aenter__(self) -> None:
        if _ADMITTED.get():
            return
        # Released at once: a release hands the slot to one waiter, for the next pass.
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
