"""OpenTelemetry traces and metrics, when opentelemetry-api is installed and a provider is set.

The core depends on nothing here; with no SDK configured nothing is recorded. Also a
Prometheus ``/metrics`` endpoint (:func:`serve_metrics`) and the live status line
(:func:`run_status`, :func:`format_status`, :func:`read_status`), which need no OpenTelemetry.
docs/architecture.md ("Telemetry: spans and metrics") lists every span and metric.
"""

from __future__ import annotations

import itertools
import re
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio
from anyio.abc import TaskStatus

from hermes_async import _otel
from hermes_async._http_serve import serve_get

__all__ = (
    "TELEMETRY_AVAILABLE",
    "LimiterStatus",
    "RunStatus",
    "configure_telemetry",
    "forget_pool",
    "format_status",
    "in_flight",
    "observe_limits",
    "observe_pool",
    "prometheus_text",
    "read_status",
    "record_rollout",
    "run_status",
    "serve_metrics",
    "status_from_prometheus",
    "tracing_enabled",
)

_metrics: Any
try:
    from opentelemetry import metrics as _otel_metrics

    _metrics = _otel_metrics
except ImportError:  # pragma: no cover - exercised where opentelemetry-api is absent
    _metrics = None

#: True when opentelemetry-api can be imported.
TELEMETRY_AVAILABLE = _metrics is not None


class _LimitsLike(Protocol):
    def statistics(self) -> dict[str, Any]: ...


class _PoolLike(Protocol):
    def statistics(self) -> Any: ...


_limits: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_numbers = itertools.count(1)
_meter_provider: Any = None
_instruments: tuple[Any, Any, Any] | None = None  # (provider, rollouts counter, tokens counter)
_in_flight: Counter[str] = Counter()


def configure_telemetry(
    *, tracer_provider: Any = None, meter_provider: Any = None, enabled: bool = True
) -> None:
    """Give hermes_async its own providers (``None``: the global ones).

    Args:
        enabled: ``False`` turns tracing off whatever the providers.

    Raises:
        RuntimeError: opentelemetry-api is not installed (``pip install 'hermes-async[otel]'``).
    """
    global _meter_provider, _instruments
    if not TELEMETRY_AVAILABLE:
        raise RuntimeError(
            "opentelemetry-api is not installed; pip install 'hermes-async[otel]' to trace"
        )
    _otel._set_provider(tracer_provider, disabled=not enabled)
    _meter_provider = meter_provider
    _instruments = None
    _ensure_instruments()


def tracing_enabled() -> bool:
    """True when hermes_async records spans (an SDK provider is configured)."""
    return _otel.tracing()


def observe_limits(limits: _LimitsLike) -> None:
    """Report ``limits``' limiters as metrics while it lives (every ``Limits`` calls it)."""
    if limits not in _limits:
        _limits[limits] = next(_numbers)
    _ensure_instruments()


def observe_pool(pool: _PoolLike) -> None:
    """Report ``pool``'s servers as metrics while it is open (:class:`ServerPool` calls it)."""
    _pools.add(pool)
    _ensure_instruments()


def forget_pool(pool: _PoolLike) -> None:
    """Stop reporting ``pool``."""
    _pools.discard(pool)


def record_rollout(outcome: str, input_tokens: int, output_tokens: int) -> None:
    """Count one finished rollout and its tokens (no-op without a meter provider)."""
    if _metrics is None:
        return
    instruments = _instruments if _instruments is not None else _ensure_instruments()
    if instruments is None:
        return
    _, rollouts, tokens = instruments
    rollouts.add(1, {"outcome": outcome})
    if input_tokens:
        tokens.add(input_tokens, {"gen_ai.token.type": "input"})
    if output_tokens:
        tokens.add(output_tokens, {"gen_ai.token.type": "output"})


# --------------------------------------------------------------------------------------------
# Live view

#: Phases :func:`in_flight` counts: a rollout attempt as a whole, and its reward.
Phase = Literal["rollout", "reward"]


