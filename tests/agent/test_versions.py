"""Policy versions, staleness (drop / mask / keep) and their Atropos keys (#20)."""

from __future__ import annotations

from typing import Any

import pytest

from hermes_async.agent import (
    AgentOptions,
    RolloutSetup,
    ScoredGroup,
    Staleness,
    VersionReadError,
    run_group,
)
from hermes_async.agent.versions import read_version, staleness_of
from hermes_async.inference.generate import SamplingParams
from hermes_async.inference.trajectory import MASK_ID
from hermes_async.testing.scripted_server import Fault
from tests.agent.test_loop_phase2 import TOKENIZER, Recorder, call_text, registry
from tests.agent.test_partial_rollouts import serve

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "Record, then stop."}]
TEXTS = [call_text("record", {"tag": "x"}), "Done."]


async def test_read_version_takes_sync_and_async_sources_and_rejects_bad_values() -> None:
    async def five() -> int:
        return 5

    assert await read_version(lambda: 3) == 3
    assert await read_version(five) == 5
    for bad in (True, -1, "7", None):
        with pytest.raises(VersionReadError, match="must return an int >= 0"):
            await read_version(lambda bad=bad: bad)

    def broken() -> int:
        raise RuntimeError("trainer gone")

    with pytest.raises(VersionReadError, match="trainer gone"):
        await read_version(broken)


def test_staleness_of_counts_ages_and_picks_the_stale_segments() -> None:
    spans = [[(10, 20, 4), (20, 25, 6)], [(10, 30, 6)], [(10, 12, None)]]
    report, to_mask = staleness_of(spans, 6, Staleness(1, "mask"))
    assert report.segment_ages == {2: 1, 0: 2}
    assert report.token_ages == {2: 10, 0: 25}
    assert (report.stale_segments, report.stale_tokens, report.stale_rollouts) == (1, 10, (0,))
    assert to_mask == [[(10, 20)], [], []]
    assert report.masked_tokens == 10 and not report.dropped
    assert report.unversioned_segments == 1
    assert report.metrics()["staleness/tokens_age_2"] == 10.0
    dropped, none = staleness_of(spans, 6, Staleness(1, "drop"))
    assert dropped.dropped and none == [[], [], []]
    kept, _ = staleness_of(spans, 6, Staleness(2, "keep"))
    assert not kept.stale and not kept.dropped


async def group(
    client: Any, *, version: dict[str, int], now: int, policy: Staleness | None, size: int = 3
) -> ScoredGroup:
    reg = registry(Recorder())
    defs = reg.definitions(["terminal"])
    options = AgentOptions(
        sampling=SamplingParams(max_tokens=100, seed=1), version_source=lambda: version["v"]
    )
    staleness = None
    if policy is not None:
        staleness = Staleness(policy.max_staleness, policy.action, version_source=lambda: now)
    return await run_group(
        client,
        USER,
        (defs.schemas, defs.valid_names),
        size=size,
        options=options,
        staleness=staleness,
        setup=RolloutSetup(tokenizer=TOKENIZER, registry=reg),
    )


async def test_max_staleness_one_drops_exactly_the_too_old_groups() -> None:
    version = {"v": 0}
    outcomes = []
    async with serve([*TEXTS] * 50) as (_, client):
        for v, now in [(0, 1), (0, 2), (3, 3), (1, 3), (2, 3)]:
            version["v"] = v
            scored = await group(client, version=version, now=now, policy=Staleness(1, "drop"))
            assert scored.staleness is not None
            assert scored.staleness.current_version == now
            outcomes.append(scored.outcome)
            for r in scored.rollouts:
                assert r.policy_versions == [v]
    assert outcomes == ["ok", "stale", "ok", "stale", "ok"]


