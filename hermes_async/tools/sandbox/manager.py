"""SandboxManager: one sandbox per rollout, created lazily, gated, reaped, always released.

One creation per task, every operation behind ``limits.sandbox_exec``, every release shielded
and bounded by ``close_timeout``. Design: docs/architecture.md, "A sandbox's lifetime".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Self

import anyio
from anyio.abc import TaskGroup, TaskStatus

from hermes_async._checks import POSITIVE_FINITE, POSITIVE_SECONDS, check_value
from hermes_async._cleanup import bounded_cleanup, cleanup_scope
from hermes_async._current import Current
from hermes_async._otel import span
from hermes_async._resource import AsyncResource
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.limits import Limits
from hermes_async.tools._lifetimes import Lifetime, Lifetimes
from hermes_async.tools.sandbox.base import (
    DEFAULT_CLOSE_TIMEOUT_SECONDS,
    ExecRequest,
    ExecResult,
    Sandbox,
    SandboxFactory,
)
from hermes_async.tools.sandbox.errors import SandboxUnavailableError
from hermes_async.tools.sandbox.spec import SandboxSpec, accepts_spec
from hermes_async.tools.sandbox.warm_pool import WarmPool, WarmPoolOptions, WarmPoolStatistics
from hermes_async.tools.sandbox.wrapper import SandboxWrapper

__all__ = (
    "DEFAULT_CLOSE_TIMEOUT_SECONDS",
    "DEFAULT_CREATE_TIMEOUT_SECONDS",
    "DEFAULT_IDLE_TIMEOUT_SECONDS",
    "ManagedSandbox",
    "SandboxFactory",
    "SandboxManager",
    "SandboxManagerStatistics",
    "current_sandbox_manager",
    "open_sandbox_manager",
    "use_sandbox_manager",
)

logger = logging.getLogger(__name__)

#: Seconds a sandbox may take to be created (container pulls and Modal cold starts included).
DEFAULT_CREATE_TIMEOUT_SECONDS = 300.0

#: Idle lifetime before the reaper closes a sandbox (the RL env's ``TERMINAL_LIFETIME_SECONDS``).
DEFAULT_IDLE_TIMEOUT_SECONDS = 3600.0

#: Dead-sandbox records kept after their release (oldest forgotten first).
_MAX_FAILURE_RECORDS = 4096


@dataclass(frozen=True, slots=True)
class SandboxManagerStatistics:
    """A snapshot of a manager.

    Attributes:
        released: Sandboxes released (explicitly, by the reaper, or at exit).
        reaped: Of those, released by the idle reaper.
        create_wait_seconds: Seconds ``get()`` callers waited for a sandbox, summed.
        warm_pool: The warm pool's counts (``None``: no warm pool).
    """

    active: int
    creating: int
    busy: int
    created: int
    released: int
    reaped: int
    create_failures: int
    create_wait_seconds: float = 0.0
    warm_pool: WarmPoolStatistics | None = None


class _ClosedBeforeCreate(SandboxError):
    """A creation that got its slot after the manager began to close (not a backend failure)."""


class SandboxManager(AsyncResource):
    """Own the sandboxes of many rollouts: one per ``task_id``. Enter it before use.

    Args:
        factory: ``async (task_id) -> Sandbox`` (default: the ``local`` backend).
        limits: The shared limiters (default: a fresh :class:`~hermes_async.limits.Limits`).
        idle_timeout: Seconds unused before the reaper closes a sandbox (``None``: never).
        reap_interval: Seconds between reaper passes (default ``idle_timeout / 4``, 1 to 60 s).
        warm_pool: Keep sandboxes warm (``None`` or ``size=0``: create each when asked).
    """

    def __init__(
        self,
        factory: SandboxFactory | None = None,
        *,
        limits: Limits | None = None,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT_SECONDS,
        create_timeout: float = DEFAULT_CREATE_TIMEOUT_SECONDS,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT_SECONDS,
        reap_interval: float | None = None,
        warm_pool: WarmPoolOptions | None = None,
    ) -> None:
        if factory is None:
            # By name: the manager knows no backend.
            from hermes_async.tools.sandbox.backends import make_backend_factory

            factory = make_backend_factory("local")
        # Finite: a creation is a wait on something external and a close is cleanup, and
        # both must end. No idle expiry is None (infinity means the same).
        check_value("SandboxManager.create_timeout", create_timeout, POSITIVE_FINITE)
        check_value("SandboxManager.close_timeout", close_timeout, POSITIVE_FINITE)
        check_value("SandboxManager.idle_timeout", idle_timeout, POSITIVE_SECONDS.or_none())
        check_value("SandboxManager.reap_interval", reap_interval, POSITIVE_FINITE.or_none())
        self.factory = factory
        self.limits = limits or Limits()
        self.create_timeout = create_timeout
        self.close_timeout = close_timeout
        idle = math.inf if idle_timeout is None else idle_timeout
        if reap_interval is None:
            reap_interval = min(60.0, max(1.0, idle / 4))
        self._lifetimes: Lifetimes[Sandbox] = Lifetimes(
            "sandbox",
            self._close_entry,
            logger,
            idle_timeout=idle,
            reap_interval=reap_interval,
            reapable=self._reapable,
        )
        self._watches: dict[Lifetime[Sandbox], anyio.CancelScope] = {}
        self._specs: dict[str, SandboxSpec] = {}
        self._tg: TaskGroup | None = None
        self._state = "unopened"
        self._created = self._released = self._create_failures = 0
        self._failures: dict[str, SandboxUnavailableError] = {}
        self._create_wait = 0.0
        self.warm_pool: WarmPool | None = None
        self._pool_scope: anyio.CancelScope | None = None
        self._pool_done: anyio.Event | None = None
        if warm_pool is not None and warm_pool.size > 0:
            self.warm_pool = WarmPool(warm_pool, self._new_sandbox, close_timeout=close_timeout)
            self._pool_scope = anyio.CancelScope()
            self._pool_done = anyio.Event()

    @property
    def idle_timeout(self) -> float:
        """Seconds unused before the reaper closes a sandbox (``math.inf``: never)."""
        return self._lifetimes.idle_timeout

    @property
    def reap_interval(self) -> float:
        """Seconds between reaper passes."""
        return self._lifetimes.reap_interval

    # ----------------------------------------------------------------------------------------
    # lifecycle

    async def __aenter__(self) -> Self:
        if self._state != "unopened":
            raise RuntimeError(f"SandboxManager cannot be entered twice (state: {self._state})")
        self._state = "open"
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            if self.warm_pool is not None:
                await self._tg.start(self._run_pool)
            await self._lifetimes.start(self._tg)
        except BaseException:
            self._tg.cancel_scope.cancel("SandboxManager failed to start its tasks")
            await self._tg.__aexit__(None, None, None)
            self._state = "closed"
            raise
        return self

    async def _close_on_exit(self, exc: BaseException | None) -> None:
        """Release everything (``interrupted`` if the block raised); its exception stays itself."""
        await self._shutdown(interrupted=exc is not None)

    async def aclose(self, *, interrupted: bool = False) -> None:
        """Release every sandbox concurrently, stop the reaper and the janitor. Idempotent.

        **Cancellation**: the releases run shielded, each bounded by ``close_timeout``.
        """
        await self._shutdown(interrupted=interrupted)

    async def _shutdown(self, *, interrupted: bool) -> None:
        if self._state == "unopened":
            self._state = "closed"
        if self._state != "open":
            return
        self._state = "closing"
        self._lifetimes.stop()
        assert self._tg is not None
        reason = (
            "the manager's block raised or was cancelled" if interrupted else "the manager closed"
        )
        try:
            if self._pool_scope is not None:
                self._pool_scope.cancel(f"SandboxManager closing: {reason}")  # no new warm ones
            # Shield only: every release inside is bounded by close_timeout.
            with cleanup_scope("release every sandbox", math.inf, reason=reason, log=logger):
                await self.release_all(interrupted=interrupted)
            await self._lifetimes.wait_in_flight(self.create_timeout + self.close_timeout, reason)
            if self.warm_pool is not None:
                assert self._pool_done is not None
                # Shield only: the filler's creations clean up after themselves when cancelled
                # (bounded by their factory), and each pooled close is bounded by close_timeout.
                with cleanup_scope("drain the warm pool", math.inf, reason=reason, log=logger):
                    await self._pool_done.wait()
                    await self.warm_pool.drain()
            factory_close = getattr(self.factory, "aclose", None)
            if callable(factory_close):
                await bounded_cleanup(
                    f"close the sandbox factory {self.factory!r}",
                    factory_close,
                    timeout=self.close_timeout,
                    reason=reason,
                    log=logger,
                )
        finally:
            self._state = "closed"
            self._tg.cancel_scope.cancel(f"SandboxManager closing: {reason}")
            await self._tg.__aexit__(None, None, None)

    async def _run_pool(self, *, task_status: TaskStatus[None]) -> None:
        assert self.warm_pool is not None
        assert self._pool_scope is not None and self._pool_done is not None
        try:
            with self._pool_scope:
                await self.warm_pool.run(task_status=task_status)
        finally:
            self._pool_done.set()

    def _create_timeout(self, spec: SandboxSpec | None) -> float:
        if spec is not None and spec.create_timeout is not None:
            return spec.create_timeout
        return self.create_timeout

    async def _new_sandbox(self, task_id: str, spec: SandboxSpec | None) -> Sandbox:
        """One factory call behind ``sandbox_create`` and the creation deadline (a cold create
        and the warm pool's fills alike); none starts once the manager is closing."""
        async with self.limits.sandbox_create:
            if self._state != "open":
                raise _ClosedBeforeCreate(
                    "the SandboxManager closed before this sandbox could be created",
                    task_id=task_id,
                )
            with anyio.fail_after(self._create_timeout(spec)):
                if spec is None:
                    return await self.factory(task_id)
                return await self.factory(task_id, spec=spec)  # type: ignore[call-arg]

    def prewarm(self, spec: SandboxSpec | None) -> None:
        """Keep sandboxes of ``spec`` warm for the rollouts to come (no-op without a pool).

        Raises:
            ConfigError: ``spec`` is given but the factory takes no ``spec`` keyword.
        """
        if spec is not None and not accepts_spec(self.factory):
            raise ConfigError(
                f"this SandboxManager's factory {self.factory!r} takes no spec= keyword, so it "
                "cannot prewarm per-item sandboxes"
            )
        if self.warm_pool is not None and self._state == "open":
            self.warm_pool.prewarm(spec)

    def _check_open(self) -> None:
        if self._state != "open":
            hint = (
                "use `async with SandboxManager(...) as manager:`"
                if self._state == "unopened"
                else "it has been closed"
            )
            raise SandboxError(f"SandboxManager is not open ({self._state}); {hint}")

    # ----------------------------------------------------------------------------------------
    # get / release

    async def get(self, task_id: str) -> ManagedSandbox:
        """The sandbox of ``task_id``, created on first use.

        Raises:
            SandboxError: The manager is not open, or creation failed or timed out.

        **Cancellation**: a cancelled creator abandons the creation; a waiter starts over.
        """
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"task_id must be a non-empty string, got {task_id!r}")
        self._check_open()
        entry = await self._lifetimes.get(task_id, self._create)
        if entry.live:
            entry.last_used = anyio.current_time()
            return ManagedSandbox(self, entry)
        if entry.error is None:
            raise SandboxError(
                "the sandbox was released while it was being created", task_id=task_id
            )
        raise SandboxError(
            entry.error.message
            if isinstance(entry.error, SandboxError)
            else f"could not create the sandbox: {entry.error!r}",
            task_id=task_id,
        ) from entry.error

    def assign_spec(self, task_id: str, spec: SandboxSpec | None) -> None:
        """Create ``task_id``'s next sandbox from ``spec`` (``None``: forget it); released with it.

        Raises:
            ConfigError: The factory takes no ``spec`` keyword.
        """
        if spec is None:
            self._specs.pop(task_id, None)
            return
        if not accepts_spec(self.factory):
            raise ConfigError(
                f"this SandboxManager's factory {self.factory!r} takes no spec= keyword, so it "
                "cannot create per-item sandboxes; use a built-in backend "
                "(make_backend_factory) or accept `spec: SandboxSpec | None = None`"
            )
        self._specs[task_id] = spec

    def spec_for(self, task_id: str) -> SandboxSpec | None:
        """The spec recorded for ``task_id`` (see :meth:`assign_spec`), if any."""
        return self._specs.get(task_id)

    async def _create(self, entry: Lifetime[Sandbox]) -> Sandbox:
        """Make ``entry``'s sandbox: from the warm pool, else the factory; start its watch."""
        task_id = entry.key
        spec = self._specs.get(task_id)
        start = anyio.current_time()
        try:
            with span("sandbox create", {"hermes_async.task_id": task_id}) as s:
                warm = None
                if self.warm_pool is not None:
                    warm = await self.warm_pool.take(spec, task_id)
                    s.set("hermes_async.sandbox.pooled", warm is not None)
                sandbox = warm if warm is not None else await self._new_sandbox(task_id, spec)
        except TimeoutError as exc:
            self._create_failures += 1
            raise SandboxError(
                f"sandbox creation timed out after {self._create_timeout(spec):g} s; raise "
                "create_timeout or check the backend",
                task_id=task_id,
            ) from exc
        except _ClosedBeforeCreate:
            raise
        except Exception as exc:
            self._create_failures += 1
            raise SandboxError(
                f"could not create the sandbox: {type(exc).__name__}: {exc}", task_id=task_id
            ) from exc
        finally:
            self._create_wait += anyio.current_time() - start
        self._created += 1
        self._failures.pop(task_id, None)
        self._start_watch(entry, sandbox)
        return sandbox

    async def release(self, task_id: str, *, interrupted: bool = False) -> None:
        """Close ``task_id``'s sandbox: kill its processes and remove it. Idempotent.

        Never raises for a backend failure (logged): cleanup must not mask the rollout's outcome.
        ``interrupted``: the rollout was cancelled or timed out; graceful steps may be skipped.

        **Cancellation**: runs shielded, bounded by ``close_timeout``, the one bound of a release.
        """
        self._specs.pop(task_id, None)
        reason = "the rollout was interrupted" if interrupted else "released"
        await self._lifetimes.release(task_id, interrupted=interrupted, reason=reason)

    async def _close_entry(self, entry: Lifetime[Sandbox], interrupted: bool, reason: str) -> None:
        """How a sandbox closes: its watch stopped, its death noted, ``aclose`` bounded."""
        self._specs.pop(entry.key, None)
        watch = self._watches.pop(entry, None)
        if watch is not None:
            watch.cancel("the sandbox is being released")
        sandbox = entry.value
        if sandbox is None:
            return  # still being created: the creator closes it when it is done
        self._note_gone(entry.key, sandbox)
        with span(
            "sandbox close",
            {"hermes_async.task_id": entry.key, "hermes_async.interrupted": interrupted},
        ):
            await bounded_cleanup(
                f"close the sandbox of {entry.key!r}",
                lambda: sandbox.aclose(interrupted=interrupted),
                timeout=self.close_timeout,
                reason=reason,
                log=logger,
            )
        self._released += 1

    def _start_watch(self, entry: Lifetime[Sandbox], sandbox: Sandbox) -> None:
        if self._tg is None or type(sandbox).watch is Sandbox.watch:
            return  # the default hook does nothing: no task for it
        scope = self._watches[entry] = anyio.CancelScope()

        async def watch() -> None:
            with scope:
                try:
                    await sandbox.watch()
                except Exception:  # a watchdog's failure must not take the manager down
                    logger.warning("the watch of %r's sandbox failed", entry.key, exc_info=True)

        self._tg.start_soon(watch)

    def record_failure(self, task_id: str, error: SandboxUnavailableError) -> None:
        """Remember that ``task_id``'s sandbox is gone (the first error wins)."""
        if task_id not in self._failures:
            if len(self._failures) >= _MAX_FAILURE_RECORDS:
                del self._failures[next(iter(self._failures))]
            self._failures[task_id] = error

    def _note_gone(self, task_id: str, sandbox: Sandbox) -> None:
        gone = getattr(sandbox, "gone", None)
        if isinstance(gone, SandboxUnavailableError):
            self.record_failure(task_id, gone)

    def sandbox_failure(self, task_id: str) -> SandboxUnavailableError | None:
        """Why ``task_id``'s sandbox died (kept after the release); ``None`` while it is fine."""
        entry = self._lifetimes.entries.get(task_id)
        if entry is not None and entry.value is not None:
            self._note_gone(task_id, entry.value)
        return self._failures.get(task_id)

    async def release_all(self, *, interrupted: bool = False) -> None:
        """Release every sandbox, concurrently.

        **Cancellation**: each release is shielded and bounded.
        """
        async with anyio.create_task_group() as tg:
            for task_id in list(self._lifetimes.entries):
                tg.start_soon(functools.partial(self.release, task_id, interrupted=interrupted))

    def request_release(self, task_id: str) -> None:
        """Queue a release of ``task_id`` to the janitor task, for callers that cannot await.

        A newer sandbox of the same id is left alone. No-op if the manager is not open.
        """
        self._lifetimes.request_release(task_id)

    async def reap_idle(self) -> int:
        """Release sandboxes idle for ``idle_timeout``; return how many.

        **Cancellation**: releases already started complete (shielded, bounded).
        """
        return await self._lifetimes.reap_idle()

    async def _reapable(self, entry: Lifetime[Sandbox]) -> bool:
        """Idle means no running background process either (probed, bounded)."""
        sandbox = entry.value
        assert sandbox is not None
        if all(p.exited for p in sandbox.background_processes()):
            return True
        with anyio.move_on_after(self.close_timeout):
            for p in sandbox.background_processes():
                if p.exited:
                    continue
                try:
                    status = await sandbox.background_status(p.session_id, tail_chars=0)
                except Exception:  # an unreachable sandbox is reaped, not kept
                    logger.debug("probe of %s failed", p.session_id, exc_info=True)
                    continue
                if status.running:
                    return False
        return True

    # ----------------------------------------------------------------------------------------
    # introspection

    def __contains__(self, task_id: object) -> bool:
        entry = self._lifetimes.entries.get(task_id) if isinstance(task_id, str) else None
        return entry is not None and entry.value is not None

    def task_ids(self) -> list[str]:
        """Task ids with a live sandbox."""
        return [t for t, e in self._lifetimes.entries.items() if e.value is not None]

    def statistics(self) -> SandboxManagerStatistics:
        """A snapshot of counts."""
        entries = list(self._lifetimes.entries.values())
        return SandboxManagerStatistics(
            active=sum(e.value is not None for e in entries),
            creating=sum(e.value is None for e in entries),
            busy=sum(e.busy > 0 for e in entries),
            created=self._created,
            released=self._released,
            reaped=self._lifetimes.reaped,
            create_failures=self._create_failures,
            create_wait_seconds=self._create_wait,
            warm_pool=self.warm_pool.statistics() if self.warm_pool is not None else None,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<SandboxManager [{self._state} | {s.active} active, {s.busy} busy, "
            f"{s.creating} creating]>"
        )


class ManagedSandbox(SandboxWrapper):
    """The sandbox a :class:`SandboxManager` hands out: every operation gated and tracked.

    Each call holds a ``limits.sandbox_exec`` slot and marks the sandbox busy; a
    :class:`SandboxUnavailableError` is recorded as its failure. ``aclose()`` releases through
    the manager. The backend object is :attr:`inner`.
    """

    def __init__(self, manager: SandboxManager, entry: Lifetime[Sandbox]) -> None:
        assert entry.value is not None
        super().__init__(entry.value)
        self._manager = manager
        self._entry = entry

    def __repr__(self) -> str:
        return f"<ManagedSandbox {self.inner!r}>"

    @contextlib.asynccontextmanager
    async def around(self) -> AsyncIterator[Sandbox]:
        """Hold a ``sandbox_exec`` slot and the busy mark for one operation."""
        if self._entry.released:
            raise SandboxError(
                "this sandbox was released; call manager.get(task_id) again for a new one",
                task_id=self.task_id,
            )
        with self._entry.in_use():
            try:
                async with self._manager.limits.sandbox_exec:
                    yield self.inner
            except SandboxUnavailableError as exc:
                self._manager.record_failure(self.task_id, exc)
                raise

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        """Run a command holding a ``sandbox_exec`` slot, traced.

        **Cancellation**: as the backend's; the slot is returned.
        """
        with span("sandbox exec", {"hermes_async.task_id": self.task_id}) as traced:
            result = await super().exec_request(request)
            traced.set("hermes_async.exit_code", result.exit_code)
            return result

    @property
    def gone(self) -> SandboxUnavailableError | None:
        """Why the sandbox is gone, if it died (see :meth:`SandboxManager.sandbox_failure`)."""
        return self._manager.sandbox_failure(self.task_id)

    async def alive(self) -> bool:
        """See :meth:`Sandbox.alive` (a released sandbox is not)."""
        return not self._entry.released and await self.inner.alive()

    async def aclose(self, interrupted: bool = False) -> None:
        """Release the sandbox through the manager (idempotent).

        **Cancellation**: shielded and bounded, as :meth:`SandboxManager.release`.
        """
        await self._manager.release(self.task_id, interrupted=interrupted)


# --------------------------------------------------------------------------------------------
# the current manager

_CURRENT: Current[SandboxManager | None] = Current("hermes_async_sandbox_manager", None)


def current_sandbox_manager() -> SandboxManager | None:
    """The manager set by :func:`use_sandbox_manager` in this context, or ``None``."""
    return _CURRENT.get()


def use_sandbox_manager(
    manager: SandboxManager,
) -> contextlib.AbstractContextManager[SandboxManager]:
    """Make ``manager`` current here and in tasks started inside (``ToolContext`` uses it)."""
    return _CURRENT.use(manager)  # type: ignore[return-value]  # gives the manager, never None


@contextlib.asynccontextmanager
async def open_sandbox_manager(
    factory: SandboxFactory | None = None,
    *,
    limits: Limits | None = None,
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT_SECONDS,
    create_timeout: float = DEFAULT_CREATE_TIMEOUT_SECONDS,
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT_SECONDS,
) -> AsyncIterator[SandboxManager]:
    """Open a :class:`SandboxManager` and make it current for the block.

    **Cancellation**: on exit every sandbox is released (shielded, bounded).
    """
    async with SandboxManager(
        factory,
        limits=limits,
        idle_timeout=idle_timeout,
        create_timeout=create_timeout,
        close_timeout=close_timeout,
    ) as manager:
        with use_sandbox_manager(manager):
            yield manager
