"""Server-pool decisions, free of I/O: where a session goes, how much a server may take, when a
server is out.

Placement is bounded-load consistent hashing, concurrency per server is AIMD, health is
ejection with doubling backoff. :mod:`~hermes_async.inference.pool` is the async shell; the
design and its numbers are docs/decisions/050-server-pool.md.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ("AdaptiveLimit", "HashRing", "Health", "MemberState", "Route", "choose_member", "route")

#: Points per server on the hash ring: with 64, the share of keys per server of a 4-server
#: pool stays within a few percent of 1/4 (more points: smoother, a longer ring to bisect).
_RING_REPLICAS = 64

#: Successful requests after a readmission that clear a server's ejection history.
_HEALTHY_STREAK = 20


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


class HashRing:
    """The consistent-hash ring of a pool's servers.

    Raises:
        ValueError: No names, a duplicate name, or ``replicas`` < 1.
    """

    def __init__(self, names: Sequence[str], replicas: int = _RING_REPLICAS) -> None:
        if not names:
            raise ValueError("a hash ring needs at least one server")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate server in the pool: {sorted(names)}")
        if replicas < 1:
            raise ValueError(f"ring replicas must be >= 1, got {replicas!r}")
        points = sorted(
            (_hash(f"{name}#{r}"), index)
            for index, name in enumerate(names)
            for r in range(replicas)
        )
        self._points = [p for p, _ in points]
        self._owners = [i for _, i in points]
        self.size = len(names)

    def order(self, key: str) -> list[int]:
        """Every server index once, in ring order from ``key``'s point."""
        start = bisect.bisect(self._points, _hash(key))
        n = len(self._points)
        seen: list[int] = []
        for step in range(n):
            owner = self._owners[(start + step) % n]
            if owner not in seen:
                seen.append(owner)
                if len(seen) == self.size:
                    break
        return seen


def choose_member(
    order: Sequence[int],
    loads: Sequence[int],
    weights: Sequence[float],
    eligible: Sequence[bool],
    load_factor: float,
) -> int | None:
    """The first eligible server in ``order`` whose load stays within its bound, or ``None``.

    Args:
        order: Server indices in preference order.
        loads: Live sessions per server.
        weights: Each server's share weight (its current concurrency limit).
        eligible: Which servers may take the session.
        load_factor: How far over its fair share a server may go (>= 1).
    """
    candidates = [i for i in order if eligible[i]]
    if not candidates:
        return None
    total = sum(loads[i] for i in candidates) + 1
    weight = sum(weights[i] for i in candidates) or float(len(candidates))
    for i in candidates:
        share = (weights[i] or 1.0) / weight
        if loads[i] + 1 <= load_factor * total * share:
            return i
    # Nobody within the real-valued bound (only at small loads): the least-loaded server.
    return min(candidates, key=lambda i: (loads[i] + 1) / (weights[i] or 1.0))


@dataclass(slots=True)
class AdaptiveLimit:
    """AIMD concurrency limit of one server.

    Attributes:
        value: The limit as a float (additive increase adds ``1/limit`` per success).
        decrease_interval: Shortest time between two decreases (seconds).
    """

    minimum: int
    maximum: int
    value: float
    decrease_factor: float = 0.5
    decrease_interval: float = 1.0
    hold_until: float = -math.inf

    @property
    def current(self) -> int:
        """The limit to enforce now."""
        return max(self.minimum, min(self.maximum, int(self.value)))

    def increase(self, now: float) -> bool:
        """One success. Returns whether :attr:`current` changed."""
        if self.value >= self.maximum or now < self.hold_until:
            return False
        before = self.current
        self.value = min(float(self.maximum), self.value + 1.0 / max(self.value, 1.0))
        return self.current != before

    def decrease(self, now: float, hold: float = 0.0) -> bool:
        """A congestion signal: multiplicative decrease, unless one happened within the hold.

        ``hold`` is the server's ``Retry-After``, if longer than the interval. Returns whether
        :attr:`current` changed.
        """
        if now < self.hold_until:
            return False
        before = self.current
        self.value = max(float(self.minimum), self.value * self.decrease_factor)
        self.hold_until = now + max(self.decrease_interval, hold)
        return self.current != before


HealthState = Literal["up", "ejected", "probing"]


