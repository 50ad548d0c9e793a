"""The NeMo Gym agent server's /run answers, validated by nemo-gym's own models."""

from __future__ import annotations

import sys
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

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "trainers"


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


async def test_gyms_own_agent_class_serves_run_through_gyms_app() -> None:
    """HermesGymAgent as Gym's launcher builds it: its config, a ServerClient over Gym's
    global config naming the model server, Gym's setup_webserver (routes, middleware)."""
    require("nemo_gym.base_responses_api_agent")
    resources = require("nemo_gym.base_resources_server")
    server_utils = require("nemo_gym.server_utils")
    config_types = require("nemo_gym.config_types")
    import httpx
    from omegaconf import OmegaConf

    from hermes_async.integrations.nemo_gym import HermesGymAgent, HermesGymAgentConfig
    from hermes_async.testing import open_asgi_transport

    assert issubclass(
        HermesGymAgent, require("nemo_gym.base_responses_api_agent").SimpleResponsesAPIAgent
    )
    sys.path.insert(0, str(EXAMPLES))
    from hermes_tasks import scripted_model

    async with scripted_model() as (server, url):
        # Gym's model server entry: the agent calls the vLLM behind it (its base_url).
        models = {"vllm_model": {"base_url": [url + "/v1"], "model": "policy"}}
        gym_config = OmegaConf.create({"policy_model": {"responses_api_models": models}})
        client = server_utils.ServerClient(
            head_server_config=config_types.BaseServerConfig(host="127.0.0.1", port=11000),
            global_config_dict=gym_config,
        )
        config = HermesGymAgentConfig(
            name="hermes_agent",
            host="127.0.0.1",
            port=11001,
            entrypoint="app.py",
            tasks="hermes_tasks:task",
            model_server={"type": "responses_api_models", "name": "policy_model"},
        )
        agent = HermesGymAgent(config=config, server_client=client)
        app = agent.setup_webserver()
        async with (
            app.router.lifespan_context(app),
            open_asgi_transport(app) as transport,
            httpx.AsyncClient(transport=transport, base_url="http://gym") as http,
        ):
            answer = await http.post("/run", json={**BODY, "task_index": 3})
            refused = await http.post(
                "/run", json={"responses_create_params": {"input": "x", "tool_choice": "none"}}
            )
    assert answer.status_code == 200, answer.text
    verified = resources.BaseVerifyResponse.model_validate(answer.json())
    assert verified.reward == 1.0 and not verified.mask_sample
    assert_turns_match_wire(nemo_rl_turns(answer.json()["response"]), server.requests)
    assert refused.status_code == 422 and "tool_choice" in refused.json()["detail"]
