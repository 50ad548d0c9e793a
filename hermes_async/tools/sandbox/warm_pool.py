"""Warm pools: sandboxes created before a rollout asks for one, handed out on demand.

Invariant: a handed-out sandbox passed its liveness check and is younger than ``max_age``;
an empty pool means a cold create, never a wait. Decisions: docs/decisions/004-warm-pools.md.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup, TaskStatus

from hermes_async._checks import AT_LEAST_ONE, POSITIVE, check_fields
from hermes_async._cleanup import bounded_cleanup
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = ("WarmPool", "WarmPoolOptions", "WarmPoolStatistics")

logger = logging.getLogger(__name__)

#: Seconds between the filler's passes over the pool's ages when nothing else wakes it.
_AGE_CHECK_MAX_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class WarmPoolOptions:
    """How a :class:`SandboxManager` keeps sandboxes warm.

    Attributes:
        size: Ready sandboxes kept per warm spec (0: no pool).
        max_age: Seconds a sandbox may wait; keep it below the provider's idle expiry.
        max_specs: Specs kept warm at once (the least recently asked for is dropped).
        fill_concurrency: Creations at once, each also holding a ``sandbox_create`` slot.
    """

    size: int = 4
    max_age: float = 600.0
    warm_default: bool = True
    max_specs: int = 4
    fill_concurrency: int = 4
    check_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"WarmPoolOptions.size must be >= 0, got {self.size!r}")
        check_fields(self, ("max_specs", "fill_concurrency"), AT_LEAST_ONE, error=ValueError)
        check_fields(self, ("max_age", "check_timeout"), POSITIVE, error=ValueError)


@dataclass(frozen=True, slots=True)
class WarmPoolStatistics:
    """A snapshot of a pool: sandboxes ready, creations in flight, hits and misses, closes by cause."""

    ready: int
    filling: int
    hits: int
    misses: int
    created: int
    expired: int
    failed_checks: int
    fill_failures: int


def _spec_key(spec: SandboxSpec | None) -> str:
    """A stable key of ``spec`` (``""`` for the default sandbox): equal specs share a pool."""
    return "" if spec is None else repr(spec)


class _Warm:
    __slots__ = ("filling", "ready", "spec")

    def __init__(self, spec: SandboxSpec | None) -> None:
        self.spec = spec
        self.ready: deque[tuple[Sandbox, float]] = deque()
        self.filling = 0


Create = Callable[[str, SandboxSpec | None], Awaitable[Sandbox]]


class WarmPool:
    """The pool a ``SandboxManager`` owns; ``create`` is the manager's guarded creation."""

    def __init__(self, options: WarmPoolOptions, create: Create, *, close_timeout: float) -> None:
        self.options = options
        self._create = create
        self._close_timeout = close_timeout
        self._warm: OrderedDict[str, _Warm] = OrderedDict()
        self._wake = anyio.Event()
        self._closing = False
        self._hits = self._misses = self._created = 0
        self._expired = self._failed_checks = self._fill_failures = 0
        self._fill_limiter = anyio.CapacityLimiter(options.fill_concurrency)
        self._tg: TaskGroup | None = None
        if options.warm_default:
            self._warm[""] = _Warm(None)

    # ------------------------------------------------------------------------- demand

    def prewarm(self, spec: SandboxSpec | None) -> None:
        """Keep ``spec``'s sandboxes warm (after the specs asked for before it)."""
        if self._closing or self.options.size == 0:
            return
        key = _spec_key(spec)
        if key in self._warm:
            self._warm.move_to_end(key)  # asked again: the last to be dropped
            return
        self._warm[key] = _Warm(spec)
        while len(self._warm) > self.options.max_specs:
            _, dropped = self._warm.popitem(last=False)
            self._close_later(dropped.ready, "its spec is no longer kept warm")
        self._wake.set()

    def statistics(self) -> WarmPoolStatistics:
        """A snapshot of counts."""
        return WarmPoolStatistics(
            ready=sum(len(w.ready) for w in self._warm.values()),
            filling=sum(w.filling for w in self._warm.values()),
            hits=self._hits,
            misses=self._misses,
            created=self._created,
            expired=self._expired,
            failed_checks=self._failed_checks,
            fill_failures=self._fill_failures,
        )

    # ------------------------------------------------------------------------- hand-out

    async def take(self, spec: SandboxSpec | None, task_id: str) -> Sandbox | None:
        """A ready, live sandbox of ``spec`` for ``task_id``, or ``None`` (create it cold).

        **Cancellation**: a sandbox taken out is either returned or closed (shielded, bounded).
        """
        warm = self._warm.get(_spec_key(spec))
        while warm is not None and warm.ready:
            sandbox, born = warm.ready.popleft()
            self._wake.set()  # one fewer ready: the filler tops it up
            if anyio.current_time() - born > self.options.max_age:
                self._expired += 1
                await self._discard(sandbox, born, "it waited past max_age")
                continue
            try:
                alive = await self._check(sandbox)
            except BaseException:
                await self._close(sandbox, "its hand-out was cancelled")
                raise
            if not alive:
                self._failed_checks += 1
                await self._discard(sandbox, born, "its liveness check failed")
                continue
            sandbox.task_id = task_id
            self._hits += 1
            return sandbox
        self._misses += 1
        return None

    async def _check(self, sandbox: Sandbox) -> bool:
        try:
            with anyio.fail_after(self.options.check_timeout):
                return await sandbox.alive()
        except Exception:  # TimeoutError included
            logger.debug("liveness check of a pooled sandbox failed", exc_info=True)
            return False

    # ------------------------------------------------------------------------- filling

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The filler: keeps every warm spec at ``size`` ready until cancelled."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await self._keep_filled(tg)
        finally:
            self._tg = None  # a take() from now on closes what it discards itself

    async def _keep_filled(self, tg: TaskGroup) -> None:
        while True:
            self._wake = anyio.Event()
            self._expire()
            for key, warm in list(self._warm.items()):
                while self._warm.get(key) is warm and (
                    self.options.size - len(warm.ready) - warm.filling > 0
                ):
                    # The slot is taken here, in order, so the specs asked for first are
                    # created first (tasks started together run in any order).
                    token = object()
                    await self._fill_limiter.acquire_on_behalf_of(token)
                    warm.filling += 1
                    tg.start_soon(self._fill, key, warm, token)
            with anyio.move_on_after(self._next_age_check()):
                await self._wake.wait()

    def _next_age_check(self) -> float:
        oldest = [born for w in self._warm.values() for _, born in w.ready]
        if not oldest:
            return _AGE_CHECK_MAX_SECONDS
        due = min(oldest) + self.options.max_age - anyio.current_time()
        return max(0.01, min(_AGE_CHECK_MAX_SECONDS, due))

    def _expire(self) -> None:
        now = anyio.current_time()
        for warm in self._warm.values():
            while warm.ready and now - warm.ready[0][1] > self.options.max_age:
                self._expired += 1
                self._close_later([warm.ready.popleft()], "it waited past max_age")

    async def _fill(self, key: str, warm: _Warm, token: object) -> None:
        try:
            if self._warm.get(key) is not warm:
                return  # the spec was dropped meanwhile
            try:
                sandbox = await self._create(f"pool-{secrets.token_hex(6)}", warm.spec)
            except Exception as exc:
                self._fill_failures += 1
                logger.warning("warm pool: creating a sandbox failed: %s", exc)
                # Back off: a backend that cannot create must not be hammered.
                await anyio.sleep(min(30.0, 0.5 * 2 ** min(self._fill_failures, 6)))
                return
        finally:
            self._fill_limiter.release_on_behalf_of(token)
            warm.filling -= 1
            self._wake.set()
        self._created += 1
        if self._warm.get(key) is not warm or self._closing:
            await self._close(sandbox, "its spec is no longer kept warm")
            return
        warm.ready.append((sandbox, anyio.current_time()))

    # ------------------------------------------------------------------------- closing

    def _close_later(self, items: Iterable[tuple[Sandbox, float]], why: str) -> None:
        """Close ``items`` in the filler's task group (from synchronous code)."""
        tg = self._tg
        assert tg is not None, "the filler runs from the manager's start"
        for sandbox, _ in items:
            tg.start_soon(self._close, sandbox, why)

    async def _discard(self, sandbox: Sandbox, born: float, why: str) -> None:
        """Close a sandbox take() will not hand out: in the filler's task group if it runs, else here."""
        if self._tg is not None:
            self._close_later([(sandbox, born)], why)
        else:
            await self._close(sandbox, why)

    async def _close(self, sandbox: Sandbox, why: str) -> None:
        await bounded_cleanup(
            f"close a pooled sandbox ({why})",
            lambda: sandbox.aclose(interrupted=True),
            timeout=self._close_timeout,
            reason=why,
            log=logger,
        )

    async def drain(self) -> None:
        """Close every ready sandbox once the filler is stopped.

        **Cancellation**: shielded; each close is bounded by the manager's ``close_timeout``.
        """
        self._closing = True
        ready = [item for w in self._warm.values() for item in w.ready]
        for w in self._warm.values():
            w.ready.clear()
        if not ready:
            return
        async with anyio.create_task_group() as tg:
            for sandbox, _ in ready:
                tg.start_soon(self._close, sandbox, "the manager closed")
