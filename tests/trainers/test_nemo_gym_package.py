"""The NeMo Gym agent server's /run answers, validated by nemo-gym's own models."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_async.integrations.nemo_gym import GymAgent
from hermes_async.testing import Fault
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import RecordingFactory

from ..integrations.helpers import (
    assert_turns_match_wire,
    make_tasks,
    raising_reward,
    scripted,
    vllm_client,
)
from ..integrations.test_nemo_gym import BODY, nemo_rl_turns
from .conftest import require

pytestmark = pytest.mark.anyio


async def test_gym_validates_a_multi_turn_run_and_its_failures(tmp_path: Path) -> None:
    resources = require("nemo_gym.base_resources_server")
    openai_utils = require("nemo_gym.openai_utils")
    request = resources.BaseRunRequest.model_validate(BODY)
    body = request.model_dump(mode="json", exclude_unset=True)
    factory = RecordingFactory(tmp_path / "sb")
    died = {n: Fault.disconnect(after_tokens=3) for n in range(2, 6)}
    async with SandboxManager(factory) as manager:
        async with scripted() as (server, url, transport), vllm_client(transport, url) as client:
            result = await GymAgent(make_tasks(manager), client).run(body)
        async with (
            scripted(faults=died) as (_, url, transport),
            vllm_client(transport, url) as client,
        ):
            dead = await GymAgent(make_tasks(manager), client).run(body)
        async with scripted() as (_, url, transport), vllm_client(transport, url) as client:
            broken = await GymAgent(make_tasks(manager, reward=raising_reward), client).run(body)
        assert manager.task_ids() == []
    assert factory.leftovers() == []
    verified = resources.BaseVerifyResponse.model_validate(result)
    trained = [item for item in verified.response.output if hasattr(item, "generation_token_ids")]
    assert [type(item).__name__ for item in trained] == [
        "NeMoGymResponseFunctionToolCallForTraining",
        "NeMoGymResponseFunctionToolCallForTraining",
        "NeMoGymResponseOutputMessageForTraining",
    ]
    assert isinstance(verified.response, openai_utils.NeMoGymResponse) and verified.reward == 1.0
    dumped = verified.model_dump(mode="json")
    assert_turns_match_wire(nemo_rl_turns(dumped["response"]), server.requests)
    for failed, kind in ((dead, "agent_request_failed"), (broken, "verifier_error")):
        checked = resources.BaseVerifyResponse.model_validate(failed)
        assert checked.mask_sample and checked.failure_kind == kind and checked.reward == 0.0
