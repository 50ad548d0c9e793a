"""Retry decisions for model-server requests: pure functions over a typed outcome.

One attempt ends in an *outcome*: a transport failure (the typed errors of
:mod:`~hermes_async.inference._transport`) or an HTTP error status (:class:`HTTPStatus`).
:func:`decide_retry` turns it, with the attempt count and the time left, into
:class:`Retry` (after a delay) or :class:`GiveUp` (with a note for the error message). The async
shell (``ServerConnection``) only sends, sleeps and raises.

The rules, and why:

* connection failures (refused, reset, closed before any response byte), HTTP 429 and 5xx are
  retried with exponential back-off and jitter: nothing was received, or the server said
  "later";
* a kept-alive connection found closed as it was reused is retried at once on a new one, with
  no back-off and no attempt used (bounded by :data:`MAX_STALE_RETRIES`): it says nothing about
  the server. Seen at 2000 concurrent rollouts against a 5 s keep-alive;
* never retried: other 4xx (repeating a bad request cannot help), timeouts (the deadline is
  the caller's budget, already spent), a cut or invalid response, and anything once a
  response body started (tokens may already have been handed out).
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
MAX_STALE_RETRIES = 8


#: A back-off multiplier: a finite number >= 1.
_GROWTH = Requirement(
    lambda v: AT_LEAST_ONE.test(v) and NON_NEGATIVE_FINITE.test(v), ">= 1 and finite"
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how long to wait before retrying a failed request.

    Retried: connection failures (refused, reset, closed before any response), HTTP 429 and
    HTTP 5xx. Never retried: other 4xx, timeouts, and anything once a response body started
    (tokens may already have been handed out).

    Attributes:
        max_attempts: Total attempts, the first included (4: three retries, ~1.75 s of back-off
            with the defaults, enough to ride out a server restart's connection refusals).
        initial_backoff_seconds: Delay before the first retry.
        max_backoff_seconds: Cap on one delay.
        multiplier: Growth of the delay per attempt.
        jitter: Fraction of each delay that is random (0.5: a delay ``d`` becomes uniform in
            ``[d/2, d]``), so clients that failed together do not retry together.
        max_retry_after_seconds: A ``Retry-After`` longer than this is not waited for; the
            error is raised at once (a server asking for minutes is not coming back soon).
    """

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
        """Delay before the next attempt: ``Retry-After`` when the server gave one (plus a
        little jitter), else the exponential back-off."""
        if retry_after is not None:
            return retry_after + self.initial_backoff_seconds * self.jitter * rng.random()
        return self.backoff(attempt, rng)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date).

    Fractional seconds are accepted (not in the RFC, but harmless and handy in tests). Returns
    ``None`` when the header is absent or unreadable, 0 for a date in the past.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
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
        status: The status code.
        reason: The status line's reason text.
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
    """Try again after ``delay`` seconds.

    Attributes:
        delay: Seconds to wait first.
        uses_attempt: False for the immediate retry after a stale kept-alive connection.
    """

    delay: float
    uses_attempt: bool = True


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Raise the outcome's error now.

    Attributes:
        note: Why no retry, appended to the error message (empty for outcomes that are never
            retried).
    """

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
        outcome: How the attempt ended.
        attempt: The attempt that just failed (1-based; stale retries do not count).
        stale_retries: Immediate stale-connection retries made so far for this request.
        policy: The retry policy.
        remaining_seconds: Time left before the request deadline.
        request_timeout: The whole request deadline (for the message).
        rng: Random source of the back-off jitter.
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
