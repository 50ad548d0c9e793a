"""GC tuning for many concurrent rollouts: applied, restored, validated, used by the entry points."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from hermes_async import gc_tuned_for_rollouts, tune_gc_for_rollouts
from hermes_async.gc_tuning import DEFAULT_YOUNG_THRESHOLD, restore_gc


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_tuning_raises_the_young_threshold_freezes_and_restores() -> None:
    gc.set_threshold(700, 10, 10)
    survivor = [object() for _ in range(10)]  # tracked container alive at tuning time
    state = tune_gc_for_rollouts()
    assert gc.get_threshold() == (DEFAULT_YOUNG_THRESHOLD, 10, 10)
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
        assert gc.get_threshold() == (DEFAULT_YOUNG_THRESHOLD, 11, 12)
        assert gc.get_freeze_count() == 0
        raise RuntimeError("boom")
    assert gc.get_threshold() == (900, 11, 12)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "100"])
def test_invalid_threshold_is_rejected_with_the_value(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"young_threshold must be .*got {bad!r}"):
        tune_gc_for_rollouts(young_threshold=bad)  # type: ignore[arg-type]
    assert gc.get_freeze_count() == 0


def test_nested_tuning_keeps_the_outer_freeze() -> None:
    # An application tuned at start-up; an environment entry point tunes and restores inside.
    gc.set_threshold(700, 10, 10)
    outer = tune_gc_for_rollouts()
    frozen_by_outer = gc.get_freeze_count()
    with gc_tuned_for_rollouts(young_threshold=20_000):
        assert gc.get_threshold() == (20_000, 10, 10)
        assert gc.get_freeze_count() >= frozen_by_outer
    assert gc.get_threshold() == (DEFAULT_YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() >= frozen_by_outer > 0  # not unfrozen by the inner restore
    restore_gc(outer)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
