"""The SkyRL generator through SkyRL's own types and checks (skyrl 0.4.0, Python 3.12).

The batch is SkyRL's ``GeneratorInput`` with its ``TrajectoryID`` / ``BatchMetadata``; the
answer must be a ``GeneratorOutput`` (its keys, exactly) that SkyRL's trainer-side
``validate_generator_output`` accepts, with every row the wire's ids and logprobs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes_async.errors import ConfigError
from hermes_async.testing import Fault
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import RecordingFactory

from ..integrations.helpers import (
    assert_flat_matches_wire,
    make_tasks,
    raising_reward,
    scripted,
    vllm_client,
)
from .conftest import require

# SkyRL imports Ray, which warns about its own module layout (not ours to fix).
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # SkyRL's generator runs on its Ray task's asyncio loop


def generator_input(base: Any, ids: list[Any], **sampling: Any) -> Any:
    return base.GeneratorInput(
        prompts=[[{"role": "user", "content": "task " + t.instance_id}] for t in ids],
        env_classes=["hermes"] * len(ids),
        env_extras=[{"data_source": "x"}] * len(ids),
        sampling_params={"max_generate_length": 256, "temperature": 1.0, **sampling},
        trajectory_ids=ids,
        batch_metadata=base.BatchMetadata(global_step=3, training_phase="train"),
    )


async def run(tmp_path: Path, batch: Any, **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    from hermes_async.integrations.skyrl import HermesGenerator

    reward = kw.pop("reward", None)
    factory = RecordingFactory(tmp_path / "sb")
    async with (
        scripted(**kw) as (server, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        tasks = make_tasks(manager) if reward is None else make_tasks(manager, reward=reward)
        out = await HermesGenerator(tasks, client, weight_version=lambda: 7).generate(batch)
        assert manager.task_ids() == []
    assert factory.leftovers() == []
    return out, server.requests


async def test_a_batch_is_a_generator_output_skyrl_validates(tmp_path: Path) -> None:
    base = require("skyrl.train.generators.base")
    trainer_utils = require("skyrl.train.utils.trainer_utils")
    from hermes_async.integrations.skyrl import HermesGenerator

    assert isinstance(HermesGenerator(lambda item: None, None), base.GeneratorInterface)
    ids = [base.TrajectoryID("a", 0), base.TrajectoryID("b", 0), base.TrajectoryID("a", 1)]
    out, served = await run(tmp_path, generator_input(base, ids))
    assert set(out) == set(base.GeneratorOutput.__annotations__)
    trainer_utils.validate_generator_output(len(ids), out)  # SkyRL's own check
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
        assert runs == 3  # three model turns around two tool calls
    # Repetitions of one instance share a prompt (one group).
    assert out["prompt_token_ids"][0] == out["prompt_token_ids"][2]


async def test_failures_are_rows_skyrl_accepts_and_bad_input_is_refused(tmp_path: Path) -> None:
    base = require("skyrl.train.generators.base")
    trainer_utils = require("skyrl.train.utils.trainer_utils")
    ids = [base.TrajectoryID("a", 0), base.TrajectoryID("a", 1)]
    died = {n: Fault.disconnect(after_tokens=3) for n in range(2, 20)}
    dead, _ = await run(tmp_path, generator_input(base, ids), faults=died)
    broken, _ = await run(tmp_path, generator_input(base, ids), reward=raising_reward)
    for out in (dead, broken):
        trainer_utils.validate_generator_output(len(ids), out)
        assert out["stop_reasons"] == ["error"] * 2 and out["rewards"] == [0.0] * 2
        assert not any(any(mask) for mask in out["loss_masks"])
    from hermes_async.integrations.skyrl import HermesGenerator

    factory = RecordingFactory(tmp_path / "sb2")
    async with (
        scripted() as (server, url, transport),
        vllm_client(transport, url) as client,
        SandboxManager(factory) as manager,
    ):
        refused = HermesGenerator(make_tasks(manager), client)
        with pytest.raises(ConfigError, match="logit_bias"):
            await refused.generate(generator_input(base, ids, logit_bias={"1": 2}))
        untokenized = HermesGenerator(make_tasks(manager, tokenizer=None), client)
        with pytest.raises(ConfigError, match="no tokenizer"):
            await untokenized.generate(generator_input(base, ids))
    assert server.requests == [] and factory.created == []  # refused before any work
