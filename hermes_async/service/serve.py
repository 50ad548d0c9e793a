"""Serving a worker over HTTP, and the worker process's life: start, drain, stop.

:func:`serve_worker` serves one :class:`RolloutWorker`'s app until told to stop.
:func:`run_worker` is ``hermes-async worker``: it opens the configured worker, serves it,
and on SIGTERM or SIGINT drains it (new groups get 503, running ones get
``drain_timeout`` to finish, then are answered ``failed``) before it exits.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from functools import partial

import anyio
from anyio.abc import TaskStatus

from hermes_async._asgi import bind_socket, serve_asgi
from hermes_async._groups import single_errors
from hermes_async.service.app import worker_app
from hermes_async.service.config import WorkerConfig, open_configured_worker
from hermes_async.service.worker import RolloutWorker

__all__ = ("SHUTDOWN_GRACE_SECONDS", "run_worker", "serve_worker")

logger = logging.getLogger(__name__)

#: After the drain, how long answers still being written may take before the server closes.
SHUTDOWN_GRACE_SECONDS = 5.0


async def serve_worker(
    worker: RolloutWorker,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    stop: anyio.Event | None = None,
    on_drain: Callable[[], object] | None = None,
    task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``worker`` on ``host:port`` until ``stop`` is set.

    ``url = await tg.start(serve_worker, worker)`` gets the base URL (``port`` 0: any free port).

    **Cancellation**: the server closes at once; groups still running are cancelled by
    their disconnected clients.
    """
    sock = bind_socket(host, port)
    try:
        bound = sock.getsockname()[1]
        stop = stop or anyio.Event()
        task_status.started(f"http://{host}:{bound}")
        logger.info("worker %s serving on http://%s:%d", worker.name, host, bound)
        await serve_asgi(
            worker_app(worker, on_drain=on_drain),
            sock,
            shutdown=stop.wait,
            grace_seconds=SHUTDOWN_GRACE_SECONDS,
            log=logger,
        )
    finally:
        sock.close()


async def run_worker(
    config: WorkerConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> int:
    """Run a worker process until SIGTERM / SIGINT: open, serve, drain, close.

    Returns:
        The number of groups the drain had to cancel.

    Raises:
        ConfigError: A bad environment, server or tokenizer.

    **Cancellation**: as :func:`serve_worker`; the worker's sandboxes are released.
    """
    with single_errors():
        return await _run(config, host, port, task_status)


async def _run(config: WorkerConfig, host: str, port: int, task_status: TaskStatus[str]) -> int:
    async with open_configured_worker(config) as worker:
        stop = anyio.Event()
        cancelled = 0
        async with anyio.create_task_group() as tg:

            async def on_signals() -> None:
                nonlocal cancelled
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        logger.info(
                            "worker %s: %s: draining (up to %g s)",
                            worker.name,
                            signal.Signals(signum).name,
                            config.options.drain_timeout,
                        )
                        break
                cancelled = await worker.drain()
                stop.set()

            tg.start_soon(on_signals)
            url = await tg.start(partial(serve_worker, worker, host=host, port=port, stop=stop))
            task_status.started(url)
            # Both tasks end on their own: the server once `stop` is set and its answers are
            # out (hypercorn's asyncio server must not be cancelled mid-shutdown).
        return cancelled