@contextmanager
def in_flight(phase: Phase) -> Iterator[None]:
    """Count the block as one ``phase`` in flight (two integer updates, no OpenTelemetry)."""
    _in_flight[phase] += 1
    try:
        yield
    finally:
        _in_flight[phase] -= 1


@dataclass(frozen=True, slots=True)
class LimiterStatus:
    """One named limiter, summed over every live ``Limits`` set."""

    name: str
    in_use: int
    total: float
    waiting: int


@dataclass(frozen=True, slots=True)
class RunStatus:
    """What a process is doing now (see :func:`run_status`).

    Attributes:
        model: The ``model_requests`` limiter's slots held.
        tools: The ``tool_calls`` limiter's slots held.
        servers: Pool servers known (0 without a pool).
    """

    rollouts: int = 0
    model: int = 0
    tools: int = 0
    reward: int = 0
    limiters: tuple[LimiterStatus, ...] = ()
    servers_up: int = 0
    servers: int = 0


def _limiters(rows: Iterable[tuple[str, int, float, int]]) -> tuple[LimiterStatus, ...]:
    sums: dict[str, list[float]] = {}
    for name, in_use, total, waiting in rows:
        acc = sums.setdefault(name, [0, 0.0, 0])
        acc[0] += in_use
        acc[1] += total
        acc[2] += waiting
    return tuple(
        LimiterStatus(name, int(a[0]), a[1], int(a[2])) for name, a in sorted(sums.items())
    )


def _status(
    rollouts: int, reward: int, limiters: tuple[LimiterStatus, ...], up: int, servers: int
) -> RunStatus:
    by_name = {limiter.name: limiter for limiter in limiters}
    model = by_name.get("model_requests")
    tools = by_name.get("tool_calls")
    return RunStatus(
        rollouts=rollouts,
        model=model.in_use if model is not None else 0,
        tools=tools.in_use if tools is not None else 0,
        reward=reward,
        limiters=limiters,
        servers_up=up,
        servers=servers,
    )


def run_status() -> RunStatus:
    """This process's status now: rollouts in flight by phase, limiters, servers (pure, cheap)."""
    limiters = _limiters(
        (a["limiter"], s.in_use, float(s.total), s.waiting) for a, s in _limiter_rows()
    )
    servers = [s for _, s in _server_rows()]
    return _status(
        _in_flight["rollout"],
        _in_flight["reward"],
        limiters,
        sum(1 for s in servers if s.up),
        len(servers),
    )


#: Limiters the status line always shows (when present); others only while saturated or waited on.
_SHOWN = ("model_requests", "tool_calls", "sandbox_create", "sandbox_exec")


def format_status(status: RunStatus) -> str:
    """The compact status line: ``rollouts 8 (model 2, tools 5, reward 1) | ... | servers 3/4 up``.

    The four main limiters always show; any other only while it is full or waited on.
    """
    head = (
        f"rollouts {status.rollouts} "
        f"(model {status.model}, tools {status.tools}, reward {status.reward})"
    )
    shown = []
    for limiter in status.limiters:
        full = limiter.total != float("inf") and limiter.in_use >= limiter.total
        if limiter.name not in _SHOWN and not (full or limiter.waiting):
            continue
        limit = "inf" if limiter.total == float("inf") else f"{limiter.total:g}"
        text = f"{limiter.name} {limiter.in_use}/{limit}"
        if limiter.waiting:
            text += f" +{limiter.waiting} waiting"
        shown.append(text)
    parts = [head]
    if shown:
        parts.append(", ".join(shown))
    if status.servers:
        parts.append(f"servers {status.servers_up}/{status.servers} up")
    return " | ".join(parts)


