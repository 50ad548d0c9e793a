"""The rollout worker: past one process with the same code, over HTTP or as Ray actors.

A worker is one process and one event loop with its own sandboxes, limiters and model-server
pool (:mod:`~hermes_async.service.worker`); it answers every group it admits by the group's
deadline, with the group or a classified failure. Shells over it: the HTTP service
(``hermes-async worker``: :mod:`~hermes_async.service.app`, :mod:`~hermes_async.service.serve`)
and the Ray actor (:mod:`~hermes_async.service.ray`, the ``ray`` extra). The driver's side,
whatever the transport: :mod:`~hermes_async.service.dispatch`. The wire model:
:mod:`~hermes_async.service.wire`. Design and numbers: ``docs/scale-out.md``.

Names load on first use; only :mod:`~hermes_async.service.ray` imports Ray.
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
