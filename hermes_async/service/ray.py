"""The rollout worker as async Ray actors, and the driver's pool of them.

Each actor holds a ``RolloutWorker`` on its own loop; :class:`RayWorkerPool` dispatches
groups to them. ``ray.cancel`` cancels a group in its worker's task group, so cleanup
runs. The ``ray`` extra; asyncio only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Self

import anyio

from hermes_async._asynclib import require_asyncio
from hermes_async._cleanup import cleanup_scope
from hermes_async.errors import ConfigError, WorkerError
from hermes_async.service.config import WorkerConfig, open_configured_worker
from hermes_async.service.dispatch import (
    DispatchOptions,
    DispatchStatistics,
    GroupDispatcher,
    WorkerLostError,
    result_of,
)
from hermes_async.service.wire import GroupRequest, GroupResult
from hermes_async.service.worker import RolloutWorker
from hermes_async.tools.sandbox.leftovers import SweepReport, sweep_dead_roots

__all__ = (
    "READY_TIMEOUT_SECONDS",
    "RayWorker",
    "RayWorkerPool",
    "RolloutWorkerActor",
    "actor_class",
)

logger = logging.getLogger(__name__)

#: How long a pool waits for its actors to open their workers (scheduling, imports,
#: the tokenizer, the environments' setup).
READY_TIMEOUT_SECONDS = 120.0

#: Starts of one actor while the pool opens: a worker process that dies before its actor
#: is ready (a loaded node, seen once in CI) is started again; an error in the actor's
#: ``__init__`` is not.
START_ATTEMPTS = 3

#: How long closing waits for an actor to close its worker before killing it.
CLOSE_TIMEOUT_SECONDS = 60.0


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"the Ray worker mode needs Ray: pip install 'hermes-async[ray]' ({exc})"
        ) from exc
    return ray


class RolloutWorkerActor:
    """The body of the rollout worker actor; :func:`actor_class` applies ``ray.remote``."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._worker: RolloutWorker | None = None
        self._events: tuple[anyio.Event, anyio.Event] | None = None
        self._error: BaseException | None = None

    def _ready_and_closed(self) -> tuple[anyio.Event, anyio.Event]:
        # anyio events need the running loop: made on the first async call, whichever it is.
        if self._events is None:
            self._events = (anyio.Event(), anyio.Event())
        return self._events

    async def serve(self) -> None:
        """Open the worker and hold it until :meth:`close` (the actor's long call).

        **Cancellation**: the worker closes (groups answered, sandboxes released).
        """
        ready, closed = self._ready_and_closed()
        try:
            async with open_configured_worker(self.config) as worker:
                self._worker = worker
                ready.set()
                await closed.wait()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._worker = None
            ready.set()

    async def _opened(self) -> RolloutWorker:
        ready, _ = self._ready_and_closed()
        with anyio.fail_after(READY_TIMEOUT_SECONDS):
            await ready.wait()
        if self._worker is None:
            raise WorkerError(f"worker {self.config.options.name} is not serving: {self._error!r}")
        return self._worker

    async def ready(self) -> tuple[str, int]:
        """``(name, pid)`` once the worker is open.

        **Cancellation**: nothing is held.
        """
        worker = await self._opened()
        return worker.name, os.getpid()

    async def run_group(self, body: bytes) -> tuple[int, bytes]:
        """A group request's JSON in; ``(status, JSON)`` out (see ``RolloutWorker.handle``).

        **Cancellation** (``ray.cancel``): the group is cancelled and its sandboxes released.
        """
        worker = await self._opened()
        return await worker.handle(body)

    async def statistics(self) -> dict[str, Any]:
        """The worker's statistics (plain JSON values)."""
        return (await self._opened()).statistics().to_json()

    async def drain(self, timeout: float | None = None) -> int:
        """Refuse new groups, finish or cancel the running ones (see ``RolloutWorker.drain``)."""
        return await (await self._opened()).drain(timeout)

    async def sweep(self) -> tuple[int, int, int]:
        """Reap dead workers' sandboxes on this node: ``(roots, sandboxes, processes)``."""
        report = await sweep_dead_roots(self.config.options.sandbox_parent)
        return report.roots, report.sandboxes, report.processes

    async def close(self) -> None:
        """End :meth:`serve` (it closes the worker)."""
        _, closed = self._ready_and_closed()
        closed.set()


