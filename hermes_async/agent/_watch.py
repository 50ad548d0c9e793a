"""A rollout's view of its sandbox that notices when the sandbox is lost.

Tools turn a ``SandboxError`` into a message for the model; :class:`WatchedSandboxes` also
turns the first one into an ``infra`` failure that aborts the loop, so a retry on a fresh
sandbox starts at once. Invariant: provisioning belongs to the rollout, not to the tool
call that triggers it, so a tool timeout abandons only the wait, never the creation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskGroup

from hermes_async.agent.failures import RolloutFailure, classify_exception
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.base import Sandbox, SandboxProvider
from hermes_async.tools.sandbox.wrapper import SandboxWrapper

__all__ = ("WatchedSandboxes",)


class WatchedSandboxes:
    """A :class:`SandboxProvider` that reports the first lost sandbox.

    Args:
        inner: The real provider (the run's ``SandboxManager``).
        on_failure: Called once, with the ``infra`` failure.
        tg: The rollout's task group, where the first ``get`` creates the sandbox
            (``None``: inside the caller).
    """

    __slots__ = ("_created", "_creation_error", "_inner", "_on_failure", "_tg", "failure")

    def __init__(
        self,
        inner: SandboxProvider,
        on_failure: Callable[[RolloutFailure], object],
        tg: TaskGroup | None = None,
    ) -> None:
        self._inner = inner
        self._on_failure = on_failure
        self._tg = tg
        self._created: anyio.Event | None = None
        self._creation_error: SandboxError | None = None
        self.failure: RolloutFailure | None = None

    def lost(self, exc: SandboxError) -> None:
        """Report ``exc``, seen by a tool outside this provider (a lost browser session); first one wins."""
        self._lost(exc)

    def _lost(self, exc: SandboxError) -> None:
        if self.failure is None:
            self.failure = classify_exception(exc, source="sandbox")
            self._on_failure(self.failure)

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[None]:
        """Report a ``SandboxError`` raised in the block (it still propagates)."""
        try:
            yield
        except SandboxError as exc:
            self._lost(exc)
            raise

    async def get(self, task_id: str) -> Sandbox:
        """The sandbox of ``task_id`` (created on first use, by the rollout), watched.

        Raises:
            SandboxError: The sandbox could not be created or is gone.

        **Cancellation**: only the wait is abandoned; the creation goes on in the rollout's task group.
        """
        if self._tg is not None:
            if self._created is None:
                self._created = anyio.Event()
                self._tg.start_soon(self._create, task_id, name=f"provision {task_id}")
            await self._created.wait()
            if self._creation_error is not None:
                raise self._creation_error
        async with self.watch():
            return _WatchedSandbox(await self._inner.get(task_id), self)

    async def _create(self, task_id: str) -> None:
        assert self._created is not None
        try:
            await self._inner.get(task_id)
        except SandboxError as exc:
            self._creation_error = exc
            self._lost(exc)
        finally:
            self._created.set()

    async def release(self, task_id: str, *, interrupted: bool = False) -> None:
        """Release through the inner provider (its bound applies; nothing is watched).

        **Cancellation**: as the inner provider's ``release``.
        """
        await self._inner.release(task_id, interrupted=interrupted)


class _WatchedSandbox(SandboxWrapper):
    """Forwards every operation to the sandbox it wraps, inside :meth:`WatchedSandboxes.watch`."""

    def __init__(self, inner: Sandbox, watcher: WatchedSandboxes) -> None:
        super().__init__(inner)
        self._watcher = watcher

    def __repr__(self) -> str:
        return f"<watched {self.inner!r}>"

    @asynccontextmanager
    async def around(self) -> AsyncIterator[Sandbox]:
        """Report a ``SandboxError`` of the operation (it still propagates)."""
        async with self._watcher.watch():
            yield self.inner
