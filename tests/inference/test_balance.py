"""The server pool's decisions, without I/O: ring, bounded-load placement, AIMD, ejection, route."""

from __future__ import annotations

import math
import random

import pytest

from hermes_async.inference._balance import (
    AdaptiveLimit,
    HashRing,
    Health,
    MemberState,
    choose_member,
    route,
)

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]


def members(n: int = 4, limit: int = 64) -> list[MemberState]:
    return [
        MemberState(
            URLS[i] if i < len(URLS) else f"http://x{i}", AdaptiveLimit(1, 64, limit), Health()
        )
        for i in range(n)
    ]


def test_ring_order_names_every_server_once_and_is_deterministic() -> None:
    ring = HashRing(URLS)
    for key in ("a", "task-17", "g"):
        order = ring.order(key)
        assert sorted(order) == [0, 1, 2, 3]
        assert HashRing(URLS).order(key) == order


def test_ring_shares_keys_evenly() -> None:
    ring = HashRing(URLS)
    counts = [0] * 4
    for k in range(20_000):
        counts[ring.order(f"task-{k}")[0]] += 1
    assert all(0.18 < c / 20_000 < 0.32 for c in counts), counts


def test_adding_a_server_moves_few_keys_and_only_to_it() -> None:
    before = HashRing(URLS)
    after = HashRing([*URLS, "http://10.0.0.9:8000"])
    keys = [f"task-{k}" for k in range(20_000)]
    moved = [k for k in keys if before.order(k)[0] != after.order(k)[0]]
    assert 0.10 < len(moved) / len(keys) < 0.30  # ~1/5
    assert all(after.order(k)[0] == 4 for k in moved)


def test_ring_rejects_duplicates_and_empty() -> None:
    with pytest.raises(ValueError, match="duplicate server"):
        HashRing([URLS[0], URLS[0]])
    with pytest.raises(ValueError, match="at least one server"):
        HashRing([])


def test_bounded_load_placement_never_exceeds_the_bound() -> None:
    ring = HashRing(URLS)
    loads = [0, 0, 0, 0]
    rng = random.Random(3)
    for k in range(2_000):
        # Every key hashes near server 0's points half the time: a skewed key population.
        key = "hot" if rng.random() < 0.5 else f"task-{k}"
        chosen = choose_member(ring.order(key), loads, [1.0] * 4, [True] * 4, 1.25)
        assert chosen is not None
        loads[chosen] += 1
        total = sum(loads)
        assert max(loads) <= math.ceil(1.25 * total / 4)
    assert min(loads) > 300


def test_placement_keeps_a_key_on_its_server_while_within_the_bound() -> None:
    ring = HashRing(URLS)
    first = ring.order("group-1")[0]
    loads = [10, 10, 10, 10]
    assert choose_member(ring.order("group-1"), loads, [1.0] * 4, [True] * 4, 1.25) == first
    loads[first] = 20  # over 1.25 x fair share: spills to the next on the ring
    assert (
        choose_member(ring.order("group-1"), loads, [1.0] * 4, [True] * 4, 1.25)
        == (ring.order("group-1")[1])
    )


def test_placement_weights_shares_by_limit_and_skips_ineligible() -> None:
    order = [0, 1]
    # Server 0 has a quarter of the capacity: with 40 live sessions it is full at ~13.
    assert choose_member(order, [13, 27], [16.0, 48.0], [True, True], 1.25) == 1
    assert choose_member(order, [0, 0], [1.0, 1.0], [False, True], 1.25) == 1
    assert choose_member(order, [0, 0], [1.0, 1.0], [False, False], 1.25) is None


