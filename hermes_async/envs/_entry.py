"""The wrapper around atroposlib's entry points (``serve``, ``process``, ``evaluate``).

Each run gets one sandbox manager, SIGTERM as a cancellation (exit 143), GC tuning, its
spawned tasks stopped while the manager is open, and atroposlib's clients closed. Why:
docs/architecture.md, "Running atroposlib's entry points".
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    contextmanager,
    nullcontext,
)
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskStatus

from hermes_async._cleanup import cleanup_scope
from hermes_async._groups import single_errors
from hermes_async.envs._watchdog import Watchdog
from hermes_async.telemetry import serve_metrics
from hermes_async.tools.sandbox.host import pidfd_child_watcher

__all__ = ("STRAY_TASK_TIMEOUT_SECONDS", "SpawnedTasks", "as_child", "run_entry")

logger = logging.getLogger("hermes_async.envs.base")

T = TypeVar("T")

#: Deadline for closing atroposlib's OpenAI SDK clients at the end of a run (all of them).
_CLIENT_CLOSE_TIMEOUT_SECONDS = 5.0

#: Deadline for atroposlib's own tasks to finish once cancelled at the end of a run (all of
#: them; their rollouts' sandbox releases have their own, shorter bounds).
STRAY_TASK_TIMEOUT_SECONDS = 30.0


async def run_entry(
    what: str,
    run: Callable[[], Awaitable[None]],
    *,
    sandboxes: Callable[[], AbstractAsyncContextManager[Any]],
    gc_tuning: Callable[[], AbstractContextManager[object]] | None,
    servers: Iterable[object] = (),
    watchdog: Watchdog | None = None,
    stray_tasks: Callable[[], Iterable[object]] = tuple,
    metrics_port: int | None = None,
) -> None:
    """Run ``run()`` inside a run-level sandbox manager, SIGTERM handling and GC tuning.

    Args:
        sandboxes: Opens the run's sandbox manager (and makes it current).
        servers: atroposlib's servers, whose OpenAI clients are closed at the end.
        stray_tasks: The asyncio tasks ``run()`` spawned and does not await.
        metrics_port: Serve metrics on 127.0.0.1 at this port (``None``: not served).

    Raises:
        SystemExit: 143, after a SIGTERM was handled and everything released.

    **Cancellation**: stray tasks, sandboxes and clients are cleaned up, shielded and bounded.
    """
    terminated = False
    tuned: AbstractContextManager[object] = gc_tuning() if gc_tuning is not None else nullcontext()
    try:
        with tuned, single_errors(), pidfd_child_watcher():
            async with sandboxes(), anyio.create_task_group() as tg:

                async def on_sigterm(*, task_status: TaskStatus[None]) -> None:
                    nonlocal terminated
                    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                        task_status.started()
                        async for _ in signals:
                            logger.warning("SIGTERM: stopping %s, releasing sandboxes", what)
                            terminated = True
                            tg.cancel_scope.cancel(reason=f"SIGTERM during {what}")
                            return

                if threading.current_thread() is threading.main_thread():
                    await tg.start(on_sigterm)
                if watchdog is not None:
                    await tg.start(watchdog.run)
                if metrics_port is not None:
                    port = await tg.start(serve_metrics, metrics_port)
                    logger.info(
                        "%s: metrics at http://127.0.0.1:%d/metrics (hermes-async status "
                        "http://127.0.0.1:%d)",
                        what,
                        port,
                        port,
                    )
                try:
                    await run()
                finally:
                    await _stop_stray_tasks(stray_tasks(), what)
                tg.cancel_scope.cancel(reason=f"{what} finished")
    finally:
        await _close_openai_clients(servers)
    if terminated:
        raise SystemExit(128 + signal.SIGTERM)


class SpawnedTasks:
    """The asyncio tasks that entered :meth:`track` and have not finished.

    Unlike atroposlib's set, it forgets a task only when it left the block, not when cancelled.
    """

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    @contextmanager
    def track(self) -> Iterator[None]:
        """Remember the current asyncio task for the block (nothing outside asyncio)."""
        try:
            task = asyncio.current_task()
        except RuntimeError:  # not in asyncio (trio): atroposlib's tasks cannot exist there
            task = None
        if task is None:
            yield
            return
        self._tasks.add(task)
        try:
            yield
        finally:
            self._tasks.discard(task)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)


async def as_child(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)`` in a child task, so ``Task.cancel()`` of the caller respects shields.

    A bare ``Task.cancel()`` lands inside shielded cleanup; a task group's host turns it into an
    anyio cancellation of its children, whose cleanup runs to its own deadline.
    """
    result: list[T] = []

    async def child() -> None:
        result.append(await fn(*args))

    with single_errors():
        async with anyio.create_task_group() as tg:
            tg.start_soon(child)
    return result[0]


async def _stop_stray_tasks(tasks: Iterable[object], what: str) -> None:
    """Cancel the unfinished tasks among ``tasks`` and wait for them; never raises.

    **Cancellation**: shielded, bounded by :data:`STRAY_TASK_TIMEOUT_SECONDS` in total.
    """
    pending = list(dict.fromkeys(t for t in tasks if isinstance(t, asyncio.Task) and not t.done()))
    if not pending:
        return
    for task in pending:
        task.cancel(f"{what} ended")
    with cleanup_scope(f"stop atroposlib's tasks after {what}", STRAY_TASK_TIMEOUT_SECONDS):
        await asyncio.wait(pending)  # an overrun is logged by cleanup_scope
    for task in pending:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: asyncio would log it as never retrieved


async def _close_openai_clients(servers: Iterable[object]) -> None:
    """Close the OpenAI clients of atroposlib's ``servers`` (it never does); never raises.

    **Cancellation**: shielded, bounded by :data:`_CLIENT_CLOSE_TIMEOUT_SECONDS` in total.
    """
    with cleanup_scope("close atroposlib's OpenAI clients", _CLIENT_CLOSE_TIMEOUT_SECONDS):
        for server in servers:
            close = getattr(getattr(server, "openai", None), "close", None)
            if close is None:
                continue
            try:
                await close()
            except Exception:  # closing is best effort; the run's result stands
                logger.debug("closing an atroposlib client failed", exc_info=True)
