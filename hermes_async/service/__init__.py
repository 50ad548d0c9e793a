"""The rollout worker: past one process with the same code, over HTTP or as Ray actors.

A worker (:mod:`~hermes_async.service.worker`) answers every group it admits by its
deadline. It is served over HTTP (:mod:`~hermes_async.service.app`) or as a Ray actor
(:mod:`~hermes_async.service.ray`), driven by :mod:`~hermes_async.service.dispatch`.
Names load on first use. Design and numbers: ``docs/scale-out.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_async._lazy import lazy_getattr

if TYPE_CHECKING:
    from hermes_async.service.config import WorkerConfig, open_configured_worker
    from hermes_async.service.dispatch import (
        DispatchOptions,
        GroupDispatcher,
        HTTPWorker,
        WorkerHandle,
        WorkerLostError,
    )
    from hermes_async.service.environments import (
        Environment,
        FunctionEnvironment,
        open_environments,
    )
    from hermes_async.service.ray import RayWorkerPool, RolloutWorkerActor
    from hermes_async.service.serve import run_worker, serve_worker
    from hermes_async.service.wire import (
        WIRE_VERSION,
        GroupRequest,
        GroupResult,
        RolloutRecord,
    )
    from hermes_async.service.worker import (
        RolloutWorker,
        WorkerOptions,
        WorkerStatistics,
        open_worker,
    )

__all__ = (
    "WIRE_VERSION",
    "DispatchOptions",
    "Environment",
    "FunctionEnvironment",
    "GroupDispatcher",
    "GroupRequest",
    "GroupResult",
    "HTTPWorker",
    "RayWorkerPool",
    "RolloutRecord",
    "RolloutWorker",
    "RolloutWorkerActor",
    "WorkerConfig",
    "WorkerHandle",
    "WorkerLostError",
    "WorkerOptions",
    "WorkerStatistics",
    "open_configured_worker",
    "open_environments",
    "open_worker",
    "run_worker",
    "serve_worker",
)

_WHERE = {
    "WIRE_VERSION": "wire",
    "GroupRequest": "wire",
    "GroupResult": "wire",
    "RolloutRecord": "wire",
    "DispatchOptions": "dispatch",
    "GroupDispatcher": "dispatch",
    "HTTPWorker": "dispatch",
    "WorkerHandle": "dispatch",
    "WorkerLostError": "dispatch",
    "Environment": "environments",
    "FunctionEnvironment": "environments",
    "open_environments": "environments",
    "RayWorkerPool": "ray",
    "RolloutWorkerActor": "ray",
    "run_worker": "serve",
    "serve_worker": "serve",
    "WorkerConfig": "config",
    "open_configured_worker": "config",
    "RolloutWorker": "worker",
    "WorkerOptions": "worker",
    "WorkerStatistics": "worker",
    "open_worker": "worker",
}

__getattr__ = lazy_getattr(
    "hermes_async.service",
    {name: f"hermes_async.service.{module}" for name, module in _WHERE.items()},
    globals(),
)