def actor_class(max_concurrency: int = 1000) -> Any:
    """:class:`RolloutWorkerActor` as a Ray actor class (``.options(...).remote(config)``).

    Args:
        max_concurrency: Calls the actor runs at once; groups are bounded by the worker's
            ``max_groups`` and the pool's cap, not by this.
    """
    return _ray().remote(max_concurrency=max_concurrency)(RolloutWorkerActor)


class RayWorker:
    """A :class:`~hermes_async.service.dispatch.WorkerHandle` over one actor."""

    def __init__(self, actor: Any, name: str) -> None:
        self.actor = actor
        self.name = name

    async def run_group(self, request: GroupRequest) -> GroupResult:
        """See :class:`~hermes_async.service.dispatch.WorkerHandle`.

        **Cancellation**: ``ray.cancel`` of the call (the group is cancelled on the actor).
        """
        ray = _ray()
        from ray import exceptions

        ref = self.actor.run_group.remote(request.to_bytes())
        try:
            status, body = await ref
        except anyio.get_cancelled_exc_class():
            ray.cancel(ref)
            raise
        except exceptions.RayActorError as exc:
            raise WorkerLostError(
                f"actor {self.name} died: {type(exc).__name__}: {str(exc)[:300]}",
                worker=self.name,
                dead=True,
            ) from None
        except exceptions.TaskCancelledError as exc:
            raise WorkerLostError(
                f"the call to actor {self.name} was cancelled: {exc}", worker=self.name, dead=False
            ) from None
        except exceptions.RayTaskError as exc:
            raise WorkerError(f"actor {self.name} failed: {str(exc)[:500]}") from None
        return result_of(status, body, request, self.name)


