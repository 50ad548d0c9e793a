"""Named, resizable, observable capacity limiters, and an event-loop lag monitor.

Each shared resource is gated by one named limiter on a :class:`Limits` object passed down
explicitly, never global, so two environments never share capacity by accident. The
defaults and their measurements: ``docs/decisions/002-limiter-defaults.md``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import overload

import anyio
from anyio.abc import TaskStatus

from hermes_async.errors import ConfigError, LimitError, UnknownLimiterError
from hermes_async.telemetry import observe_limits

__all__ = (
    "DEFAULT_LIMITS",
    "LagMonitor",
    "LagStatistics",
    "LimiterStatistics",
    "Limits",
    "NamedLimiter",
    "open_lag_monitor",
)

#: Default totals per named limiter (why: docs/decisions/002-limiter-defaults.md).
DEFAULT_LIMITS: dict[str, int] = {
    "model_requests": 64,
    "sandbox_create": 16,
    "sandbox_exec": 128,
    "tool_calls": 128,
}


@dataclass(frozen=True, slots=True)
class LimiterStatistics:
    """A snapshot of one limiter: capacity, slots in use, waiters, and wait times in seconds."""

    name: str
    total: int
    in_use: int
    waiting: int
    acquisitions: int
    total_wait_seconds: float
    max_wait_seconds: float


class NamedLimiter:
    """A capacity limiter with a name, run-time resizing and wait statistics.

    Use it as ``async with limits.tool_calls: ...``. Acquiring the same limiter twice from
    one task is a ``RuntimeError`` from anyio (it would deadlock at capacity).

    Raises:
        LimitError: ``total`` is not an integer >= 1.
    """

    def __init__(self, name: str, total: int) -> None:
        _check_total(name, total)
        self.name = name
        self._limiter = anyio.CapacityLimiter(total)
        self._acquisitions = 0
        self._total_wait = 0.0
        self._max_wait = 0.0

    @property
    def total(self) -> int:
        """Current capacity."""
        return int(self._limiter.total_tokens)

    @property
    def capacity_limiter(self) -> anyio.CapacityLimiter:
        """The underlying anyio limiter, for APIs that take one (``anyio.to_thread``)."""
        return self._limiter

    def set_total(self, total: int) -> None:
        """Resize the limiter while it is in use.

        Waiters are admitted at once if it grew; holders keep their slots if it shrank.

        Raises:
            LimitError: ``total`` is not an integer >= 1.
        """
        _check_total(self.name, total)
        self._limiter.total_tokens = total

    async def __aenter__(self) -> float:
        """Wait for a slot; return how long the wait took, in seconds.

        **Cancellation**: if cancelled while waiting, no slot is held.
        """
        start = anyio.current_time()
        await self._limiter.acquire()
        waited = anyio.current_time() - start
        self._acquisitions += 1
        self._total_wait += waited
        self._max_wait = max(self._max_wait, waited)
        return waited

    async def __aexit__(self, *exc_info: object) -> None:
        # Not an AsyncResource: leaving releases one slot, it does not close the limiter.
        self._limiter.release()

    def statistics(self) -> LimiterStatistics:
        """Return a snapshot of capacity, use and waits."""
        stats = self._limiter.statistics()
        return LimiterStatistics(
            name=self.name,
            total=self.total,
            in_use=int(stats.borrowed_tokens),
            waiting=stats.tasks_waiting,
            acquisitions=self._acquisitions,
            total_wait_seconds=self._total_wait,
            max_wait_seconds=self._max_wait,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return f"NamedLimiter({s.name!r}, total={s.total}, in_use={s.in_use}, waiting={s.waiting})"


def _check_total(name: str, total: int) -> None:
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise LimitError(
            f"limiter {name!r}: total must be an integer >= 1, got {total!r}",
            limiter=name,
            value=total,
        )


class _Standard:
    """A read-only attribute of :class:`Limits` for one of the four standard limiters."""

    def __set_name__(self, owner: type[Limits], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type[Limits]) -> _Standard: ...
    @overload
    def __get__(self, obj: Limits, owner: type[Limits]) -> NamedLimiter: ...
    def __get__(self, obj: Limits | None, owner: type[Limits]) -> NamedLimiter | _Standard:
        return self if obj is None else obj[self._name]

    def __set__(self, obj: Limits, value: object) -> None:
        raise AttributeError(
            f"Limits.{self._name} is read-only; resize it with limits.resize({self._name!r}, n)"
        )


class Limits:
    """The set of named limiters one environment (or one test) shares across its rollouts.

    The four standard limiters are attributes; more can be added by keyword and reached
    with ``limits["name"]``.
    """

    def __init__(
        self,
        *,
        model_requests: int = DEFAULT_LIMITS["model_requests"],
        sandbox_create: int = DEFAULT_LIMITS["sandbox_create"],
        sandbox_exec: int = DEFAULT_LIMITS["sandbox_exec"],
        tool_calls: int = DEFAULT_LIMITS["tool_calls"],
        **extra: int,
    ) -> None:
        self._limiters: dict[str, NamedLimiter] = {}
        for name, total in {
            "model_requests": model_requests,
            "sandbox_create": sandbox_create,
            "sandbox_exec": sandbox_exec,
            "tool_calls": tool_calls,
            **extra,
        }.items():
            self._limiters[name] = NamedLimiter(name, total)
        observe_limits(self)  # metrics for every limiter, when an OpenTelemetry SDK is set

    model_requests = _Standard()
    sandbox_create = _Standard()
    sandbox_exec = _Standard()
    tool_calls = _Standard()

    def __getitem__(self, name: str) -> NamedLimiter:
        """The limiter called ``name``.

        Raises:
            UnknownLimiterError: No such limiter (a ``KeyError`` and a ``ConfigError``).
        """
        try:
            return self._limiters[name]
        except KeyError:
            raise UnknownLimiterError(name, self._limiters) from None

    def __iter__(self) -> Iterator[NamedLimiter]:
        return iter(self._limiters.values())

    def add(self, name: str, total: int) -> NamedLimiter:
        """Add a named limiter (or return the existing one with that name, resized)."""
        if name in self._limiters:
            self._limiters[name].set_total(total)
        else:
            self._limiters[name] = NamedLimiter(name, total)
        return self._limiters[name]

    def resize(self, name: str, total: int) -> None:
        """Resize the limiter called ``name`` at run time."""
        self[name].set_total(total)

    def statistics(self) -> dict[str, LimiterStatistics]:
        """Snapshot every limiter, keyed by name."""
        return {name: lim.statistics() for name, lim in self._limiters.items()}


# --------------------------------------------------------------------------------------------
# Event-loop lag monitor


@dataclass(frozen=True, slots=True)
class LagStatistics:
    """Event-loop lag measured by a :class:`LagMonitor`, in seconds.

    Lag is how late a timer fired: a blocked event loop shows up as a large maximum.
    """

    samples: int
    p50: float
    p99: float
    max: float

    def __str__(self) -> str:
        return (
            f"loop lag over {self.samples} ticks: p50 {self.p50 * 1e3:.2f} ms, "
            f"p99 {self.p99 * 1e3:.2f} ms, max {self.max * 1e3:.2f} ms"
        )


class LagMonitor:
    """Measure event-loop lag: sleep ``interval`` seconds repeatedly and record the lateness.

    Run it with :func:`open_lag_monitor` or ``await tg.start(monitor.run)``. The last
    ``max_samples`` feed the percentiles. The default 5 ms interval sees a 20 ms stall
    without being one.
    """

    def __init__(self, interval: float = 0.005, *, max_samples: int = 100_000) -> None:
        if not interval > 0:
            raise ConfigError(f"lag monitor interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self._samples: collections.deque[float] = collections.deque(maxlen=max_samples)
        self._max = 0.0
        self._count = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Tick until cancelled.

        **Cancellation**: this is the only way it stops; nothing needs cleaning up.
        """
        task_status.started()
        while True:
            start = anyio.current_time()
            await anyio.sleep(self.interval)
            self.record(max(0.0, anyio.current_time() - start - self.interval))

    def record(self, lag: float) -> None:
        """Record one lateness sample (seconds)."""
        self._samples.append(lag)
        self._count += 1
        self._max = max(self._max, lag)

    def reset(self) -> None:
        """Forget every sample (e.g. after a warm-up phase)."""
        self._samples.clear()
        self._max = 0.0
        self._count = 0

    def samples(self) -> list[float]:
        """The recorded lateness samples (seconds), oldest first (at most ``max_samples``)."""
        return list(self._samples)

    def statistics(self) -> LagStatistics:
        """Return p50/p99/max over the recorded samples (zeros if none)."""
        data = sorted(self._samples)
        if not data:
            return LagStatistics(samples=0, p50=0.0, p99=0.0, max=0.0)
        return LagStatistics(
            samples=self._count,
            p50=_percentile(data, 0.50),
            p99=_percentile(data, 0.99),
            max=self._max,
        )


def _percentile(sorted_data: list[float], q: float) -> float:
    index = min(len(sorted_data) - 1, max(0, math.ceil(q * len(sorted_data)) - 1))
    return sorted_data[index]


@asynccontextmanager
async def open_lag_monitor(interval: float = 0.005) -> AsyncIterator[LagMonitor]:
    """Run a :class:`LagMonitor` for the duration of the ``async with`` block.

    **Cancellation**: the monitor task is cancelled when the block exits, however it exits.
    """
    monitor = LagMonitor(interval)
    async with anyio.create_task_group() as tg:
        await tg.start(monitor.run)
        try:
            yield monitor
        finally:
            tg.cancel_scope.cancel(reason="the lag monitor's block exited")