_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def status_from_prometheus(text: str) -> RunStatus:
    """The :class:`RunStatus` a :func:`prometheus_text` exposition describes.

    Raises:
        ValueError: ``text`` has none of this library's metrics (not a hermes_async endpoint).
    """
    limiters: dict[tuple[str, str], dict[str, float]] = {}
    phases: dict[str, float] = {}
    servers: dict[str, float] = {}
    seen = False
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None or not match["name"].startswith("hermes_async_"):
            continue
        seen = True
        labels = dict(_LABEL.findall(match["labels"]))
        try:
            value = float(match["value"])
        except ValueError:
            continue
        name = match["name"]
        if name.startswith("hermes_async_limiter_") and "limiter" in labels:
            key = (labels["limiter"], labels.get("limits", ""))
            limiters.setdefault(key, {})[name.removeprefix("hermes_async_limiter_")] = value
        elif name == "hermes_async_rollouts_in_flight":
            phases[labels.get("phase", "")] = value
        elif name == "hermes_async_pool_server_up":
            servers[labels.get("server", "")] = value
    if not seen:
        raise ValueError(
            "no hermes_async metrics in the response: is this a hermes_async endpoint?"
        )
    rows = (
        (n, int(v.get("in_use", 0)), v.get("limit", 0.0), int(v.get("waiting", 0)))
        for (n, _), v in limiters.items()
    )
    return _status(
        int(phases.get("rollout", 0)),
        int(phases.get("reward", 0)),
        _limiters(rows),
        sum(1 for v in servers.values() if v >= 1),
        len(servers),
    )


#: Deadline of one ``hermes-async status`` read (connect and response together).
STATUS_READ_TIMEOUT_SECONDS = 5.0


