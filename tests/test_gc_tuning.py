"""GC tuning for many concurrent rollouts: applied, restored, validated, used by the entry points."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from hermes_async import gc_tuned_for_rollouts, tune_gc_for_rollouts
from hermes_async.gc_tuning import (
    DEFAULT_MIDDLE_THRESHOLD,
    DEFAULT_OLD_THRESHOLD,
    DEFAULT_YOUNG_THRESHOLD,
    restore_gc,
)

TUNED = (DEFAULT_YOUNG_THRESHOLD, DEFAULT_MIDDLE_THRESHOLD, DEFAULT_OLD_THRESHOLD)


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_tuning_sets_the_thresholds_freezes_and_restores() -> None:
    gc.set_threshold(700, 10, 10)
    survivor = [object() for _ in range(10)]  # tracked container alive at tuning time
    state = tune_gc_for_rollouts()
    assert gc.get_threshold() == TUNED
    assert gc.get_freeze_count() > 0
    # Frozen: in the permanent generation, which collections (and get_objects) skip.
    assert not any(o is survivor for o in gc.get_objects())
    restore_gc(state)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
    assert any(o is survivor for o in gc.get_objects())


def test_cyclic_garbage_is_still_collected_after_tuning() -> None:
    with gc_tuned_for_rollouts(young_threshold=1_000):
        import weakref

        class Node:
            other: object = None

        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
        # Enough tracked allocations to pass the young threshold: the cycle goes by itself.
        junk = [[i] for i in range(5_000)]
        del junk
        assert ref() is None


def test_context_manager_restores_on_error() -> None:
    gc.set_threshold(900, 11, 12)
    with pytest.raises(RuntimeError, match="boom"), gc_tuned_for_rollouts(freeze=False):
        assert gc.get_threshold() == TUNED
        assert gc.get_freeze_count() == 0
        raise RuntimeError("boom")
    assert gc.get_threshold() == (900, 11, 12)


@pytest.mark.parametrize("name", ["young_threshold", "middle_threshold", "old_threshold"])
@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "100"])
def test_invalid_threshold_is_rejected_with_the_value(name: str, bad: object) -> None:
    before = gc.get_threshold()
    with pytest.raises(ValueError, match=rf"{name} must be .*got {bad!r}"):
        tune_gc_for_rollouts(**{name: bad})  # type: ignore[arg-type]
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_a_burst_of_live_objects_runs_no_full_collection() -> None:
    # A start burst of 20,000 rollouts keeps ~4.4 M tracked objects alive (~90 young
    # generations): a full collection walks all of them at once (2.2 s of CPU measured).
    # Scaled down: young generations of 1,000 objects, 90% of the way to a full collection.
    young = 1_000
    burst = int(young * (DEFAULT_MIDDLE_THRESHOLD + 1) * (DEFAULT_OLD_THRESHOLD + 1) * 0.9)
    generations: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    with gc_tuned_for_rollouts(young_threshold=young):
        gc.callbacks.append(watch)
        try:
            alive = [[i] for i in range(burst)]
        finally:
            gc.callbacks.remove(watch)
    assert len(alive) == burst
    assert 2 not in generations
    assert generations.count(1) >= burst // (young * (DEFAULT_MIDDLE_THRESHOLD + 2)) - 1


def test_nested_tuning_keeps_the_outer_freeze() -> None:
    # An application tuned at start-up; an environment entry point tunes and restores inside.
    gc.set_threshold(700, 10, 10)
    outer = tune_gc_for_rollouts()
    frozen_by_outer = gc.get_freeze_count()
    with gc_tuned_for_rollouts(young_threshold=20_000):
        assert gc.get_threshold() == (20_000, *TUNED[1:])
        assert gc.get_freeze_count() >= frozen_by_outer
    assert gc.get_threshold() == TUNED
    assert gc.get_freeze_count() >= frozen_by_outer > 0  # not unfrozen by the inner restore
    restore_gc(outer)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
