"""Group concurrent requests into batches: what arrives while a batch runs shares the next one.

The local backend's close costs the same for any number of sandboxes (a ``/proc`` sweep,
an ``rm`` fork). At most two batches exist and no task is spawned: a requester runs it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

__all__ = ("Batcher",)

T = TypeVar("T")


class _Batch(Generic[T]):
    __slots__ = ("done", "finished", "items")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.finished = False
        self.items: list[T] = []


class Batcher(Generic[T]):
    """Serve concurrent :meth:`submit` calls with as few runs of their work as possible.

    The work comes with each request, not the batcher: holding the owner's method would make
    a reference cycle per local sandbox factory.
    """

    __slots__ = ("_next", "_running", "runs")

    def __init__(self) -> None:
        self._running: _Batch[T] | None = None
        self._next: _Batch[T] | None = None
        #: Batches run so far (completed or abandoned).
        self.runs = 0

    async def submit(self, item: T, work: Callable[[list[T]], Awaitable[None]]) -> None:
        """Return once a batch that started after this call has served ``item``.

        Args:
            work: ``async (items) -> None`` serving a whole batch; it must not raise (a raise
                reaches only the runner). Every request to one batcher passes the same work.

        **Cancellation**: a cancelled runner hands over; a cancelled waiter stops waiting (its
        item may still be served).
        """
        while True:
            batch = self._next
            if batch is not None:
                batch.items.append(item)
                await batch.done.wait()
                if batch.finished:
                    return
                continue  # its runner was cancelled: ask again
            batch = self._next = _Batch()
            batch.items.append(item)
            try:
                # One scheduling round first: requests made in the same tick join this batch
                # even when the work itself never yields (a sweep of a small /proc).
                await anyio.lowlevel.checkpoint()
                while self._running is not None:
                    await self._running.done.wait()
                # From here on, new requests need the batch after this one.
                self._next = None
                self._running = batch
                self.runs += 1
                await work(batch.items)
                batch.finished = True
                return
            finally:
                if self._next is batch:
                    self._next = None
                if self._running is batch:
                    self._running = None
                batch.done.set()
