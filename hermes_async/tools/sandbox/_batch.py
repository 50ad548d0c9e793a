"""Group concurrent requests into batches: what arrives while a batch runs shares the next one.

The local backend's close does two things that cost the same however many sandboxes they serve:
a ``/proc`` sweep, and starting an ``rm`` (a fork + exec on the event loop's thread, ~3 ms).
:class:`Batcher` turns N concurrent requests into a handful of runs: a request is served by the
first batch that *starts* after it; if none is running, the requester runs one after one scheduling round; if one
is running, the requester joins the next (the first to join runs it once the current one is
done). At most two batches exist at a time. No task is spawned: a requester does the work.

Cancellation: if the requester running a batch is cancelled, the batch is abandoned and the
requests waiting on it ask again (one of them runs a new batch). The work function must not
raise ordinary exceptions (report failures through the items): a raise would reach only the
runner.

The work comes with each request, not with the batcher: an owner holding a batcher that held
the owner's bound method would be a reference cycle (each owner, one per local sandbox factory
and so one per standalone run, would wait for the cyclic collector), and holding the method
weakly instead costs ~280 bytes per batcher in weak references, three batchers per factory.
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
    """Serve concurrent :meth:`submit` calls with as few runs of their work as possible."""

    __slots__ = ("_next", "_running", "runs")

    def __init__(self) -> None:
        self._running: _Batch[T] | None = None
        self._next: _Batch[T] | None = None
        #: Batches run so far (completed or abandoned).
        self.runs = 0

    async def submit(self, item: T, work: Callable[[list[T]], Awaitable[None]]) -> None:
        """Return once a batch that started after this call has served ``item``.

        Args:
            item: What to serve.
            work: ``async (items) -> None``: serves a whole batch; must not raise (see the
                module docstring). Every request to one batcher passes the same work (its
                owner's method); the request that runs a batch runs its own.

        **Cancellation**: a cancelled runner hands over (see the module docstring); a cancelled
        waiter just stops waiting (its item may still be served).
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