async def read_status(url: str, *, timeout: float = STATUS_READ_TIMEOUT_SECONDS) -> RunStatus:
    """Read a running process's status from its metrics endpoint (``serve_metrics``).

    Args:
        url: ``http://host:port`` or ``.../metrics``.

    Raises:
        OSError: The endpoint cannot be reached or answered with an error.
        ValueError: The endpoint is not a hermes_async one.

    **Cancellation**: the connection is closed.
    """
    import httpx

    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        with anyio.fail_after(timeout):
            async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
                response = await client.get(target)
    except TimeoutError:
        raise OSError(f"no answer from {target} within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise OSError(f"cannot read {target}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise OSError(f"{target} answered HTTP {response.status_code}")
    return status_from_prometheus(response.text)


# --------------------------------------------------------------------------------------------


def _provider() -> Any:
    if _meter_provider is not None:
        return _meter_provider
    provider = _metrics.get_meter_provider()
    if isinstance(provider, _metrics.NoOpMeterProvider) or type(provider).__name__.startswith(
        "_Proxy"
    ):
        return None  # no SDK configured: nothing would be recorded
    return provider


def _ensure_instruments() -> tuple[Any, Any, Any] | None:
    """Create the instruments on the current meter provider once (``None``: none set)."""
    global _instruments
    if _metrics is None:
        return None
    provider = _provider()
    if provider is None:
        return None
    if _instruments is not None and _instruments[0] is provider:
        return _instruments
    from hermes_async._version import __version__

    meter = provider.get_meter(_otel.SCOPE, __version__)
    _limiter_instruments(meter)
    _pool_instruments(meter)
    rollouts = meter.create_counter(
        "hermes_async.rollouts", unit="{rollout}", description="Finished rollouts by outcome."
    )
    tokens = meter.create_counter(
        "hermes_async.tokens", unit="{token}", description="Trajectory tokens by type."
    )
    _instruments = (provider, rollouts, tokens)
    return _instruments


def _limiter_rows() -> Iterator[tuple[dict[str, str], Any]]:
    for limits, number in list(_limits.items()):
        for name, stats in limits.statistics().items():
            yield {"limiter": name, "limits": str(number)}, stats


def _limiter_instruments(meter: Any) -> None:
    def gauge(field: str) -> Any:
        def observe(options: object) -> Iterable[Any]:
            return [
                _metrics.Observation(getattr(stats, field), attrs)
                for attrs, stats in _limiter_rows()
            ]

        return observe

    for name, field, description in (
        ("limit", "total", "The limiter's current capacity."),
        ("in_use", "in_use", "Slots held."),
        ("waiting", "waiting", "Tasks waiting for a slot."),
    ):
        meter.create_observable_gauge(
            f"hermes_async.limiter.{name}", [gauge(field)], unit="{slot}", description=description
        )
    meter.create_observable_counter(
        "hermes_async.limiter.wait_time",
        [gauge("total_wait_seconds")],
        unit="s",
        description="Time spent waiting for slots.",
    )


def _server_rows() -> Iterator[tuple[dict[str, str], Any]]:
    for pool in list(_pools):
        for server in pool.statistics().servers:
            yield {"server": server.url}, server


def _pool_instruments(meter: Any) -> None:
    def observe_with(value: Any) -> Any:
        def observe(options: object) -> Iterable[Any]:
            return [_metrics.Observation(value(s), attrs) for attrs, s in _server_rows()]

        return observe

    gauges = {
        "limit": lambda s: s.limit,
        "in_use": lambda s: s.in_use,
        "waiting": lambda s: s.waiting,
        "sessions": lambda s: s.sessions,
        "up": lambda s: 1 if s.up else 0,
    }
    for name, value in gauges.items():
        meter.create_observable_gauge(f"hermes_async.pool.server.{name}", [observe_with(value)])
    for name in ("requests", "failures", "rate_limited", "ejections"):
        meter.create_observable_counter(
            f"hermes_async.pool.server.{name}",
            [observe_with(lambda s, n=name: getattr(s, n))],
        )


# --------------------------------------------------------------------------------------------
# Prometheus text exposition


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text() -> str:
    """The limiter and pool metrics in Prometheus' text format (pure; read now)."""
    lines: list[str] = []

    def family(name: str, kind: str, rows: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# TYPE {name} {kind}")
        for attrs, value in rows:
            labels = ",".join(f'{k}="{_label(v)}"' for k, v in attrs.items())
            lines.append(f"{name}{{{labels}}} {value:g}")

    limiters = list(_limiter_rows())
    for field, name in (("total", "limit"), ("in_use", "in_use"), ("waiting", "waiting")):
        family(
            f"hermes_async_limiter_{name}",
            "gauge",
            [(a, float(getattr(s, field))) for a, s in limiters],
        )
    family(
        "hermes_async_limiter_wait_seconds_total",
        "counter",
        [(a, float(s.total_wait_seconds)) for a, s in limiters],
    )
    servers = list(_server_rows())
    for name in ("limit", "in_use", "waiting", "sessions"):
        family(
            f"hermes_async_pool_server_{name}",
            "gauge",
            [(a, float(getattr(s, name))) for a, s in servers],
        )
    family("hermes_async_pool_server_up", "gauge", [(a, 1.0 if s.up else 0.0) for a, s in servers])
    family(
        "hermes_async_rollouts_in_flight",
        "gauge",
        [({"phase": phase}, float(_in_flight[phase])) for phase in ("rollout", "reward")],
    )
    for name in ("requests", "failures", "rate_limited", "ejections"):
        family(
            f"hermes_async_pool_server_{name}_total",
            "counter",
            [(a, float(getattr(s, name))) for a, s in servers],
        )
    return "\n".join(lines) + "\n"


async def serve_metrics(
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve :func:`prometheus_text` at ``http://host:port/metrics`` until cancelled.

    Start it with ``port = await tg.start(serve_metrics, 9464)``: the bound port comes back.

    **Cancellation**: the listener and every open scrape connection are closed.
    """
    await serve_get(_answer_scrape, port, host, task_status=task_status)


def _answer_scrape(path: str) -> tuple[str, str, bytes]:
    if path == "/metrics":
        return "200 OK", "text/plain; version=0.0.4; charset=utf-8", prometheus_text().encode()
    return "404 Not Found", "text/plain", b"try GET /metrics\n"
