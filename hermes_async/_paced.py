"""Start a batch of tasks a few per pass of the event loop.

20,000 ``start_soon`` calls in one pass stall the loop ~200 ms before any task runs
(``bench/concurrency.py --spawn-floor``). The library's batch starters use :func:`start_paced`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

import anyio.abc
from anyio.lowlevel import checkpoint

__all__ = ("STARTS_PER_PASS", "start_paced")

T = TypeVar("T")

#: Tasks started, and rollouts (or groups) admitted by the start ramp, per pass of the loop.
STARTS_PER_PASS = 32


async def start_paced(
    tg: anyio.abc.TaskGroup,
    func: Callable[[T], Coroutine[Any, Any, object]],
    items: Iterable[T],
    *,
    name: Callable[[T], str] | None = None,
) -> None:
    """``tg.start_soon(func, item)`` for each item, yielding to the loop after every
    :data:`STARTS_PER_PASS` starts (the rate the start gate admits, so no queue of started
    rollouts builds up behind it)."""
    for i, item in enumerate(items):
        if i and i % STARTS_PER_PASS == 0:
            await checkpoint()
        tg.start_soon(func, item, name=None if name is None else name(item))
