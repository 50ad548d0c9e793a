"""Bounded cleanup: the one place that shields, bounds and reports a cleanup step.

Every cleanup step runs in :func:`cleanup_scope`: shielded from the caller's cancellation and
bounded by its own deadline, an overrun logged. The owner of a resource bounds it; nobody adds
a second bound. Why: docs/architecture.md, "Cleanup: shielded and bounded".
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
    """What :func:`cleanup_scope` yields: the step's shielded scope and ``overran``."""

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

    For an acquisition the caller must own once it exists (a host process, a remote create). The
    caller's cancellation arrives at its next checkpoint. The one other place that shields.
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

    ``what`` and ``reason`` name the step and its cause in the overrun warning; ``timeout`` may
    be ``math.inf`` only for in-memory steps. Yields a :class:`_CleanupOverrun`.

    Raises:
        ValueError: ``timeout`` is negative or NaN.

    **Cancellation**: the body runs until ``timeout``; the caller's cancellation comes after.
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
    """Await ``step()`` in :func:`cleanup_scope`; log (WARNING) and drop what it raises.

    For cleanup whose failure must not mask the outcome before it. Returns ``step()``'s result,
    or ``None`` if it raised or overran.

    **Cancellation**: as :func:`cleanup_scope`; cancellation is never swallowed.
    """
    with cleanup_scope(what, timeout, reason=reason, log=log):
        try:
            return await step()
        except Exception as exc:  # cleanup must not mask the outcome it follows
            (log or logger).warning("cleanup failed: %s: %s: %s", what, type(exc).__name__, exc)
    return None