@dataclass(slots=True)
class Health:
    """Ejection state of one server.

    Attributes:
        state: ``up``, ``ejected`` (waiting out its time) or ``probing``.
        failures: Consecutive failures so far.
        streak: Ejections in a row (sets the next ejection's length).
    """

    eject_after: int = 3
    base_seconds: float = 1.0
    max_seconds: float = 30.0
    state: HealthState = "up"
    failures: int = 0
    streak: int = 0
    successes: int = 0
    ejected_until: float = -math.inf
    ejections: int = 0
    first_ejected_at: float | None = None

    def record_success(self) -> None:
        self.failures = 0
        self.successes += 1
        if self.successes >= _HEALTHY_STREAK:
            self.streak = 0

    def record_failure(self, now: float, *, may_eject: bool) -> bool:
        """A request failed; returns True if that ejected the server."""
        self.failures += 1
        self.successes = 0
        if self.state == "up" and self.failures >= self.eject_after and may_eject:
            self.eject(now)
            return True
        return False

    def eject(self, now: float) -> None:
        self.streak += 1
        self.ejections += 1
        if self.first_ejected_at is None:
            self.first_ejected_at = now
        seconds = min(self.max_seconds, self.base_seconds * 2 ** (self.streak - 1))
        self.state = "ejected"
        self.ejected_until = now + seconds
        self.failures = 0

    def probe_due(self, now: float) -> bool:
        """The ejection is over: time to probe."""
        return self.state == "ejected" and now >= self.ejected_until

    def probe_result(self, ok: bool, now: float) -> None:
        """Readmit (half-open: one more failure ejects again) or eject once more."""
        if ok:
            self.state = "up"
            self.failures = self.eject_after - 1
            self.successes = 0
        else:
            self.eject(now)


@dataclass(slots=True)
class MemberState:
    """Everything the pool decides about one server.

    Attributes:
        name: The server's (redacted) URL.
        cool_until: No request is sent before this clock time (a 429's ``Retry-After``).
        sessions: Live sessions homed here.
        failures: Attempts that failed (any reason but cancellation).
        limit_trace: ``(clock time, limit)`` at every change of the enforced limit (bounded).
    """

    name: str
    limit: AdaptiveLimit
    health: Health
    cool_until: float = -math.inf
    sessions: int = 0
    requests: int = 0
    failures: int = 0
    rate_limited: int = 0
    limit_trace: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=10_000))

    def eligible(self, now: float) -> bool:
        """Up and not cooling down."""
        return self.health.state == "up" and now >= self.cool_until

    def state(self, now: float) -> str:
        if self.health.state != "up":
            return self.health.state
        return "cooling" if now < self.cool_until else "up"


@dataclass(frozen=True, slots=True)
class Route:
    """Where the next attempt goes.

    Attributes:
        member: The server index, or ``None``: nobody can take it before ``wait_until``.
        rehome: The session's home becomes ``member``.
    """

    member: int | None
    rehome: bool = False
    wait_until: float = math.inf


def route(
    members: Sequence[MemberState],
    ring: HashRing,
    *,
    now: float,
    key: str | None,
    home: int | None,
    avoid: frozenset[int] | set[int] = frozenset(),
    load_factor: float,
    in_flight: Sequence[int] = (),
) -> Route:
    """Pick the server for a session's next attempt.

    Args:
        key: The session's placement key (``None``: the least-loaded server).
        home: The session's current home, if it has one.
        avoid: Servers that already failed this request (used only if nothing else is eligible).
        in_flight: Requests in flight per server (added to the load of sessionless requests).
    """
    if home is not None and home not in avoid and members[home].eligible(now):
        return Route(home)
    eligible = [m.eligible(now) and i not in avoid for i, m in enumerate(members)]
    if not any(eligible):  # every eligible server failed this request already
        if home is not None and members[home].eligible(now):
            return Route(home)
        eligible = [m.eligible(now) for m in members]
    rehome = home is None or members[home].health.state != "up"
    weights = [float(m.limit.current) for m in members]
    chosen: int | None
    if key is None:
        loads = [m.sessions + (in_flight[i] if in_flight else 0) for i, m in enumerate(members)]
        candidates = [i for i, ok in enumerate(eligible) if ok]
        chosen = (
            min(candidates, key=lambda i: (loads[i] + 1) / (weights[i] or 1.0))
            if candidates
            else None
        )
    else:
        loads = [m.sessions for m in members]
        chosen = choose_member(ring.order(key), loads, weights, eligible, load_factor)
    if chosen is not None:
        return Route(chosen, rehome=rehome)
    up = [m for m in members if m.health.state == "up"]
    if up:  # everyone up is cooling down: wait for the first
        return Route(None, wait_until=min(m.cool_until for m in up))
    # Every server is out (the pool never ejects the last one, so only a race gets here):
    # try the one whose ejection ends first rather than fail without trying.
    first = min(range(len(members)), key=lambda i: members[i].health.ejected_until)
    return Route(first, rehome=rehome)
