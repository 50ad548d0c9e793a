"""Fit CPython's cyclic garbage collector to thousands of concurrent rollouts.

Why this exists (measured with ``bench/concurrency.py``, CPython 3.11, 2,000 concurrent
rollouts): a parked rollout holds ~220 GC-tracked objects (coroutine frames, task-group and
cancel-scope state, its messages), so the live heap reaches ~0.5 M tracked objects. With the
default thresholds ``(700, 10, 10)`` the collector ran ~650 times in a 27 s run; each full
collection walks the whole live heap and stopped the event loop for 30-250 ms, the largest
single cause of event-loop lag. Yet the rollouts create almost no cyclic garbage: about one
unreachable object per rollout (measured with ``gc.DEBUG_SAVEALL``); everything else is freed
by reference counting the moment it is dropped. So nearly all of that collector work is pure
overhead.

:func:`tune_gc_for_rollouts` therefore

* collects once and **freezes** what exists at start-up (modules, tokenizer tables, compiled
  templates) into the permanent generation, which later collections skip (``gc.freeze``);
* raises the **young-generation threshold** (default 50,000 net allocations instead of 700):
  a collection still runs regularly, so the little cyclic garbage there is still reclaimed, but
  ~70x less often.

**Collections on a clock** (:func:`pace_collections`, :func:`paced_collections`). CPython's
young-generation counter is *net*: it counts tracked allocations minus deallocations of any
generation. While rollouts finish (their old state freed) as fast as new ones allocate, the
counter stays under any threshold and the young generation itself grows without bound; at
10,000 concurrent rollouts it reached 185,000-373,000 objects, and the collection that finally
ran stopped the loop for 250-580 ms (``bench/concurrency.py --sizes 10000``: 49 young
collections, 2.1 s of CPU, that freed 10 objects between them). A collection every 0.2 s keeps
each one to the objects of 0.2 s: the same command with and without it (one run each, a busy
machine) gave the longest collection 1,521 -> 368 ms, the longest loop stall 9.6 -> 2.7 s (the
start of 10,000 rollouts at once), 64.6 -> 70.1 rollouts/s, loop-lag p99 64 ms either way,
client CPU per rollout 5.2 -> 5.3 ms. :func:`pace_collections` collects the two young
generations (``gc.collect(1)``) on that clock; full collections stay CPython's own.

The settings are process-wide, so the library never applies them on import. What applies them
(and runs the paced collections for the run): ``hermes-async demo`` and
:class:`~hermes_async.envs.HermesAgentBaseEnv` (unless ``HermesAgentEnvConfig.tune_gc`` is
false); embedding code that runs hundreds of rollouts at once should call
:func:`tune_gc_for_rollouts` once after start-up (or use :func:`gc_tuned_for_rollouts` around
the batch) and run the batch inside ``async with paced_collections():``.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import NoReturn

import anyio
from anyio.abc import TaskStatus

__all__ = (
    "DEFAULT_PACE_SECONDS",
    "DEFAULT_YOUNG_THRESHOLD",
    "GCState",
    "gc_tuned_for_rollouts",
    "pace_collections",
    "paced_collections",
    "restore_gc",
    "tune_gc_for_rollouts",
)

#: Net allocations of tracked objects between young-generation collections.
DEFAULT_YOUNG_THRESHOLD = 50_000

#: Seconds between the collections :func:`pace_collections` runs.
DEFAULT_PACE_SECONDS = 0.2


@dataclass(frozen=True, slots=True)
class GCState:
    """The collector settings before :func:`tune_gc_for_rollouts` changed them.

    Attributes:
        thresholds: ``gc.get_threshold()`` before.
        froze: Whether this call froze a heap nothing had frozen before, so that
            :func:`restore_gc` unfreezes it. ``gc.unfreeze`` releases every frozen object at
            once, so after an earlier freeze (the caller's own, or an outer tuning) restoring
            leaves the permanent generation alone rather than undo that freeze too.
    """

    thresholds: tuple[int, int, int]
    froze: bool


def tune_gc_for_rollouts(
    *, young_threshold: int = DEFAULT_YOUNG_THRESHOLD, freeze: bool = True
) -> GCState:
    """Apply the rollout-friendly collector settings (see the module docstring).

    Args:
        young_threshold: New first-generation threshold (``gc.set_threshold``'s first value);
            the other two are kept.
        freeze: Collect once, then move every object alive now to the permanent generation.

    Returns:
        The previous settings, for :func:`restore_gc`.

    Raises:
        ValueError: ``young_threshold`` is not a positive integer.
    """
    if isinstance(young_threshold, bool) or not isinstance(young_threshold, int):
        raise ValueError(f"young_threshold must be an integer, got {young_threshold!r}")
    if young_threshold < 1:
        raise ValueError(f"young_threshold must be >= 1, got {young_threshold!r}")
    before = gc.get_threshold()
    first_freeze = freeze and gc.get_freeze_count() == 0
    if freeze:
        gc.collect()
        gc.freeze()
    gc.set_threshold(young_threshold, before[1], before[2])
    return GCState(thresholds=before, froze=first_freeze)


def restore_gc(state: GCState) -> None:
    """Undo :func:`tune_gc_for_rollouts`: previous thresholds, and unfreeze if it froze."""
    gc.set_threshold(*state.thresholds)
    if state.froze:
        gc.unfreeze()


@contextmanager
def gc_tuned_for_rollouts(
    *, young_threshold: int = DEFAULT_YOUNG_THRESHOLD, freeze: bool = True
) -> Iterator[GCState]:
    """Apply :func:`tune_gc_for_rollouts` for the ``with`` block, then restore.

    Yields:
        The previous settings.
    """
    state = tune_gc_for_rollouts(young_threshold=young_threshold, freeze=freeze)
    try:
        yield state
    finally:
        restore_gc(state)


async def pace_collections(
    interval: float = DEFAULT_PACE_SECONDS,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Collect the two young generations every ``interval`` seconds, until cancelled.

    For a task group (``await tg.start(pace_collections)``); :func:`paced_collections` is the
    same as a block. Nothing is collected while the collector is disabled (``gc.disable()``).
    Each collection is synchronous, on the event loop's thread: that is the point, it bounds
    the pauses by collecting often (see the module docstring).

    Args:
        interval: Seconds between collections (> 0).

    Raises:
        ValueError: ``interval`` is not a positive number.

    **Cancellation**: between collections (a collection itself is never interrupted).
    """
    _check_interval(interval)
    task_status.started()
    while True:
        await anyio.sleep(interval)
        if gc.isenabled():
            gc.collect(1)


@asynccontextmanager
async def paced_collections(interval: float = DEFAULT_PACE_SECONDS) -> AsyncIterator[None]:
    """Run :func:`pace_collections` for the ``async with`` block (asyncio or trio).

    Args:
        interval: Seconds between collections (> 0).

    Raises:
        ValueError: ``interval`` is not a positive number (before the block runs).
    """
    _check_interval(interval)
    async with anyio.create_task_group() as tg:
        await tg.start(pace_collections, interval)
        try:
            yield
        finally:
            tg.cancel_scope.cancel("the paced block ended")


def _check_interval(interval: object) -> None:
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
