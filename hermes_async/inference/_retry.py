"""Retry decisions for model-server requests: pure functions over a typed outcome.

:func:`decide_retry` turns an attempt's outcome into :class:`Retry` or :class:`GiveUp`; the
async shell (``ServerConnection``) only sends, sleeps and raises. Retried: connection failures,
429 and 5xx (nothing was received, or the server said "later"). Never retried: other 4xx, timeouts
(the caller's budget is spent), and anything once a body started (tokens may be out).
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

from hermes_async._checks import AT_LEAST_ONE, NON_NEGATIVE_FINITE, Requirement, check_fields
from hermes_async.inference._transport import (
    ClosedBeforeResponse,
    ConnectFailed,
    TransportError,
)

__all__ = (
    "MAX_STALE_RETRIES",
    "GiveUp",
    "HTTPStatus",
    "Outcome",
    "Retry",
    "RetryPolicy",
    "decide_retry",
    "parse_retry_after",
)

#: Immediate retries per request after a kept-alive connection turned out closed.
# A kept-alive connection found closed on reuse says nothing about the server: retried at once,
# on a new connection, with no attempt used. Seen at 2000 concurrent rollouts, 5 s keep-alive.
MAX_STALE_RETRIES = 8


#: A back-off multiplier: a finite number >= 1.
_GROWTH = Requirement(
    lambda v: AT_LEAST_ONE.test(v) and NON_NEGATIVE_FINITE.test(v), ">= 1 and finite"
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how long to wait before retrying a failed request.

    Attributes:
        max_attempts: Total attempts, the first included.
        jitter: Fraction of each delay that is random (0.5: ``d`` becomes uniform in
            ``[d/2, d]``), so clients that failed together do not retry together.
        max_retry_after_seconds: A longer ``Retry-After`` is not waited for: the error is
            raised at once.
    """

    # Three retries, ~1.75 s of back-off: enough to ride out a server restart's refusals.
    max_attempts: int = 4
    initial_backoff_seconds: float = 0.25
    max_backoff_seconds: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_retry_after_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter!r}")
        seconds = ("initial_backoff_seconds", "max_backoff_seconds", "max_retry_after_seconds")
        check_fields(self, seconds, NON_NEGATIVE_FINITE, error=ValueError)
        # Below 1 the delay would shrink each attempt: retries hammering a struggling server.
        check_fields(self, ("multiplier",), _GROWTH, error=ValueError)

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Delay after failed attempt number ``attempt`` (1-based), jitter applied."""
        delay = min(
            self.max_backoff_seconds,
            self.initial_backoff_seconds * self.multiplier ** (attempt - 1),
        )
        return delay * (1.0 - self.jitter * rng.random())

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Delay before the next attempt: ``Retry-After`` (plus jitter), else the back-off."""
        if retry_after is not None:
            return retry_after + self.initial_backoff_seconds * self.jitter * rng.random()
        return self.backoff(attempt, rng)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` (delta-seconds or HTTP date); ``None`` if unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, OverflowError):  # a year past a C int: OverflowError
            return None
        current = time.time() if now is None else now
        return max(0.0, when.timestamp() - current)
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return seconds


@dataclass(frozen=True, slots=True)
class HTTPStatus:
    """An attempt that got an HTTP error status (>= 400).

    Attributes:
        retry_after: Seconds the server asked to wait (429 and 503 only), if it said.
        body: The start of the response body, for the error message.
    """

    status: int
    reason: str = ""
    retry_after: float | None = None
    body: str = ""

    @property
    def retryable(self) -> bool:
        """429 or 5xx: the server may answer differently later."""
        return self.status == 429 or self.status >= 500


#: What one attempt can end in, short of success.
Outcome = TransportError | HTTPStatus


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again after ``delay`` seconds (``uses_attempt`` False after a stale connection)."""

    delay: float
    uses_attempt: bool = True


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Raise the outcome's error now; ``note`` says why no retry."""

    note: str = ""


def _retryable(outcome: Outcome) -> bool:
    if isinstance(outcome, HTTPStatus):
        return outcome.retryable
    return isinstance(outcome, ConnectFailed | ClosedBeforeResponse)


def decide_retry(
    outcome: Outcome,
    *,
    attempt: int,
    stale_retries: int,
    policy: RetryPolicy,
    remaining_seconds: float,
    request_timeout: float,
    rng: random.Random,
) -> Retry | GiveUp:
    """Whether, and when, to retry after ``outcome`` ended attempt number ``attempt``.

    Args:
        attempt: The attempt that just failed (1-based; stale retries do not count).
        stale_retries: Immediate stale-connection retries made so far for this request.
        remaining_seconds: Time left before the request deadline.
        request_timeout: The whole request deadline (for the message).
    """
    if not _retryable(outcome):
        return GiveUp()
    if (
        isinstance(outcome, ClosedBeforeResponse)
        and outcome.reused
        and stale_retries < MAX_STALE_RETRIES
    ):
        return Retry(0.0, uses_attempt=False)
    if attempt >= policy.max_attempts:
        return GiveUp(f" (gave up after {attempt} attempts)")
    retry_after = outcome.retry_after if isinstance(outcome, HTTPStatus) else None
    if retry_after is not None and retry_after > policy.max_retry_after_seconds:
        return GiveUp(
            f" (Retry-After asks for {retry_after:g} s, more than "
            f"max_retry_after_seconds={policy.max_retry_after_seconds:g}; not waiting)"
        )
    delay = policy.delay(attempt, retry_after, rng)
    if delay >= remaining_seconds:
        return GiveUp(
            f" (next retry in {delay:.2g} s would pass the request deadline of "
            f"{request_timeout:g} s)"
        )
    return Retry(delay)
