"""The driver's side: spread groups over workers, and answer every group by its deadline.

Invariant: every request gets exactly one :class:`GroupResult` by its deadline plus
``answer_grace_seconds``. A lost group goes to another worker while time allows, else it
is ``failed`` (``infra``); a late one is ``failed`` (``agent_timeout``) and cancelled.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio
import httpx
import orjson

from hermes_async._checks import INTEGER_AT_LEAST_ONE, NON_NEGATIVE_FINITE, check_fields
from hermes_async._paced import start_paced
from hermes_async.agent.failures import RolloutFailure
from hermes_async.errors import RequestError, WorkerError
from hermes_async.service.wire import GroupRequest, GroupResult

__all__ = (
    "MAX_RESULT_BYTES",
    "DispatchOptions",
    "DispatchStatistics",
    "GroupDispatcher",
    "HTTPWorker",
    "WorkerHandle",
    "WorkerLostError",
    "pick_worker",
    "result_of",
)

logger = logging.getLogger(__name__)

#: Largest answer read from a worker (a group of 256 rollouts of 32k tokens is ~50 MB).
MAX_RESULT_BYTES = 256 * 1024 * 1024


class WorkerLostError(WorkerError):
    """A worker could not take or finish a group: it died, is unreachable, or refused it.

    Attributes:
        dead: True if the worker itself is gone (it is avoided for a while).
    """

    def __init__(self, message: str, *, worker: str, dead: bool) -> None:
        super().__init__(message)
        self.worker = worker
        self.dead = dead


class WorkerHandle(Protocol):
    """One worker as the dispatcher sees it."""

    name: str

    async def run_group(self, request: GroupRequest) -> GroupResult:
        """Run ``request`` there; its result.

        Raises:
            WorkerLostError: The worker died, is unreachable or refused the group.
            RequestError: The request itself is bad (every worker would refuse it).

        **Cancellation**: the group is cancelled on the worker.
        """
        ...


def result_of(status: int, body: bytes, request: GroupRequest, worker: str) -> GroupResult:
    """A worker's answer (HTTP status and body, the same for every transport) as a result.

    Raises:
        WorkerLostError: 503 (draining or closed), 404 (environment not served), 409 (the id
            is running there).
        RequestError: Another 4xx.
        WorkerError: A 5xx, or a result that does not parse or is for another group.
    """
    if status == 200:
        result = GroupResult.from_bytes(body)
        if result.group_id != request.group_id:
            raise WorkerError(
                f"worker {worker} answered group {result.group_id!r} for {request.group_id!r}"
            )
        return result
    message = _error_text(body)
    if status in (404, 409, 503):
        raise WorkerLostError(
            f"worker {worker} refused the group: {message}", worker=worker, dead=False
        )
    if 400 <= status < 500:
        raise RequestError(message, status=status)
    raise WorkerError(f"worker {worker} failed with HTTP {status}: {message}")


def _error_text(body: bytes) -> str:
    """The ``error`` of a worker's refusal, else the start of its body."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode("utf-8", "replace")
    return str(value.get("error", value))[:2000] if isinstance(value, dict) else str(value)[:300]


