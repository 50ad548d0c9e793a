"""Fit CPython's cyclic garbage collector to thousands of concurrent rollouts.

:func:`tune_gc_for_rollouts` freezes the start-up heap and raises the young threshold.
Process-wide, so never applied on import. Measurements and the rejected alternative:
docs/decisions/005-gc-tuning.md.
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

#: Net allocations of tracked objects between young-generation collections. A middle
#: collection walks up to ten young generations, so this also bounds the longest pause while
#: thousands of rollouts start (40,000: 83-88 ms at 20,000 and 30,000; 50,000: 120-145 ms).
DEFAULT_YOUNG_THRESHOLD = 40_000


@dataclass(frozen=True, slots=True)
class GCState:
    """The collector settings before :func:`tune_gc_for_rollouts` changed them.

    Attributes:
        froze: This call froze a heap nothing had frozen, so :func:`restore_gc` unfreezes it.
    """

    thresholds: tuple[int, int, int]
    froze: bool


def tune_gc_for_rollouts(
    *, young_threshold: int = DEFAULT_YOUNG_THRESHOLD, freeze: bool = True
) -> GCState:
    """Apply the rollout-friendly collector settings; return the previous ones for :func:`restore_gc`.

    ``young_threshold`` replaces the first threshold only. ``freeze`` collects once, then
    moves every live object to the permanent generation.

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
    # gc.unfreeze releases every frozen object, so undo only a freeze this tuning made.
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
