"""Keyed lifetimes: one resource per key, made once, counted while used, reaped, released.

The skeleton ``SandboxManager`` and ``BrowserManager`` share: the owner says how to create,
what idle means and how to close; :class:`Lifetimes` keeps the table, hands a cancelled
creation over to a waiter, and runs the reaper and queued releases in the owner's task group.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar, cast

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup, TaskStatus

from hermes_async._cleanup import cleanup_scope

__all__ = ("Lifetime", "Lifetimes")

T = TypeVar("T")
_F = TypeVar("_F", bound=Callable[..., Any])


class _WeakHook:
    """A bound method held through a weak reference to its owner (two slots, not a
    ``WeakMethod`` and a closure: a parked standalone run keeps two of these)."""

    __slots__ = ("_function", "_owner")

    def __init__(self, method: Any) -> None:
        self._owner = weakref.ref(method.__self__)
        self._function = method.__func__

    def __call__(self, *args: Any) -> Any:
        owner = self._owner()
        if owner is None:
            raise RuntimeError(f"the owner of {self._function.__name__} is gone")
        return self._function(owner, *args)


def _weakly(hook: _F) -> _F:
    """``hook``, holding its owner weakly when it is a bound method."""
    if not inspect.ismethod(hook):
        return hook
    return cast(_F, _WeakHook(hook))


class Lifetime(Generic[T]):
    """One key's resource as its owner tracks it.

    Attributes:
        error: Why making it failed.
        ready: Set once ``value`` or ``error`` is.
        busy: Operations in flight (never idle while > 0).
        released: Set when a release took it out of the table.
    """

    __slots__ = ("busy", "error", "key", "last_used", "ready", "released", "value")

    def __init__(self, key: str) -> None:
        self.key = key
        self.value: T | None = None
        self.error: BaseException | None = None
        self.ready = anyio.Event()
        self.busy = 0
        self.last_used = anyio.current_time()
        self.released = False

    @property
    def live(self) -> bool:
        """Whether the resource is made and not released."""
        return self.value is not None and not self.released

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Count one operation for the block; its end is the last use."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            self.last_used = anyio.current_time()


#: ``async (lifetime, interrupted, reason) -> None``: the owner's close; bounded, never raises.
Close = Callable[[Lifetime[T], bool, str], Awaitable[None]]
#: ``async (lifetime) -> bool``: whether an unused resource may be reaped (default: yes).
Reapable = Callable[[Lifetime[T]], Awaitable[bool]]


class Lifetimes(Generic[T]):
    """The table of an owner's keyed resources.

    ``close`` is called on every release, made or not; ``reapable`` is the owner's last word on
    an unused one; ``idle_timeout`` may be ``math.inf``.
    """

    # Slots: every standalone run owns a table, held while it is parked.
    __slots__ = (
        "_accepting",
        "_close_hook",
        "_closing",
        "_creating",
        "_log",
        "_pending",
        "_reapable",
        "_tg",
        "_wake",
        "entries",
        "idle_timeout",
        "reap_interval",
        "reaped",
        "what",
    )

    def __init__(
        self,
        what: str,
        close: Close[T],
        logger: logging.Logger,
        *,
        idle_timeout: float = math.inf,
        reap_interval: float = 60.0,
        reapable: Reapable[T] | None = None,
    ) -> None:
        self.what = what
        self.entries: dict[str, Lifetime[T]] = {}
        self.idle_timeout = idle_timeout
        self.reap_interval = reap_interval
        self.reaped = 0
        # The hooks are the owner's methods: held weakly, or every owner is a reference cycle.
        self._close_hook = _weakly(close)
        self._log = logger
        self._reapable = _weakly(reapable) if reapable is not None else None
        self._closing: dict[str, anyio.Event] = {}
        # A dict as an ordered set: 64 bytes empty, where a set is 216.
        self._creating: dict[anyio.Event, None] = {}
        self._tg: TaskGroup | None = None
        self._accepting = False
        self._pending: list[tuple[Lifetime[T], str]] | None = None  # with the first request
        # The janitor starts with the first queued release: most owners never get one, and
        # thousands of parked standalone runs must not each keep an idle task.
        self._wake: anyio.Event | None = None

    async def start(self, tg: TaskGroup) -> None:
        """Run the reaper (when ``idle_timeout`` is finite) and later the janitor in ``tg``."""
        self._tg = tg
        self._accepting = True
        if math.isfinite(self.idle_timeout):
            await tg.start(self._reaper)

    def stop(self) -> None:
        """Accept no more work: a creation that finishes from now on is closed at once."""
        self._accepting = False

    @property
    def accepting(self) -> bool:
        """Whether the owner is open (between :meth:`start` and :meth:`stop`)."""
        return self._accepting

    # ----------------------------------------------------------------------------------------
    # get-or-create

    def claim(self, key: str) -> tuple[Lifetime[T], bool]:
        """``key``'s lifetime, and whether the caller just made it (then it must settle it)."""
        entry = self.entries.get(key)
        if entry is not None:
            return entry, False
        entry = self.entries[key] = Lifetime(key)
        return entry, True

    async def get(self, key: str, create: Callable[[Lifetime[T]], Awaitable[T]]) -> Lifetime[T]:
        """``key``'s lifetime, made by ``create`` in the first caller's task; later callers wait.

        A waiter may get it with ``error`` set; the creator gets its own exception.

        **Cancellation**: a cancelled creator abandons the creation and a waiter starts over.
        """
        while True:
            entry, new = self.claim(key)
            if new:
                await self._create(entry, create)
            else:
                await entry.ready.wait()
            if isinstance(entry.error, anyio.get_cancelled_exc_class()):
                continue  # the creator was cancelled: start over
            return entry

    async def _create(
        self, entry: Lifetime[T], create: Callable[[Lifetime[T]], Awaitable[T]]
    ) -> None:
        creating = anyio.Event()
        self._creating[creating] = None
        try:
            try:
                value = await create(entry)
            except BaseException as exc:
                self.fail(entry, exc)
                raise
            self.settle(entry, value)
            if entry.released or not self._accepting:
                await self._close(entry, False, "released during its creation")
        finally:
            self._creating.pop(creating, None)
            creating.set()

    def settle(self, entry: Lifetime[T], value: T) -> None:
        """``entry``'s resource is made: wake its waiters."""
        entry.value = value
        entry.last_used = anyio.current_time()
        entry.ready.set()

    def fail(self, entry: Lifetime[T], error: BaseException) -> None:
        """``entry``'s resource could not be made: forget it, wake its waiters with ``error``."""
        entry.error = error
        self.forget(entry)
        entry.ready.set()

    def forget(self, entry: Lifetime[T]) -> None:
        """Take ``entry`` out of the table, if it is still there (no close)."""
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]

    # ----------------------------------------------------------------------------------------
    # release

    async def release(
        self, key: str, *, interrupted: bool = False, reason: str = "released"
    ) -> Lifetime[T] | None:
        """Take ``key`` out and close it; idempotent (a second release waits for the first).

        **Cancellation**: shielded; the owner's close is its own bound.
        """
        entry = self.entries.pop(key, None)
        if entry is None:
            closing = self._closing.get(key)
            if closing is not None:
                # Shield only: the close being waited for is bounded by its owner.
                with cleanup_scope(f"wait for the close of {key!r}", math.inf, log=self._log):
                    await closing.wait()
            return None
        entry.released = True
        await self._close(entry, interrupted, reason)
        return entry

    async def _close(self, entry: Lifetime[T], interrupted: bool, reason: str) -> None:
        event = self._closing[entry.key] = anyio.Event()
        try:
            with cleanup_scope(f"close the {self.what} of {entry.key!r}", math.inf, log=self._log):
                await self._close_hook(entry, interrupted, reason)
        finally:
            event.set()
            if self._closing.get(entry.key) is event:
                del self._closing[entry.key]

    def request_release(self, key: str, *, reason: str = "release requested") -> None:
        """Queue a release of ``key`` to the janitor; a newer lifetime of the key is left alone."""
        entry = self.entries.get(key)
        if not self._accepting or entry is None:
            return
        if self._pending is None:
            self._pending = []
        self._pending.append((entry, reason))
        if self._wake is None:
            assert self._tg is not None
            self._wake = anyio.Event()
            self._tg.start_soon(self._janitor, name=f"{self.what} janitor")
        self._wake.set()

    async def _janitor(self) -> None:
        while True:
            assert self._wake is not None
            await self._wake.wait()
            self._wake = anyio.Event()
            pending, self._pending = self._pending or [], None
            for entry, reason in pending:
                if self.entries.get(entry.key) is entry:
                    await self.release(entry.key, reason=reason)

    async def release_all(self, *, interrupted: bool = False, reason: str = "released") -> None:
        """Release every key, concurrently.

        **Cancellation**: each release is shielded and bounded by its owner.
        """
        async with anyio.create_task_group() as tg:
            for key in list(self.entries):
                tg.start_soon(
                    functools.partial(self.release, key, interrupted=interrupted, reason=reason)
                )

    async def wait_in_flight(self, bound: float, reason: str) -> None:
        """Wait (shielded, at most ``bound`` seconds) for creations and closes still running."""
        if not (self._creating or self._closing):
            return
        with cleanup_scope(
            f"wait for the {self.what}s still being created or closed",
            bound,
            reason=reason,
            log=self._log,
        ):
            while pending := [*self._creating, *self._closing.values()]:
                await pending[0].wait()

    @property
    def creating(self) -> int:
        """Creations running in callers' tasks now."""
        return len(self._creating)

    # ----------------------------------------------------------------------------------------
    # idle

    async def _reaper(self, *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        while True:
            await anyio.sleep(self.reap_interval)
            await self.reap_idle()

    async def reap_idle(self) -> int:
        """Release what has been unused for ``idle_timeout``; return how many.

        **Cancellation**: releases already started complete (shielded, bounded).
        """
        reaped = 0
        for key, entry in list(self.entries.items()):
            if not self._idle(entry):
                continue
            if self._reapable is not None and not await self._reapable(entry):
                entry.last_used = anyio.current_time()
                continue
            if self.entries.get(key) is entry and not entry.busy:
                self._log.info("reaping the idle %s of %r", self.what, key)
                await self.release(key, reason="idle")
                reaped += 1
        self.reaped += reaped
        await anyio.lowlevel.checkpoint()
        return reaped

    def _idle(self, entry: Lifetime[T]) -> bool:
        unused = anyio.current_time() - entry.last_used
        return entry.value is not None and not entry.busy and unused >= self.idle_timeout
