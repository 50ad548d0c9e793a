"""SandboxManager: one sandbox per rollout, created lazily, gated, reaped, always released.

Why one module of this size: one concept, a sandbox's lifetime. The table, the hand-over,
busy counts, the idle reaper and queued releases are :mod:`hermes_async.tools._lifetimes`'s,
as for browser sessions; this module keeps how a sandbox is made, what idle means for it and
how it closes. :class:`ManagedSandbox` is the handle to one entry.

::

    async with SandboxManager(factory=local_factory(), limits=limits) as manager:
        sandbox = await manager.get("task-1")       # created on first use
        result = await sandbox.exec("ls")           # behind limits.sandbox_exec
        await manager.release("task-1")             # idempotent, shielded, bounded

Decisions:

* **Creation** runs behind ``limits.sandbox_create`` with a deadline (``create_timeout``).
  Concurrent ``get()`` calls for one ``task_id`` create exactly one sandbox: the first caller
  creates, the others wait for it. If the creator is cancelled, a waiter takes over; if creation
  fails, every waiter gets the same :class:`~hermes_async.errors.SandboxError`.
* **Commands** are gated where they run: ``get()`` returns a :class:`ManagedSandbox` wrapper
  whose every operation holds a ``limits.sandbox_exec`` slot and marks the sandbox busy, so
  tools need not know about limiters and the reaper never closes a sandbox mid-command.
* **Release** pops the sandbox and closes it under one
  :func:`~hermes_async._cleanup.cleanup_scope` bounded by ``close_timeout``: never skipped by
  cancellation, never hangs; a close that overruns is logged with its reason. This is *the* bound
  of a release: callers (the loop, the rollout pipeline, ``ToolContext``) add none of their own,
  and backends' ``aclose`` does not shield (each external call in it has its own deadline).
  ``release(task_id, interrupted=True)`` — the rollout was cancelled or timed out — lets the
  backend skip graceful steps. Releasing an unknown or already released id is a no-op; a second
  concurrent release waits for the first.
* **Exit waits for everything in flight**: leaving the manager releases every sandbox, then
  waits for the creations and closes other tasks still run (bounded by ``create_timeout +
  close_timeout``), so a sandbox a straggler was creating or closing when the run ended is gone
  when the exit returns; a creation that gets its ``sandbox_create`` slot after the exit began
  fails at once instead of starting a sandbox. (Found in serve runs: atroposlib drops the workers
  it cancels from its set, and a manager that returned while one of them was closing let
  ``asyncio.run``'s final cancel cut that close in half, leaving its directory behind.)
* **Per-item sandboxes**: :meth:`assign_spec` records a
  :class:`~hermes_async.tools.sandbox.spec.SandboxSpec` for a task id; that id's sandbox is then
  created with ``factory(task_id, spec=spec)`` (its ``create_timeout`` replacing the manager's)
  and the spec is forgotten when the sandbox is released. The rollout core assigns the spec an
  environment's ``sandbox_spec(item)`` returns.
* **Watch hook**: right after creating a sandbox the manager runs its
  :meth:`~hermes_async.tools.sandbox.base.Sandbox.watch` in its own task group (the Docker
  disk-cap watchdog), cancelled at the release.
* **A dead sandbox** (:class:`~hermes_async.tools.sandbox.errors.SandboxUnavailableError`) is
  remembered per task: :meth:`SandboxManager.sandbox_failure` answers it even after the
  release, so the rollout core can record an infrastructure failure (``exc.category ==
  "infra"``, ``exc.reason``); it is forgotten when a new sandbox is created for the task.
* **Idle reaper**: a task in the manager's own task group closes sandboxes unused for
  ``idle_timeout`` seconds (none with a command in flight or a running background process).
* :meth:`request_release` is the synchronous form: it queues the release to the manager's own
  janitor task (no fire-and-forget task; the queue is drained by a task the manager owns and
  everything left is released when the manager exits). ``ToolContext.cleanup()`` called without
  ``await`` relies on it.
* The manager must be entered (``async with``) before use: its task group hosts the reaper and
  the janitor, and its exit releases every sandbox, concurrently, each release bounded by
  ``close_timeout`` (so exiting takes at most about ``close_timeout``; no second bound around
  them), with ``interrupted=True`` when the block exits by an exception or a cancellation.
* **Factory close hook**: a factory with an ``aclose()`` coroutine method (the remote
  backends, E2B and Daytona, whose ``aclose`` reaps the run's leftovers by label) has it awaited
  after the releases, shielded and bounded by ``close_timeout``; factories without one (local,
  Docker, Modal) are untouched.

A process-wide *current* manager lives in a :class:`contextvars.ContextVar`, so code that builds
``ToolContext(task_id)`` with no other argument (reference-style reward functions) finds the
rollout's sandbox. Set it with :func:`use_sandbox_manager` or :func:`open_sandbox_manager`; tasks
started inside inherit it. There is deliberately no implicit default: a missing manager is an
error that says how to set one, never a silently created sandbox nobody closes.
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
        active: Sandboxes alive now.
        creating: Creations in progress.
        busy: Sandboxes with an operation in flight.
        created: Sandboxes created since the manager opened.
        released: Sandboxes released (explicitly, by the reaper, or at exit).
        reaped: Of those, released by the idle reaper.
        create_failures: Creations that raised.
        create_wait_seconds: Seconds ``get()`` callers spent waiting for their sandbox to be
            created or taken from the pool (summed over creations).
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
    """Own the sandboxes of many rollouts: one per ``task_id``.

    Args:
        factory: ``async (task_id) -> Sandbox`` (default: the ``local`` backend with its
            defaults).
        limits: The limiters (``sandbox_create``, ``sandbox_exec``) shared with the rest of the
            environment (default: a fresh :class:`~hermes_async.limits.Limits`).
        idle_timeout: Seconds of inactivity before the reaper closes a sandbox; ``None`` or
            ``math.inf`` disables the reaper.
        create_timeout: Deadline for one creation.
        close_timeout: Deadline for one release.
        reap_interval: Seconds between reaper passes (default: ``idle_timeout / 4``, between 1
            and 60 s).
        warm_pool: Keep sandboxes warm
            (:class:`~hermes_async.tools.sandbox.warm_pool.WarmPoolOptions`; ``None`` or
            ``size=0``: every sandbox is created when asked for).
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
        """Release every sandbox, stop the reaper and the janitor (see :meth:`aclose`).

        A block that raised (or was cancelled) releases with ``interrupted=True``. The block's
        exception propagates as itself: the manager's task group never sees it (it would wrap
        it in an ``ExceptionGroup``); only a failure of the manager's own tasks comes out as a
        group.
        """
        await self._shutdown(interrupted=exc is not None)

    async def aclose(self, *, interrupted: bool = False) -> None:
        """Release every sandbox, stop the reaper and the janitor. Idempotent.

        What ``async with`` does on exit: the releases run concurrently, each bounded by
        ``close_timeout`` (the one bound; nothing wraps them in a second).

        Args:
            interrupted: Release with ``interrupted=True`` (the run was cancelled).

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

        Specs are filled in the order they are asked for; see
        :mod:`~hermes_async.tools.sandbox.warm_pool`.

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
        """The sandbox of ``task_id``, created on first use (behind ``limits.sandbox_create``).

        Raises:
            SandboxError: The manager is not open, or creation failed or timed out (the
                original error is the ``__cause__``).

        **Cancellation**: if the caller that is creating the sandbox is cancelled, creation is
        abandoned (the factory cleans up what it started) and a concurrent waiter, if any,
        starts over.
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
        """Create ``task_id``'s sandbox from ``spec`` (``None``: forget a recorded spec).

        Takes effect at the sandbox's next creation; released with the sandbox.

        Raises:
            ConfigError: The manager's factory takes no ``spec`` keyword.
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

        Never raises for a backend failure (it is logged): cleanup must not mask the
        rollout's own outcome. This is the one bound of a release: do not wrap it in another.

        Args:
            task_id: The rollout whose sandbox to close.
            interrupted: The rollout was cancelled or timed out: the backend may skip graceful
                steps (the local backend sends SIGKILL at once). The loop and the rollout
                pipeline pass it; the default is the graceful close.

        **Cancellation**: runs shielded, bounded by ``close_timeout``; the sandbox is closed
        (or the overrun logged) before cancellation propagates.
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
        """Why ``task_id``'s sandbox is gone, if it died (kept after its release).

        For the rollout core: a rollout whose sandbox died is an infrastructure failure
        (``error.category == "infra"``; ``error.reason`` says why: ``"oom"``, ``"disk"``,
        ``"exited"``, ``"unreachable"``), not the model's. ``None`` while the sandbox is fine
        (or was never created). Forgotten when a new sandbox is created for ``task_id``.
        """
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
        """Queue a release of ``task_id`` to the manager's janitor task (synchronous).

        For callers that cannot await (``ToolContext.cleanup()`` called without ``await``).
        The release happens on the janitor's next wake-up, or at the latest when the manager
        exits; a newer sandbox of the same id is left alone. No-op if the manager is not open.
        """
        self._lifetimes.request_release(task_id)

    async def reap_idle(self) -> int:
        """Release sandboxes idle for ``idle_timeout``; return how many (the reaper's pass).

        A sandbox with an operation in flight or a running background process is not idle.

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
    """The sandbox a :class:`SandboxManager` hands out: every operation is gated and tracked.

    Each call holds a ``limits.sandbox_exec`` slot for its duration and marks the sandbox busy
    (the idle reaper skips busy sandboxes); a :class:`SandboxUnavailableError` it raises is
    recorded as the sandbox's failure. ``aclose()`` (and ``async with``) release the sandbox
    through the manager, whose ``close_timeout`` is the release's one bound. The underlying
    backend object is :attr:`inner`. Every operation is the backend's own (forwarded by
    :class:`~hermes_async.tools.sandbox.wrapper.SandboxWrapper`), with its cancellation
    semantics; the slot is returned on the way out.
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
        """Run a command (see :meth:`Sandbox.exec`) holding a ``sandbox_exec`` slot, traced.

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
    """Make ``manager`` the current one for this context (and tasks started inside it).

    ``ToolContext(task_id)`` without a ``manager=`` argument uses it::

        async with SandboxManager(local_factory()) as manager:
            with use_sandbox_manager(manager):
                ...
    """
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

    **Cancellation**: on exit, however it exits, every sandbox is released (shielded, bounded).
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
