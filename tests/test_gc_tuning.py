"""GC tuning for many concurrent rollouts: applied, restored, validated, paced, used by the entry
points."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import anyio
import pytest

from hermes_async import gc_tuned_for_rollouts, paced_collections, tune_gc_for_rollouts
from hermes_async.gc_tuning import DEFAULT_YOUNG_THRESHOLD, pace_collections, restore_gc


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


class _Collections:
    """Counts the young-generation collections (generations 0 and 1) while installed."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] <= 1:
            self.count += 1

    def __enter__(self) -> _Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)


def _cycle() -> weakref.ref[object]:
    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.mark.anyio
async def test_paced_collections_reclaim_cycles_no_threshold_would_reach() -> None:
    # A threshold no run reaches: without the clock, the cycle would stay.
    gc.set_threshold(10**9, 10, 10)
    with _Collections() as collections:
        ref = _cycle()
        await anyio.sleep(0.05)
        assert ref() is not None and collections.count == 0
        async with paced_collections(interval=0.01):
            with anyio.fail_after(10):
                while ref() is not None:
                    await anyio.sleep(0.01)
        assert collections.count >= 1
        # The block's end stops the clock.
        after = collections.count
        await anyio.sleep(0.1)
        assert collections.count == after


@pytest.mark.anyio
async def test_paced_collections_skip_a_disabled_collector() -> None:
    gc.set_threshold(10**9, 10, 10)
    gc.disable()
    try:
        with _Collections() as collections:
            async with paced_collections(interval=0.01):
                await anyio.sleep(0.1)
            assert collections.count == 0
    finally:
        gc.enable()


@pytest.mark.anyio
async def test_pace_collections_runs_in_a_task_group_until_cancelled() -> None:
    gc.set_threshold(10**9, 10, 10)
    with _Collections() as collections:
        async with anyio.create_task_group() as tg:
            await tg.start(pace_collections, 0.01)
            with anyio.fail_after(10):
                while collections.count < 3:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert collections.count >= 3


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [0, -1.0, True, "0.2", float("nan")])
async def test_invalid_pace_is_rejected_before_the_block(bad: object) -> None:
    ran = False
    with pytest.raises(ValueError, match=rf"interval must be a positive number .*got {bad!r}"):
        async with paced_collections(interval=bad):  # type: ignore[arg-type]
            ran = True
    assert not ran