def test_aimd_adds_one_per_window_and_halves_once_per_hold() -> None:
    limit = AdaptiveLimit(1, 64, 8.0, 0.5, 1.0)
    successes = 0
    while limit.current < 9:
        limit.increase(0.0)
        successes += 1
    assert 8 <= successes <= 9  # +1/limit per success: about one window of 8
    assert limit.decrease(10.0)
    assert limit.current == 4
    assert not limit.decrease(10.5)  # the same burst of 429s: one decrease
    assert limit.current == 4
    assert not limit.increase(10.5)  # no increase during the hold either
    assert limit.decrease(11.0)
    assert limit.current == 2


def test_aimd_honours_a_long_retry_after_and_its_bounds() -> None:
    limit = AdaptiveLimit(2, 10, 10.0, 0.5, 1.0)
    limit.decrease(0.0, hold=5.0)
    assert not limit.decrease(4.9)
    for t in range(6, 12):
        limit.decrease(float(t))
    assert limit.current == 2  # floor
    for _ in range(1_000):
        limit.increase(100.0)
    assert limit.current == 10  # ceiling


def test_health_ejects_after_consecutive_failures_with_doubling_backoff() -> None:
    health = Health(eject_after=3, base_seconds=1.0, max_seconds=3.0)
    assert not health.record_failure(0.0, may_eject=True)
    health.record_success()  # not consecutive any more
    assert not health.record_failure(0.0, may_eject=True)
    assert not health.record_failure(0.0, may_eject=True)
    assert health.record_failure(0.0, may_eject=True)
    assert health.state == "ejected" and health.ejected_until == 1.0
    assert not health.probe_due(0.5) and health.probe_due(1.0)
    health.probe_result(False, 1.0)
    assert health.ejected_until == 3.0  # 2 s
    health.probe_result(False, 3.0)
    assert health.ejected_until == 6.0  # capped at 3 s
    health.probe_result(True, 6.0)
    assert health.state == "up"
    assert health.record_failure(6.5, may_eject=True)  # half-open: one failure ejects again


def test_health_never_ejects_when_told_not_to() -> None:
    health = Health(eject_after=1)
    assert not health.record_failure(0.0, may_eject=False)
    assert health.state == "up"


def test_route_keeps_the_home_bypasses_cooling_and_rehomes_after_ejection() -> None:
    ms = members()
    ring = HashRing([m.name for m in ms])
    first = route(ms, ring, now=0.0, key="task-1", home=None, load_factor=1.25)
    assert first.member is not None and first.rehome
    home = first.member
    ms[home].sessions += 1
    assert route(ms, ring, now=0.0, key="task-1", home=home, load_factor=1.25).member == home
    ms[home].cool_until = 5.0
    cooling = route(ms, ring, now=1.0, key="task-1", home=home, load_factor=1.25)
    assert cooling.member not in (None, home) and not cooling.rehome
    ms[home].cool_until = 0.0
    ms[home].health.eject(1.0)
    moved = route(ms, ring, now=1.0, key="task-1", home=home, load_factor=1.25)
    assert moved.member not in (None, home) and moved.rehome


def test_route_waits_when_everyone_cools_and_falls_back_from_avoid() -> None:
    ms = members(2)
    ring = HashRing([m.name for m in ms])
    ms[0].cool_until, ms[1].cool_until = 3.0, 2.0
    waiting = route(ms, ring, now=1.0, key="k", home=None, load_factor=1.25)
    assert waiting.member is None and waiting.wait_until == 2.0
    ms[0].cool_until = ms[1].cool_until = 0.0
    assert route(ms, ring, now=1.0, key="k", home=0, avoid={0}, load_factor=1.25).member == 1
    only = route(ms, ring, now=1.0, key="k", home=0, avoid={0, 1}, load_factor=1.25)
    assert only.member == 0  # nothing else: the request may go back to its home


def test_route_without_a_session_picks_the_least_loaded() -> None:
    ms = members(3)
    ring = HashRing([m.name for m in ms])
    got = route(ms, ring, now=0.0, key=None, home=None, load_factor=1.25, in_flight=[5, 1, 3])
    assert got.member == 1 and got.rehome