class RayWorkerPool:
    """N rollout worker actors and the dispatcher over them (asyncio only; ``ray.init`` is yours).

    Use as ``async with RayWorkerPool(config, workers=4) as pool:``. Actors are named
    ``<name_prefix>-<i>``: stable names let a restarted worker find its predecessor's root.
    ``num_cpus`` only places them; ``actor_options`` default to spreading over nodes.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        workers: int,
        dispatch: DispatchOptions | None = None,
        num_cpus: float = 1.0,
        name_prefix: str = "ray-worker",
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a RayWorkerPool needs workers >= 1, got {workers!r}")
        self.config = config
        self.size = workers
        self.dispatch_options = dispatch or DispatchOptions()
        self.num_cpus = num_cpus
        self.name_prefix = name_prefix
        self.actor_options = {"scheduling_strategy": "SPREAD", **(actor_options or {})}
        self.actors: list[Any] = []
        self.handles: list[RayWorker] = []
        #: The actors' process ids (as each reported it when ready).
        self.pids: list[int] = []
        self._serving: list[Any] = []
        self._dispatcher: GroupDispatcher | None = None

    async def __aenter__(self) -> Self:
        """Start the actors and wait until every one serves.

        Raises:
            AsyncBackendError: Not on asyncio.
            WorkerError: An actor did not open within :data:`READY_TIMEOUT_SECONDS`.

        **Cancellation**: the actors started are killed.
        """
        require_asyncio("the Ray worker pool", "ray", remedy="use the HTTP worker service")
        ray = _ray()
        cls = actor_class()
        try:
            for i in range(self.size):
                actor, serving, handle = self._new_actor(cls, i)
                self.actors.append(actor)
                self._serving.append(serving)
                self.handles.append(handle)
            with anyio.fail_after(READY_TIMEOUT_SECONDS):
                for i in range(self.size):
                    self.pids.append(await self._ready(cls, i))
        except BaseException:
            for actor in self.actors:
                ray.kill(actor)
            raise
        self._dispatcher = GroupDispatcher(self.handles, self.dispatch_options)
        return self

    async def _ready(self, cls: Any, i: int) -> int:
        """Wait until actor ``i`` serves, starting it again if its process died; its pid."""
        from ray import exceptions

        for attempt in range(1, START_ATTEMPTS):
            try:
                _, pid = await self.actors[i].ready.remote()
                return int(pid)
            except exceptions.RayActorError as exc:
                if exc.actor_init_failed:
                    raise
                logger.warning(
                    "actor %s died while starting (attempt %d of %d); starting it again: %s",
                    self.handles[i].name,
                    attempt,
                    START_ATTEMPTS,
                    str(exc).splitlines()[0],
                )
                _ray().kill(self.actors[i])  # dead already; nothing of it may restart
                self.actors[i], self._serving[i], self.handles[i] = self._new_actor(cls, i)
        _, pid = await self.actors[i].ready.remote()  # the last start: its error is raised
        return int(pid)

    def _new_actor(self, cls: Any, i: int) -> tuple[Any, Any, RayWorker]:
        """Actor ``i``, its serving call and its handle."""
        name = f"{self.name_prefix}-{i}"
        config = replace(self.config, options=replace(self.config.options, name=name))
        actor = cls.options(num_cpus=self.num_cpus, **self.actor_options).remote(config)
        return actor, actor.serve.remote(), RayWorker(actor, name)

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def dispatcher(self) -> GroupDispatcher:
        """The dispatcher (inside the block)."""
        if self._dispatcher is None:
            raise RuntimeError("use the RayWorkerPool inside `async with`")
        return self._dispatcher

    async def run_group(self, request: GroupRequest) -> GroupResult:
        """See :meth:`GroupDispatcher.run_group`.

        **Cancellation**: the group is cancelled on its actor.
        """
        return await self.dispatcher.run_group(request)

    async def run_groups(
        self,
        requests: Sequence[GroupRequest],
        *,
        on_result: Callable[[GroupResult], object] | None = None,
    ) -> list[GroupResult]:
        """See :meth:`GroupDispatcher.run_groups`.

        **Cancellation**: every running group is cancelled on its actor.
        """
        return await self.dispatcher.run_groups(requests, on_result=on_result)

    def statistics(self) -> DispatchStatistics:
        """The dispatcher's view of the actors."""
        return self.dispatcher.statistics()

    async def worker_statistics(self) -> list[dict[str, Any] | None]:
        """Each live actor's worker statistics (``None`` for a dead one).

        **Cancellation**: nothing is held.
        """
        from ray import exceptions

        out: list[dict[str, Any] | None] = []
        for actor in self.actors:
            try:
                with anyio.fail_after(30):
                    out.append(await actor.statistics.remote())
            except (exceptions.RayActorError, TimeoutError):
                out.append(None)
        return out

    async def sweep(self) -> SweepReport:
        """Ask every live actor to reap dead workers' sandboxes on its node.

        **Cancellation**: nothing is held.
        """
        from ray import exceptions

        total = SweepReport()
        for actor in self.actors:
            try:
                with anyio.fail_after(60):
                    roots, sandboxes, processes = await actor.sweep.remote()
            except (exceptions.RayActorError, TimeoutError):
                continue
            total += SweepReport(roots, sandboxes, processes)
        return total

    async def aclose(self) -> None:
        """Close every actor's worker (groups answered, sandboxes released), then the actors.

        **Cancellation**: shielded and bounded by :data:`CLOSE_TIMEOUT_SECONDS`; actors still
        up then are killed.
        """
        ray = _ray()
        with cleanup_scope("close the Ray workers", CLOSE_TIMEOUT_SECONDS, log=logger):
            for actor in self.actors:
                try:
                    actor.close.remote()
                except Exception:  # a dead actor
                    continue
            for ref in self._serving:
                try:
                    await ref
                except Exception as exc:  # a dead actor's serve call ends with its death
                    logger.debug("a worker actor's serve call ended with %r", exc)
        for actor in self.actors:
            ray.kill(actor)
        self.actors.clear()
        self._serving.clear()