async def test_mask_zeroes_only_the_stale_segment_of_a_resumed_turn() -> None:
    def plan(number: int, body: dict[str, Any]) -> Fault | None:
        return Fault.abort(3) if number == 1 else None

    async with serve([*TEXTS] * 10, fault_plan=plan) as (_, client):
        reads = {"n": 0}

        def source() -> int:
            # Request 1 is read at version 0; the trainer bumps to 2 before the resume.
            reads["n"] += 1
            return 0 if reads["n"] == 1 else 2

        reg = registry(Recorder())
        defs = reg.definitions(["terminal"])
        scored = await run_group(
            client,
            USER,
            (defs.schemas, defs.valid_names),
            size=1,
            options=AgentOptions(
                sampling=SamplingParams(max_tokens=100, seed=1), version_source=source
            ),
            staleness=Staleness(1, "mask", version_source=lambda: 2),
            setup=RolloutSetup(tokenizer=TOKENIZER, registry=reg),
        )
    (rollout,) = scored.rollouts
    spans = rollout.version_spans
    assert [v for _, _, v in spans] == [0, 2, 2]
    (start, end, _), *_ = spans
    assert end - start == 3
    assert rollout.masks[start:end] == [MASK_ID] * 3
    assert rollout.logprobs[start:end] == [1.0] * 3
    assert rollout.stale_masked_tokens == 3
    trained_after = [m for m in rollout.masks[end:] if m != MASK_ID]
    assert trained_after  # the fresh segments are still trained
    assert scored.outcome == "ok" and scored.staleness is not None
    assert scored.staleness.masked_tokens == 3
    data = scored.to_scored_data_group()
    (override,) = data["overrides"]
    assert override["policy_versions"][0] == [start, end, 0]
    assert override["policy_version_min"] == 0 and override["policy_version_max"] == 2
    assert override["stale_masked_tokens"] == 3
    assert data["group_overrides"] == {
        "policy_version_min": 0,
        "policy_version_max": 2,
        "policy_version_current": 2,
        "max_staleness": 1,
    }


async def test_staleness_needs_a_version_source() -> None:
    async with serve(TEXTS) as (_, client):
        reg = registry(Recorder())
        defs = reg.definitions(["terminal"])
        with pytest.raises(ValueError, match="needs a policy version source"):
            await run_group(
                client,
                USER,
                (defs.schemas, defs.valid_names),
                size=1,
                staleness=Staleness(1),
                setup=RolloutSetup(tokenizer=TOKENIZER, registry=reg),
            )


async def test_a_stale_group_refuses_to_become_training_data() -> None:
    version = {"v": 0}
    async with serve([*TEXTS] * 5) as (_, client):
        scored = await group(client, version=version, now=5, policy=Staleness(1, "drop"), size=1)
    assert scored.masked and scored.outcome == "stale"
    assert scored.staleness is not None and scored.staleness.dropped
    with pytest.raises(ValueError, match="a stale group has no training data"):
        scored.to_scored_data_group()


def test_env_config_builds_the_staleness_policy_and_the_tally_logs_its_counters() -> None:
    pytest.importorskip("atroposlib")
    from hermes_async.agent import ScoredGroup as Group
    from hermes_async.agent.versions import StalenessReport
    from hermes_async.envs.config import HermesAgentEnvConfig
    from hermes_async.envs.results import FailureTally
    from hermes_async.errors import ConfigError

    config = HermesAgentEnvConfig(max_staleness=1, staleness_policy="mask")
    with pytest.raises(ConfigError, match="needs the trainer's policy version"):
        config.build_staleness(None)
    built = config.build_staleness(lambda: 3)
    assert built is not None and (built.max_staleness, built.action) == (1, "mask")
    assert HermesAgentEnvConfig().build_staleness(lambda: 3) is None
    assert config.build_agent_options().max_resumes == 8

    tally = FailureTally()
    report = StalenessReport(3, 1, "drop", {0: 2, 2: 1}, {0: 40, 2: 9}, 1, 9, (0,), True)
    tally.add_group(Group((), "stale", (), report))
    metrics = tally.metrics()
    assert metrics["train/groups_stale"] == 1.0
    assert metrics["train/staleness/tokens_age_2"] == 9.0
    assert metrics["train/staleness/dropped_groups"] == 1.0
    assert "train/staleness/tokens_age_2" not in tally.metrics()  # the window starts over


async def test_polled_version_reads_an_http_endpoint_at_most_once_per_interval() -> None:
    import httpx

    from hermes_async.agent import PolledVersion

    answers = iter([{"version": 4}, {"version": 5}, {"weights": "x"}])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=next(answers))

    transport = httpx.MockTransport(handler)
    async with PolledVersion("http://trainer/version", interval=3600, transport=transport) as v:
        assert [await read_version(v) for _ in range(3)] == [4, 4, 4]
        assert v.polls == 1
        v.interval = 0.0
        assert await read_version(v) == 5
        with pytest.raises(VersionReadError, match="expected an int >= 0"):
            await read_version(v)
