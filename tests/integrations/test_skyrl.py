"""The SkyRL generator against GeneratorInput / GeneratorOutput (tests/trainers: SkyRL's types)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hermes_async.agent import AgentOptions
from hermes_async.errors import ConfigError
from hermes_async.integrations._rollouts import with_sampling
from hermes_async.integrations.skyrl import HermesGenerator, sampling_from_skyrl
from hermes_async.testing import Fault
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import RecordingFactory

from .helpers import assert_flat_matches_wire, make_tasks, scripted, vllm_client

pytestmark = pytest.mark.anyio


@dataclass
class TrajectoryID:  # SkyRL's shape (skyrl/train/generators/base.py); the real one in tests/trainers
    instance_id: str
    repetition_id: int


def batch(ids: list[TrajectoryID], **sampling: object) -> dict[str, object]:
    return {
        "prompts": [[{"role": "user", "content": "task " + t.instance_id}] for t in ids],
        "env_classes": ["hermes"] * len(ids),
        "env_extras": [{}] * len(ids),
        "sampling_params": {"max_generate_length": 256, "temperature": 1.0, **sampling},
        "trajectory_ids": ids,
        "batch_metadata": None,
    }


async def run_batch(tmp_path: Path, ids: list[TrajectoryID], **kw: object) -> tuple[dict, list]:
    factory = RecordingFactory(tmp_path / "sb")
    async with (
        scripted(**kw) as (server, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        out = await HermesGenerator(make_tasks(manager), client).generate(batch(ids))
        assert manager.task_ids() == []
    assert factory.leftovers() == []
    return out, server.requests


async def test_a_batch_comes_back_aligned_with_the_wire_ids(tmp_path: Path) -> None:
    ids = [TrajectoryID("a", 0), TrajectoryID("b", 0), TrajectoryID("a", 1)]
    out, served = await run_batch(tmp_path, ids)
    assert out["trajectory_ids"] == ids and out["stop_reasons"] == ["stop"] * 3
    assert out["rewards"] == [1.0] * 3
    for i in range(3):
        runs = assert_flat_matches_wire(
            out["prompt_token_ids"][i],
            out["response_ids"][i],
            out["loss_masks"][i],
            out["rollout_logprobs"][i],
            served,
        )
        assert runs == 3
    assert out["rollout_metrics"] == {"hermes_async/completed": 3}


async def test_a_server_that_dies_mid_rollout_is_an_error_row_with_nothing_trained(
    tmp_path: Path,
) -> None:
    died = {n: Fault.disconnect(after_tokens=3) for n in range(2, 8)}
    out, _ = await run_batch(tmp_path, [TrajectoryID("a", 0)], faults=died)
    assert out["stop_reasons"] == ["error"] and out["rewards"] == [0.0]
    assert not any(out["loss_masks"][0])  # the retries' last attempt, no token of it trained


def test_sampling_params_that_cannot_be_honoured() -> None:
    assert sampling_from_skyrl({"max_generate_length": 9, "top_k": 0, "min_p": 0.1}) == {
        "max_tokens": 9,
        "top_k": -1,
        "extra": {"min_p": 0.1},
    }
    with pytest.raises(ConfigError, match="n=4"):
        sampling_from_skyrl({"n": 4})
    with pytest.raises(ConfigError, match="logit_bias"):
        sampling_from_skyrl({"logit_bias": {"1": 2}})


def test_a_lone_stop_value_is_refused_by_name() -> None:
    assert sampling_from_skyrl({"stop": "</s>", "stop_token_ids": [2]}) == {
        "stop": ("</s>",),
        "stop_token_ids": (2,),
    }
    for key in ("stop", "stop_token_ids"):
        with pytest.raises(ConfigError, match=f"{key} must be a tuple"):
            with_sampling(AgentOptions(), sampling_from_skyrl({key: 151645}))
