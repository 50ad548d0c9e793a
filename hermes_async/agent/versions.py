"""Policy versions, pauses and staleness: what asynchronous RL needs from the rollout core.

The :data:`VersionSource` is read once per request, at dispatch, and labels every token that
request sampled. A :data:`PauseProbe` holds dispatch while the server is paused.
:class:`Staleness` lets ``run_group`` drop or mask groups whose tokens are too old. Design and
limits: docs/decisions/034-policy-versions.md.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypeAlias

import anyio
import httpx

from hermes_async._cleanup import cleanup_scope
from hermes_async.errors import InferenceError

__all__ = (
    "PauseProbe",
    "PolledPause",
    "PolledVersion",
    "Staleness",
    "StalenessAction",
    "StalenessReport",
    "VersionReadError",
    "VersionSource",
    "probe_paused",
    "read_version",
    "staleness_of",
    "version_spans",
    "wait_while_paused",
)

#: ``() -> int`` or ``async () -> int``: the trainer's current policy version (>= 0).
VersionSource: TypeAlias = Callable[[], int | Awaitable[int]]
#: ``() -> bool`` or ``async () -> bool``: whether the model server is paused right now.
PauseProbe: TypeAlias = Callable[[], bool | Awaitable[bool]]

#: Bound on one read of a version source or pause probe: a trainer that does not answer in
#: 10 s is broken, and a rollout must not hang on it.
_VERSION_READ_TIMEOUT_SECONDS = 10.0
#: How often a paused server is polled: a weight update takes seconds, so 0.1 s costs nothing
#: and resumes within a tenth of a second of the server.
_PAUSE_POLL_SECONDS = 0.1


class VersionReadError(InferenceError):
    """The version source or pause probe failed, timed out, or returned a bad value (``infra``)."""


async def _call(source: Callable[[], Any], what: str) -> object:
    try:
        with anyio.fail_after(_VERSION_READ_TIMEOUT_SECONDS):
            value = source()
            if inspect.isawaitable(value):
                value = await value
    except TimeoutError:
        raise VersionReadError(
            f"the {what} did not answer within {_VERSION_READ_TIMEOUT_SECONDS:g} s"
        ) from None
    except InferenceError:
        raise
    except Exception as exc:
        raise VersionReadError(f"the {what} failed: {type(exc).__name__}: {exc}") from exc
    return value


async def read_version(source: VersionSource) -> int:
    """Read the policy version once (bounded).

    Raises:
        VersionReadError: The source raised, timed out, or returned anything but an ``int``
            >= 0 (``True`` is no version).

    **Cancellation**: an async source is cancelled with the caller.
    """
    value = await _call(source, "policy version source")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise VersionReadError(
            f"the policy version source returned {value!r}; it must return an int >= 0"
        )
    return value


async def probe_paused(probe: PauseProbe) -> bool:
    """Ask ``probe`` once whether the server is paused (bounded).

    Raises:
        VersionReadError: The probe raised, timed out or returned a non-bool.

    **Cancellation**: an async probe is cancelled with the caller.
    """
    value = await _call(probe, "pause probe")
    if not isinstance(value, bool):
        raise VersionReadError(f"the pause probe returned {value!r}; it must return a bool")
    return value


async def wait_while_paused(
    probe: PauseProbe, *, timeout: float | None, poll_seconds: float = _PAUSE_POLL_SECONDS
) -> float:
    """Wait until ``probe`` says the server is not paused; return the seconds waited.

    Raises:
        TimeoutError: Still paused after ``timeout`` seconds.
        VersionReadError: The probe failed.

    **Cancellation**: the wait ends at once.
    """
    start = anyio.current_time()
    with anyio.fail_after(timeout if timeout is not None else math.inf):
        # Polling, not an event: the pause lives in another process (the inference server).
        while True:
            if not await probe_paused(probe):
                break
            await anyio.sleep(poll_seconds)
    return anyio.current_time() - start


class _HTTPPoll:
    """One HTTP client GETting one JSON endpoint, bounded."""

    def __init__(
        self, url: str, *, timeout: float, transport: httpx.AsyncBaseTransport | None
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.url, self.timeout = url, timeout
        self._client = httpx.AsyncClient(transport=transport, timeout=timeout)
        #: GETs sent so far.
        self.polls = 0

    async def __aenter__(self) -> Self:
        """Open the HTTP client.

        **Cancellation**: nothing is held yet.
        """
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the HTTP client.

        **Cancellation**: the close is bounded by ``timeout``.
        """
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client (idempotent).

        **Cancellation**: shielded, bounded by ``timeout``.
        """
        with cleanup_scope(f"close the HTTP client of {self.url}", self.timeout):
            await self._client.aclose()

    async def _get(self, what: str) -> object:
        try:
            with anyio.fail_after(self.timeout):
                response = await self._client.get(self.url)
            response.raise_for_status()
            payload: object = response.json()
        except (httpx.HTTPError, TimeoutError, ValueError) as exc:
            raise VersionReadError(f"GET {self.url} for {what} failed: {exc}") from exc
        self.polls += 1
        return payload


class PolledVersion(_HTTPPoll):
    """A :data:`VersionSource` reading an HTTP endpoint, at most once per ``interval``.

    ``GET url`` answers an integer, or an object with it under ``key``. A failed poll raises.
    Use as an async context manager::

        async with PolledVersion("http://trainer:9000/version") as versions:
            options = AgentOptions(version_source=versions)
    """

    def __init__(
        self,
        url: str,
        *,
        key: str = "version",
        interval: float = 1.0,
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        super().__init__(url, timeout=timeout, transport=transport)
        self.key, self.interval = key, interval
        self._value: int | None = None
        self._at = -math.inf
        self._lock = anyio.Lock()

    async def __call__(self) -> int:
        """The version: cached while fresh, else one GET shared by concurrent callers.

        Raises:
            VersionReadError: The GET failed or the answer holds no integer version.

        **Cancellation**: the GET is abandoned.
        """
        async with self._lock:
            if self._value is not None and anyio.current_time() - self._at < self.interval:
                return self._value
            payload = await self._get("the policy version")
            value = payload.get(self.key) if isinstance(payload, dict) else payload
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise VersionReadError(
                    f"GET {self.url} answered {payload!r:.200}; expected an int >= 0"
                    f" (or {{{self.key!r}: int}})"
                )
            self._value, self._at = value, anyio.current_time()
            return value


class PolledPause(_HTTPPoll):
    """A :data:`PauseProbe` asking an inference server's ``GET /is_paused`` (not cached).

    The answer is ``{"is_paused": bool}`` (vLLM's shape; ``key`` for another) or a bare bool.
    Use as an async context manager::

        async with PolledPause("http://127.0.0.1:8000/is_paused") as paused:
            options = AgentOptions(pause_probe=paused, ...)
    """

    def __init__(
        self,
        url: str,
        *,
        key: str = "is_paused",
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, timeout=timeout, transport=transport)
        self.key = key

    async def __call__(self) -> bool:
        """Whether the server is paused (one GET).

        Raises:
            VersionReadError: The GET failed or the answer holds no bool.

        **Cancellation**: the GET is abandoned.
        """
        payload = await self._get("the pause state")
        value = payload.get(self.key) if isinstance(payload, dict) else payload
        if not isinstance(value, bool):
            raise VersionReadError(
                f"GET {self.url} answered {payload!r:.200}; expected {{{self.key!r}: bool}}"
            )
        return value


# ------------------------------------------------------------------------------------------
# staleness (pure)

#: What :func:`~hermes_async.agent.rollout.run_group` does with a group holding stale tokens:
#: ``drop`` the group, ``mask`` the stale segments (not trained), or ``keep`` it (report only).
StalenessAction: TypeAlias = Literal["drop", "mask", "keep"]


@dataclass(frozen=True, slots=True)
class Staleness:
    """How old a group's tokens may be, in policy versions.

    A segment's age is the current version, read once when the group is done, minus the version
    that sampled it.

    Attributes:
        max_staleness: Largest age still trained on (``1``: the usual one-step off-policy).
        action: ``drop`` the group (outcome ``"stale"``), ``mask`` the stale segments, or
            ``keep`` and only report.
        version_source: Source of the current version (``None``: ``AgentOptions.version_source``).
    """

    max_staleness: int
    action: StalenessAction = "drop"
    version_source: VersionSource | None = None

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness!r}")
        if self.action not in ("drop", "mask", "keep"):
            raise ValueError(f"staleness action must be drop, mask or keep, got {self.action!r}")


@dataclass(frozen=True, slots=True)
class StalenessReport:
    """The ages of one group's tokens, for logging.

    Attributes:
        segment_ages: Completion segments per age.
        token_ages: Sampled tokens per age.
        stale_rollouts: Indices of rollouts holding at least one stale segment.
    """

    current_version: int
    max_staleness: int
    action: StalenessAction
    segment_ages: Mapping[int, int] = field(default_factory=dict)
    token_ages: Mapping[int, int] = field(default_factory=dict)
    stale_segments: int = 0
    stale_tokens: int = 0
    stale_rollouts: tuple[int, ...] = ()
    dropped: bool = False
    masked_tokens: int = 0
    unversioned_segments: int = 0

    @property
    def stale(self) -> bool:
        """Whether any segment was older than ``max_staleness``."""
        return self.stale_segments > 0

    def metrics(self, prefix: str = "staleness/") -> dict[str, float]:
        """Flat counters for wandb / Prometheus, such as ``{prefix}tokens_age_<n>``."""
        out: dict[str, float] = {
            f"{prefix}stale_segments": float(self.stale_segments),
            f"{prefix}stale_tokens": float(self.stale_tokens),
            f"{prefix}dropped_groups": float(self.dropped),
            f"{prefix}masked_tokens": float(self.masked_tokens),
            f"{prefix}unversioned_segments": float(self.unversioned_segments),
        }
        for age, count in sorted(self.token_ages.items()):
            out[f"{prefix}tokens_age_{age}"] = float(count)
        for age, count in sorted(self.segment_ages.items()):
            out[f"{prefix}segments_age_{age}"] = float(count)
        return out


#: ``(start, end, version)`` of one completion segment, token offsets into the rollout's rows.
Span: TypeAlias = tuple[int, int, int | None]


def version_spans(managed_state: Mapping[str, Any] | None) -> list[Span]:
    """The completion segments of ``managed_state`` as ``(start, end, version)``."""
    out: list[Span] = []
    for seg in (managed_state or {}).get("segments") or ():
        if isinstance(seg, Mapping) and seg.get("kind") == "completion":
            version = seg.get("version")
            out.append(
                (int(seg["start"]), int(seg["end"]), version if isinstance(version, int) else None)
            )
    return out


def staleness_of(
    spans: Sequence[Sequence[Span]], current_version: int, policy: Staleness
) -> tuple[StalenessReport, list[list[tuple[int, int]]]]:
    """Decide a group's staleness (pure).

    Returns:
        The report, and per rollout the ``(start, end)`` token ranges to mask.
    """
    segment_ages: Counter[int] = Counter()
    token_ages: Counter[int] = Counter()
    stale_segments = stale_tokens = unversioned = 0
    stale_rollouts: list[int] = []
    to_mask: list[list[tuple[int, int]]] = []
    for index, rollout in enumerate(spans):
        ranges: list[tuple[int, int]] = []
        for start, end, version in rollout:
            if version is None:
                unversioned += 1
                continue
            age = max(current_version - version, 0)
            segment_ages[age] += 1
            token_ages[age] += end - start
            if age > policy.max_staleness:
                stale_segments += 1
                stale_tokens += end - start
                ranges.append((start, end))
        if ranges:
            stale_rollouts.append(index)
        to_mask.append(ranges if policy.action == "mask" else [])
    stale = stale_segments > 0
    report = StalenessReport(
        current_version=current_version,
        max_staleness=policy.max_staleness,
        action=policy.action,
        segment_ages=dict(segment_ages),
        token_ages=dict(token_ages),
        stale_segments=stale_segments,
        stale_tokens=stale_tokens,
        stale_rollouts=tuple(stale_rollouts),
        dropped=stale and policy.action == "drop",
        masked_tokens=stale_tokens if policy.action == "mask" else 0,
        unversioned_segments=unversioned,
    )
    return report, to_mask
