"""Bounded cleanup: the one place that shields, bounds and reports a cleanup step.

Cleanup in an async library has two failure modes, and this helper exists to rule out both:

* **skipped** — a cancellation reaches the cleanup's first ``await`` and the resource leaks
  (the reference skipped sandbox release on cancellation);
* **hung** — a shielded wait on something external (a container engine, a remote API, a
  socket) never returns, so the cancellation that started the cleanup never completes.

So every cleanup step in ``hermes_async`` runs inside :func:`cleanup_scope`: shielded from the
caller's cancellation *and* bounded by its own deadline, with an overrun logged (what was
abandoned, after how long, and why the cleanup ran). A bare ``CancelScope(shield=True)`` around
an await the library does not control is a bug; so is a second bound around a step that is
already bounded (the inner deadline is the real one, the outer only hides it).

Who bounds: the function that *owns* the resource. ``SandboxManager.release`` bounds a
sandbox's close; its callers (the loop, the rollout pipeline, ``ToolContext``) call it without a
bound of their own. The shield is entered before the first ``await`` of the step, so a caller
that is already cancelled still gets the whole step.

Why a deadline per step rather than one per teardown: a stuck close of one sandbox must not eat
the budget of the next one's; the caller's total is the sum of its steps' bounds, which each
owner documents next to its default.

Cancellation reasons: library code that cancels a scope says why
(``scope.cancel(reason)``), so a traceback or a log line names the cause (a deadline, a sibling's
failure, a closing manager) instead of a bare ``Cancelled``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio

__all__ = ("acquisition_scope", "bounded_cleanup", "cleanup_scope")

logger = logging.getLogger("hermes_async.cleanup")

T = TypeVar("T")


class _CleanupOverrun:
    """What :func:`cleanup_scope` yields: the step's scope and whether it ran out of time.

    Attributes:
        what: The step's description (``"release sandbox task-1"``).
        timeout: Its deadline in seconds.
        scope: The underlying shielded, bounded :class:`anyio.CancelScope`.
    """

    __slots__ = ("scope", "timeout", "what")

    def __init__(self, what: str, timeout: float, scope: anyio.CancelScope) -> None:
        self.what = what
        self.timeout = timeout
        self.scope = scope

    @property
    def overran(self) -> bool:
        """True if the step was abandoned at its deadline."""
        return self.scope.cancelled_caught


@contextmanager
def acquisition_scope(timeout: float) -> Iterator[anyio.CancelScope]:
    """A step that must not be cut in half: shielded, failing with ``TimeoutError`` at ``timeout``.

    Not a cleanup but an acquisition whose result the caller must own once it exists: starting
    a host process (asyncio leaks a half-built subprocess transport), a remote create whose id
    only the reply carries, a remote ``mktemp`` a closed channel would not stop. The caller's
    cancellation is delivered at its next checkpoint after the block, when it can release what
    it acquired. The one place such a shield is written (``tests/test_cleanup.py`` checks no
    other module writes ``shield=True``).
    """
    if not timeout > 0:
        raise ValueError(f"acquisition timeout must be > 0 seconds, got {timeout!r}")
    with anyio.fail_after(timeout, shield=True) as scope:
        yield scope


@contextmanager
def cleanup_scope(
    what: str,
    timeout: float,
    *,
    reason: str | None = None,
    log: logging.Logger | None = None,
) -> Iterator[_CleanupOverrun]:
    """Run the body shielded from outer cancellation and bounded by ``timeout`` seconds.

    Args:
        what: The step, for the overrun log line (``"close sandbox task-1"``).
        timeout: The step's deadline in seconds (``math.inf``: shielded, unbounded — only for
            steps that cannot block on anything external, such as in-memory bookkeeping).
        reason: Why the cleanup runs (``"rollout cancelled"``, ``"manager closing"``), for the
            log line.
        log: Logger for the overrun warning (default ``hermes_async.cleanup``).

    Yields:
        A :class:`_CleanupOverrun`; ``.overran`` tells afterwards whether the deadline passed.

    Raises:
        ValueError: ``timeout`` is negative or NaN.

    **Cancellation**: the body is not interrupted by the caller's cancellation; it is
    interrupted at ``timeout``, logged, and the caller's cancellation (if any) is then delivered
    at its next checkpoint as usual.
    """
    if not timeout >= 0:  # also rejects NaN
        raise ValueError(f"cleanup timeout must be >= 0 seconds, got {timeout!r} for {what}")
    with anyio.move_on_after(timeout, shield=True) as scope:
        step = _CleanupOverrun(what, timeout, scope)
        yield step
    if scope.cancelled_caught and not math.isinf(timeout):
        (log or logger).warning(
            "cleanup overran its deadline and was abandoned: %s (after %g s%s)",
            what,
            timeout,
            f"; cleanup because: {reason}" if reason else "",
        )


async def bounded_cleanup(
    what: str,
    step: Callable[[], Awaitable[T]],
    *,
    timeout: float,
    reason: str | None = None,
    log: logging.Logger | None = None,
) -> T | None:
    """Await ``step()`` inside :func:`cleanup_scope`; log and swallow what it raises.

    For cleanup whose failure must not mask the outcome it follows (a release after a rollout,
    closing a pool after a request): the exception is logged at WARNING with ``what`` and
    dropped. Use :func:`cleanup_scope` directly where the caller must see the exception.

    Returns:
        ``step()``'s result, or ``None`` if it raised or overran.

    **Cancellation**: as :func:`cleanup_scope`; the caller's own cancellation is delivered
    afterwards. Cancellation is never swallowed: only ``Exception`` subclasses are.
    """
    with cleanup_scope(what, timeout, reason=reason, log=log):
        try:
            return await step()
        except Exception as exc:  # cleanup must not mask the outcome it follows
            (log or logger).warning("cleanup failed: %s: %s: %s", what, type(exc).__name__, exc)
    return None
