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
"""

from __future__ import annotations

import inspect
import weakref
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
    """Serve concurrent :meth:`submit` calls with as few runs of ``work(items)`` as possible.

    Args:
        work: ``async (items) -> None``: serves a whole batch; must not raise (see the module
            docstring). A bound method is held weakly: its object (the batcher's owner, which
            calls :meth:`submit`) must outlive the batcher. Held strongly, owner -> batcher ->
            method -> owner would be a reference cycle, and every owner (one per local
            sandbox factory, so one per standalone run) would wait for the cyclic collector
            instead of being freed when dropped.
    """

    def __init__(self, work: Callable[[list[T]], Awaitable[None]]) -> None:
        self._work: Callable[[], Callable[[list[T]], Awaitable[None]] | None] = (
            weakref.WeakMethod(work) if inspect.ismethod(work) else lambda: work
        )
        self._running: _Batch[T] | None = None
        self._next: _Batch[T] | None = None
        #: Batches run so far (completed or abandoned).
        self.runs = 0

    async def submit(self, item: T) -> None:
        """Return once a batch that started after this call has served ``item``.

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
                work = self._work()
                assert work is not None, "a Batcher outlived the owner of its work method"
                await work(batch.items)
                batch.finished = True
                return
            finally:
                if self._next is batch:
                    self._next = None
                if self._running is batch:
                    self._running = None
                batch.done.set()
