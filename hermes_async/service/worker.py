"""The rollout worker: one process, one event loop, its own sandboxes, limiters and servers.

:class:`RolloutWorker` answers every admitted group by its deadline: the group, or ``failed``,
never silence. A caller that goes away cancels its group; cleanup stays shielded and bounded.
The HTTP service and the Ray actor are thin shells over it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import orjson
from anyio.abc import TaskGroup

from hermes_async._asynclib import current_async_library
from hermes_async._checks import INTEGER_AT_LEAST_ONE, POSITIVE_FINITE, check_fields
from hermes_async._cleanup import cleanup_scope
from hermes_async.agent.failures import RolloutFailure, classify_exception
from hermes_async.agent.rollout import RolloutTask, ScoredRollout, run_group
from hermes_async.errors import ConfigError, InferenceError, RequestError
from hermes_async.inference.pool import ServerPool
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.limits import LimiterStatistics, Limits
from hermes_async.service.environments import Environment
from hermes_async.service.wire import GroupRequest, GroupResult, RequestBounds, decode_json
from hermes_async.tools.sandbox.leftovers import claim_root, release_root, sweep_dead_roots
from hermes_async.tools.sandbox.local import Isolation, local_factory
from hermes_async.tools.sandbox.manager import (
    SandboxFactory,
    SandboxManager,
    SandboxManagerStatistics,
    open_sandbox_manager,
)

__all__ = (
    "DEFAULT_SANDBOX_PARENT",
    "RolloutWorker",
    "WorkerOptions",
    "WorkerState",
    "WorkerStatistics",
    "open_worker",
)

logger = logging.getLogger(__name__)

#: Where workers' sandbox roots go by default (one root per worker name).
DEFAULT_SANDBOX_PARENT = os.path.join(tempfile.gettempdir(), "hermes-async-workers")

WorkerState = Literal["serving", "draining", "closed"]

#: The limiter of groups a worker runs at once.
GROUPS_LIMITER = "worker_groups"


def _default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs; every bound of what it accepts.

    Attributes:
        name: Its sandbox root's name, stable across restarts (default ``<host>-<pid>``).
        max_groups: Groups run at once; more wait within their deadline (64: with groups of 8,
            ~512 rollouts, what one loop sustains on a few cores).
        reply_reserve_seconds: Time kept before a deadline to release sandboxes and answer.
        drain_timeout: How long a drain waits before cancelling groups (answered ``infra``).
        sandbox_parent: Where the sandbox root goes; each worker sweeps dead workers' roots.
        isolation: The local sandboxes' isolation (see ``local_factory``).
    """

    name: str = field(default_factory=_default_name)
    max_groups: int = 64
    max_group_size: int = 256
    max_item_bytes: int = 256 * 1024
    max_body_bytes: int = 1024 * 1024
    max_deadline_seconds: float = 86_400.0
    reply_reserve_seconds: float = 1.0
    drain_timeout: float = 60.0
    sandbox_parent: str = DEFAULT_SANDBOX_PARENT
    isolation: Isolation = "auto"

    def __post_init__(self) -> None:
        check_fields(
            self,
            ("max_groups", "max_group_size", "max_item_bytes", "max_body_bytes"),
            INTEGER_AT_LEAST_ONE,
        )
        check_fields(
            self,
            ("max_deadline_seconds", "reply_reserve_seconds", "drain_timeout"),
            POSITIVE_FINITE,
        )

    @property
    def bounds(self) -> RequestBounds:
        """The bounds a request is checked against."""
        return RequestBounds(self.max_group_size, self.max_item_bytes, self.max_deadline_seconds)


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    """A snapshot of a worker (``GET /statistics``).

    Attributes:
        state: ``serving``, ``draining`` or ``closed``.
        groups_running: Groups admitted and not yet answered.
        answered: Groups answered, by outcome.
        servers: Model servers up / total, or ``None``.
    """

    name: str
    state: WorkerState
    groups_running: int
    rollouts_running: int
    accepted: int
    answered: Mapping[str, int]
    refused: int
    limiters: Mapping[str, LimiterStatistics]
    sandboxes: SandboxManagerStatistics
    servers: tuple[int, int] | None
    uptime_seconds: float

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        return {
            "name": self.name,
            "state": self.state,
            "groups_running": self.groups_running,
            "rollouts_running": self.rollouts_running,
            "accepted": self.accepted,
            "answered": dict(self.answered),
            "refused": self.refused,
            "limiters": {
                k: {"total": v.total, "in_use": v.in_use, "waiting": v.waiting}
                for k, v in self.limiters.items()
            },
            "sandboxes": {
                "active": self.sandboxes.active,
                "creating": self.sandboxes.creating,
                "created": self.sandboxes.created,
                "released": self.sandboxes.released,
                "create_failures": self.sandboxes.create_failures,
            },
            "servers": None
            if self.servers is None
            else {
                "up": self.servers[0],
                "total": self.servers[1],
            },
            "uptime_seconds": round(self.uptime_seconds, 3),
        }