class HTTPWorker:
    """A worker service reached over HTTP (``hermes-async worker``).

    Args:
        client: The HTTP client, shared by the handles of one driver.
        name: Its name in results and logs (default: the URL).
    """

    def __init__(self, base_url: str, client: httpx.AsyncClient, name: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.name = name or self.base_url

    async def run_group(self, request: GroupRequest) -> GroupResult:
        """``POST /groups``; see :class:`WorkerHandle`.

        **Cancellation**: the connection is closed, which cancels the group on the worker.
        """
        try:
            async with self.client.stream(
                "POST",
                f"{self.base_url}/groups",
                content=request.to_bytes(),
                headers={"content-type": "application/json"},
            ) as response:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > MAX_RESULT_BYTES:
                        raise WorkerError(
                            f"worker {self.name} sent over {MAX_RESULT_BYTES} bytes for one group"
                        )
                    chunks.append(chunk)
                status = response.status_code
        except (httpx.TransportError, httpx.DecodingError) as exc:
            raise WorkerLostError(
                f"worker {self.name} is unreachable or died: {type(exc).__name__}: {exc}",
                worker=self.name,
                dead=True,
            ) from exc
        return result_of(status, b"".join(chunks), request, self.name)


@dataclass(frozen=True, slots=True)
class DispatchOptions:
    """How a dispatcher spreads groups and what it does when a worker is lost.

    Attributes:
        retry_elsewhere: Send a lost group to another worker while its deadline leaves
            ``min_retry_seconds``.
        answer_grace_seconds: How long past the deadline the driver waits for the worker's
            own answer before failing the group itself.
    """

    max_per_worker: int = 16
    retry_elsewhere: bool = True
    max_attempts: int = 3
    min_retry_seconds: float = 1.0
    answer_grace_seconds: float = 5.0
    revive_after_seconds: float = 10.0

    def __post_init__(self) -> None:
        check_fields(self, ("max_per_worker", "max_attempts"), INTEGER_AT_LEAST_ONE)
        check_fields(
            self,
            ("min_retry_seconds", "answer_grace_seconds", "revive_after_seconds"),
            NON_NEGATIVE_FINITE,
        )


@dataclass(frozen=True, slots=True)
class DispatchStatistics:
    """Per worker: groups in flight, sent, lost; and whether it is considered dead."""

    in_flight: dict[str, int]
    sent: dict[str, int]
    lost: dict[str, int]
    dead: tuple[str, ...]


@dataclass(slots=True)
class _Slot:
    handle: WorkerHandle
    in_flight: int = 0
    sent: int = 0
    lost: int = 0
    dead_until: float = -math.inf


def pick_worker(
    loads: Sequence[tuple[int, bool]], cap: int, avoid: frozenset[int], start: int
) -> int | None:
    """The least-loaded worker under ``cap`` not in ``avoid``, round robin from ``start``.

    ``loads`` holds (in flight, alive) per worker. ``None``: none has room.
    """
    best: int | None = None
    n = len(loads)
    for k in range(n):
        i = (start + k) % n
        load, alive = loads[i]
        if not alive or i in avoid or load >= cap:
            continue
        if best is None or load < loads[best][0]:
            best = i
    return best


class GroupDispatcher:
    """Spread groups over workers by load and answer each by its deadline."""

    def __init__(
        self, workers: Sequence[WorkerHandle], options: DispatchOptions | None = None
    ) -> None:
        if not workers:
            raise ValueError("a GroupDispatcher needs at least one worker")
        self.options = options or DispatchOptions()
        self._slots = [_Slot(w) for w in workers]
        self._changed = anyio.Event()
        self._next = 0

    def statistics(self) -> DispatchStatistics:
        """A snapshot per worker."""
        now = anyio.current_time()
        return DispatchStatistics(
            {s.handle.name: s.in_flight for s in self._slots},
            {s.handle.name: s.sent for s in self._slots},
            {s.handle.name: s.lost for s in self._slots},
            tuple(s.handle.name for s in self._slots if s.dead_until > now),
        )

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _acquire(self, avoid: frozenset[int], give_up_at: float) -> int | None:
        """A worker slot's index, waiting until ``give_up_at``; ``None`` if none is alive or time ran out."""
        while True:
            now = anyio.current_time()
            loads = [(s.in_flight, s.dead_until <= now) for s in self._slots]
            chosen = pick_worker(loads, self.options.max_per_worker, avoid, self._next)
            if chosen is not None:
                self._next = (chosen + 1) % len(self._slots)
                self._slots[chosen].in_flight += 1
                self._slots[chosen].sent += 1
                return chosen
            if not any(alive and i not in avoid for i, (_, alive) in enumerate(loads)):
                return None
            changed = self._changed
            with anyio.move_on_at(give_up_at):
                await changed.wait()
            if anyio.current_time() >= give_up_at:
                return None

    def _release(self, index: int) -> None:
        self._slots[index].in_flight -= 1
        self._notify()

    async def run_group(self, request: GroupRequest) -> GroupResult:
        """Run ``request`` on a worker; a lost or late group is a ``failed`` result, not an error.

        Raises:
            RequestError: The request is bad (every worker would refuse it).

        **Cancellation**: the call on the worker is cancelled (the group is cancelled there).
        """
        opts = self.options
        started = anyio.current_time()
        # Wall-clock deadline -> this process's anyio clock.
        deadline = started + (request.deadline - time.time())
        give_up_at = deadline + opts.answer_grace_seconds
        avoid: set[int] = set()
        reasons: list[str] = []
        attempt = 0

        def failed(category: str, message: str) -> GroupResult:
            failure = RolloutFailure.of(category, message, source="driver")  # type: ignore[arg-type]
            logger.warning("group %s: %s", request.group_id, message)
            return GroupResult.failed(
                request,
                failure,
                seconds=anyio.current_time() - started,
                attempts=max(attempt, 1),
            )

        while True:
            index = await self._acquire(frozenset(avoid), deadline)
            if index is None:
                if anyio.current_time() >= deadline:
                    why = "no worker had room before the deadline"
                else:
                    why = "no live worker to send it to"
                return failed("infra", "; ".join([*reasons, why]))
            attempt += 1
            slot = self._slots[index]
            try:
                with anyio.move_on_at(give_up_at) as scope:
                    result = await slot.handle.run_group(request)
                if scope.cancelled_caught:
                    return failed(
                        "agent_timeout",
                        f"worker {slot.handle.name} did not answer by the deadline "
                        f"(+{opts.answer_grace_seconds:g} s); the group was cancelled there",
                    )
            except WorkerLostError as exc:
                slot.lost += 1
                if exc.dead:
                    slot.dead_until = anyio.current_time() + opts.revive_after_seconds
                reasons.append(str(exc))
                avoid.add(index)
                left = deadline - anyio.current_time()
                if (
                    opts.retry_elsewhere
                    and attempt < opts.max_attempts
                    and left > opts.min_retry_seconds
                ):
                    logger.info("group %s: %s; sending it elsewhere", request.group_id, exc)
                    continue
                return failed("infra", "; ".join(reasons))
            except RequestError:
                raise  # every worker would refuse it: the caller's to fix
            except WorkerError as exc:
                reasons.append(str(exc))
                return failed("infra", "; ".join(reasons))
            finally:
                self._release(index)
            if attempt > 1:
                result = dataclasses.replace(result, attempts=attempt)
            return result

    async def run_groups(
        self,
        requests: Sequence[GroupRequest],
        *,
        on_result: Callable[[GroupResult], object] | None = None,
    ) -> list[GroupResult]:
        """Run every request concurrently; results in request order, each group once.

        Raises:
            ValueError: Two requests share a group id.
            RequestError: A request is bad (the others are cancelled).

        **Cancellation**: every group still running is cancelled on its worker.
        """
        ids = [r.group_id for r in requests]
        if len(set(ids)) != len(ids):
            repeated = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"run_groups got repeated group ids: {repeated[:5]}")
        results: list[GroupResult | None] = [None] * len(requests)

        async def one(i: int) -> None:
            result = await self.run_group(requests[i])
            assert results[i] is None  # each group is reported once
            results[i] = result
            if on_result is not None:
                on_result(result)

        async with anyio.create_task_group() as tg:
            await start_paced(tg, one, range(len(requests)))
        return [r for r in results if r is not None]
