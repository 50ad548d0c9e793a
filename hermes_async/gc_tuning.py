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

**What was tried and left out: collections on a clock.** CPython's young-generation counter is
*net* (tracked allocations minus deallocations of any generation), so while finished rollouts
are freed as fast as new ones allocate, the young generation grows past the threshold before a
collection runs (185,000-373,000 objects at 10,000 rollouts). A task collecting the young
generations every 0.2 s was measured side by side (``bench/concurrency.py``, quiet machine,
after the per-rollout reference cycles were removed): at 10,000 rollouts loop-lag p99 14.3 vs
12.2 ms and 77.7 vs 78.6 rollouts/s, but 2.4 vs 4.4 s of collector CPU; at 2,000 no gain and
three times the collector CPU. Not worth a task per process; the plain tuning stays.

The settings are process-wide, so the library never applies them on import. What applies them:
``hermes-async demo`` and :class:`~hermes_async.envs.HermesAgentBaseEnv` (unless
``HermesAgentEnvConfig.tune_gc`` is false); embedding code that runs hundreds of rollouts at once
should call it once after start-up (or use :func:`gc_tuned_for_rollouts` around the batch).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = (
    "DEFAULT_YOUNG_THRESHOLD",
    "GCState",
    "gc_tuned_for_rollouts",
    "restore_gc",
    "tune_gc_for_rollouts",
)

#: Net allocations of tracked objects between young-generation collections.
DEFAULT_YOUNG_THRESHOLD = 50_000


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