@dataclass(slots=True)
class _Running:
    """One admitted group: its cancel scope and its rollouts left."""

    request: GroupRequest
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    rollouts_left: int = 0
    why_cancelled: RolloutFailure | None = None


class RolloutWorker:
    """Runs groups for its callers. Made by :func:`open_worker`.

    ``server`` is what ``run_group`` takes; ``tokenizer`` is set on tasks without one when the
    server is a token server.
    """

    def __init__(
        self,
        environments: Mapping[str, Environment],
        server: Any,
        *,
        manager: SandboxManager,
        limits: Limits,
        task_group: TaskGroup,
        options: WorkerOptions,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.environments = dict(environments)
        self.server = server
        self.manager = manager
        self.limits = limits
        self.options = options
        self.name = options.name
        self.tokenizer = tokenizer
        self._tg = task_group
        self._groups = limits.add(GROUPS_LIMITER, options.max_groups)
        self._running: dict[str, _Running] = {}
        self._state: WorkerState = "serving"
        self._idle = anyio.Event()
        self._idle.set()
        self._accepted = self._refused = 0
        self._answered: dict[str, int] = {}
        self._opened = anyio.current_time()
        api = getattr(server, "api", None)
        self.token_server = api != "chat" if api is not None else hasattr(server, "stream")

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> WorkerState:
        """``serving``, ``draining`` or ``closed``."""
        return self._state

    def statistics(self) -> WorkerStatistics:
        """A snapshot of the worker."""
        servers = None
        if isinstance(self.server, ServerPool):
            pool = self.server.statistics()
            servers = (pool.up, len(pool.servers))
        return WorkerStatistics(
            self.name,
            self._state,
            len(self._running),
            sum(r.rollouts_left for r in self._running.values()),
            self._accepted,
            dict(self._answered),
            self._refused,
            self.limits.statistics(),
            self.manager.statistics(),
            servers,
            anyio.current_time() - self._opened,
        )

    # ------------------------------------------------------------------ admission

    def admit(self, request: GroupRequest) -> None:
        """Take ``request`` or refuse it at once.

        Raises:
            RequestError: Draining (503), unknown environment (404), or this id is running (409).
        """
        try:
            if self._state != "serving":
                raise RequestError(
                    f"worker {self.name} is {self._state}: it takes no new groups; send this "
                    "one to another worker",
                    status=503,
                )
            if request.environment not in self.environments:
                raise RequestError(
                    f"unknown environment {request.environment!r}; this worker serves: "
                    f"{', '.join(sorted(self.environments)) or 'none'}",
                    status=404,
                )
            if request.group_id in self._running:
                raise RequestError(
                    f"group {request.group_id!r} is already running on worker {self.name}",
                    status=409,
                )
        except RequestError:
            self._refused += 1
            raise
        self._running[request.group_id] = _Running(request, rollouts_left=request.size)
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        self._accepted += 1

    # ------------------------------------------------------------------ running

    async def run_group(
        self,
        request: GroupRequest,
        *,
        on_rollout: Callable[[ScoredRollout], object] | None = None,
    ) -> GroupResult:
        """Admit ``request`` and answer it by its deadline: the group, or ``failed`` and why.

        Raises:
            RequestError: Refused (see :meth:`admit`), or the environment refused the item (422).

        **Cancellation**: the group is cancelled (sandboxes released, shielded and bounded) and the
        cancellation propagates.
        """
        self.admit(request)
        return await self.answer(request, on_rollout=on_rollout)

    def parse(self, body: bytes) -> GroupRequest:
        """A request's JSON body, checked against this worker's bounds.

        Raises:
            RequestError: Not JSON, or a field missing or out of bounds.
        """
        try:
            return GroupRequest.from_json(decode_json(body, "the body"), self.options.bounds)
        except RequestError:
            self._refused += 1
            raise

    def refused(self) -> None:
        """Count a request refused before it could be parsed (a body too large)."""
        self._refused += 1

    async def handle(self, body: bytes) -> tuple[int, bytes]:
        """JSON body in, ``(status, JSON body)`` out: for every transport without HTTP.

        **Cancellation**: as :meth:`run_group`.
        """
        try:
            result = await self.run_group(self.parse(body))
        except RequestError as exc:
            return exc.status, orjson.dumps({"error": str(exc), "status": exc.status})
        return 200, result.to_bytes()

    async def answer(
        self,
        request: GroupRequest,
        *,
        on_rollout: Callable[[ScoredRollout], object] | None = None,
    ) -> GroupResult:
        """Run an admitted group in the worker's task group; wait for its answer.

        Raises:
            RequestError: The environment refused the item (422).

        **Cancellation**: as :meth:`run_group`.
        """
        running = self._running[request.group_id]
        box: list[GroupResult | BaseException] = []
        done = anyio.Event()

        async def host() -> None:
            try:
                box.append(await self._run(running, on_rollout))
            except BaseException as exc:  # handed to the waiting caller, never lost
                box.append(exc)
                if not isinstance(exc, Exception):
                    raise
            finally:
                done.set()

        try:
            self._tg.start_soon(host, name=f"group {request.group_id}")
            try:
                await done.wait()
            except anyio.get_cancelled_exc_class():
                # The caller went away (a disconnect, ray.cancel: a native cancellation that
                # no shield stops): cancel the group in its own task, where the shields hold,
                # and wait for its cleanup.
                running.why_cancelled = RolloutFailure.of(
                    "cancelled", "the caller cancelled the group", source="caller"
                )
                running.scope.cancel(reason="the caller cancelled the group")
                with cleanup_scope(
                    f"cancel group {request.group_id}",
                    self.manager.close_timeout + self.options.reply_reserve_seconds,
                    reason="its caller went away",
                    log=logger,
                ):
                    await done.wait()
                raise
        finally:
            self._forget(request.group_id)
        outcome = box[0] if box else None
        if isinstance(outcome, BaseException):
            if isinstance(outcome, RequestError):
                self._refused += 1
            raise outcome
        assert outcome is not None
        self._answered[outcome.outcome] = self._answered.get(outcome.outcome, 0) + 1
        return outcome

    def _forget(self, group_id: str) -> None:
        self._running.pop(group_id, None)
        if not self._running:
            self._idle.set()

    async def _run(
        self, running: _Running, on_rollout: Callable[[ScoredRollout], object] | None
    ) -> GroupResult:
        request = running.request
        started = anyio.current_time()
        # The request's deadline is wall-clock time of the caller; the worker's clock is
        # anyio's. The rollouts end reply_reserve_seconds before it, the group at it.
        remaining = request.deadline - time.time()
        deadline = started + remaining
        rollouts_end = deadline - self.options.reply_reserve_seconds

        def finished(scored: ScoredRollout) -> None:
            running.rollouts_left -= 1
            if on_rollout is not None:
                on_rollout(scored)

        def failed(failure: RolloutFailure) -> GroupResult:
            logger.warning("group %s: %s", request.group_id, failure)
            return GroupResult.failed(
                request, failure, worker=self.name, seconds=anyio.current_time() - started
            )

        running.scope.deadline = deadline
        with running.scope:
            try:
                async with self._groups.capacity_limiter:
                    task = await self._task(request)
                    options = task.options
                    if request.temperature is not None:
                        options = dataclasses.replace(options, temperature=request.temperature)
                    budget = rollouts_end - anyio.current_time()
                    if budget <= 0:
                        return failed(_deadline_failure(request, waited=True))
                    if options.rollout_timeout is None or options.rollout_timeout > budget:
                        options = dataclasses.replace(options, rollout_timeout=budget)
                    group = await run_group(
                        self.server,
                        task.messages,
                        task.tools,
                        size=request.size,
                        setup=task.setup,
                        options=options,
                        task_ids=[f"{request.group_id}-{i}" for i in range(request.size)],
                        on_rollout=finished,
                    )
            except RequestError:
                raise
            except InferenceError as exc:
                return failed(classify_exception(exc, source="model_server"))
            except Exception as exc:  # the environment's task factory, or a harness bug
                return failed(classify_exception(exc, source="the environment"))
        if running.scope.cancelled_caught:
            if running.why_cancelled is not None:
                return failed(running.why_cancelled)
            return failed(_deadline_failure(request, waited=False))
        return GroupResult.of(
            group, request, worker=self.name, seconds=anyio.current_time() - started
        )

    async def _task(self, request: GroupRequest) -> RolloutTask:
        environment = self.environments[request.environment]
        try:
            task = await environment.task(
                request.item, token_server=self.token_server, sandboxes=self.manager
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError(
                f"environment {request.environment!r} refused the item: "
                f"{type(exc).__name__}: {exc}",
                status=422,
            ) from None
        setup = task.setup
        changes: dict[str, Any] = {}
        if setup.sandboxes is None:
            changes["sandboxes"] = self.manager
        if setup.limits is None:
            changes["limits"] = self.limits
        if setup.tokenizer is None and self.token_server and self.tokenizer is not None:
            changes["tokenizer"] = self.tokenizer
        if changes:
            task = dataclasses.replace(task, setup=dataclasses.replace(setup, **changes))
        return task

    # ------------------------------------------------------------------ draining

    def refuse_new(self) -> None:
        """Admit nothing more (running groups go on)."""
        if self._state == "serving":
            self._state = "draining"
            logger.info("worker %s draining: %d group(s) running", self.name, len(self._running))

    async def drain(self, timeout: float | None = None) -> int:
        """Refuse new groups, wait for the running ones, cancel what is left at ``timeout``.

        Returns how many groups were cancelled (each answered ``failed``, ``infra``).

        **Cancellation**: the running groups are left to their callers.
        """
        self.refuse_new()
        timeout = self.options.drain_timeout if timeout is None else timeout
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        left = list(self._running.values())
        for running in left:
            running.why_cancelled = RolloutFailure.of(
                "infra",
                f"worker {self.name} shut down before the group finished (drain timeout "
                f"{timeout:g} s)",
                source="worker",
            )
            running.scope.cancel(reason="the worker is shutting down")
        if left:
            logger.warning(
                "worker %s: cancelled %d group(s) at its drain timeout", self.name, len(left)
            )
            with cleanup_scope(
                f"worker {self.name}: answer the cancelled groups",
                self.manager.close_timeout + self.options.reply_reserve_seconds,
                reason="drain timeout",
                log=logger,
            ):
                await self._idle.wait()
        return len(left)


def _deadline_failure(request: GroupRequest, *, waited: bool) -> RolloutFailure:
    why = "waited for a free slot until" if waited else "did not finish before"
    return RolloutFailure.of(
        "agent_timeout",
        f"group {request.group_id} {why} its deadline "
        f"({time.strftime('%H:%M:%S', time.gmtime(request.deadline))} UTC)",
        source="deadline",
    )


@asynccontextmanager
async def open_worker(
    environments: Mapping[str, Environment],
    server: Any,
    *,
    options: WorkerOptions | None = None,
    limits: Limits | None = None,
    sandbox_factory: SandboxFactory | None = None,
    tokenizer: Tokenizer | None = None,
) -> AsyncIterator[RolloutWorker]:
    """Open a worker: its sandbox root (a dead predecessor's reaped), sandbox manager, task group.

    Raises:
        ConfigError: A live worker has this name, or an asyncio-only environment under trio.

    **Cancellation**: groups are cancelled, sandboxes released and the root removed.
    """
    options = options or WorkerOptions()
    if current_async_library() != "asyncio":
        asyncio_only = sorted(n for n, e in environments.items() if e.asyncio_only)
        if asyncio_only:
            raise ConfigError(
                f"environments {asyncio_only} run on asyncio only (atroposlib); start the "
                "worker on asyncio"
            )
    await sweep_dead_roots(options.sandbox_parent)
    root = await claim_root(options.sandbox_parent, options.name)
    factory = sandbox_factory or local_factory(root, isolation=options.isolation)
    limits = limits or Limits()
    try:
        async with (
            open_sandbox_manager(factory, limits=limits) as manager,
            anyio.create_task_group() as tg,
        ):
            worker = RolloutWorker(
                environments,
                server,
                manager=manager,
                limits=limits,
                task_group=tg,
                options=options,
                tokenizer=tokenizer,
            )
            try:
                yield worker
            finally:
                # Groups still running are answered (failed, infra) before the sandboxes go.
                await worker.drain(timeout=0)
                worker._state = "closed"
                tg.cancel_scope.cancel(reason=f"worker {options.name} closed")
    finally:
        # An orderly exit removes the root; a crash leaves it to the next worker's sweep.
        await _remove_root(root)


async def _remove_root(root: str) -> None:
    with cleanup_scope(f"remove the worker root {root}", 30.0, reason="worker closed", log=logger):
        await release_root(root)
