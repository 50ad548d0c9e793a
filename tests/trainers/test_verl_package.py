"""The verl agent loop, built and run as verl's AgentLoopWorker does, over a fake
server_manager whose TokenOutputs come from the scripted server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes_async.inference.hf import qwen_offline_hf_dir
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import RecordingFactory

from ..integrations.helpers import (
    assert_flat_matches_wire,
    make_tasks,
    scripted,
    vllm_client,
)
from .conftest import require

# verl imports Ray, which warns about its own module layout (not ours to fix).
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # verl's workers are asyncio actors


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The offline Qwen tokenizer as verl gets it (an HF tokenizer; built once: it is slow)."""
    transformers = require("transformers")
    directory = qwen_offline_hf_dir(str(tmp_path_factory.mktemp("tok")))
    return transformers.AutoTokenizer.from_pretrained(directory)


class FakeServerManager:
    """verl's LLMServerClient.generate over a token client: TokenOutput, stop_reason completed."""

    def __init__(self, client: Any, token_output: type) -> None:
        self.client, self.token_output, self.calls = client, token_output, []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict
    ) -> Any:
        from hermes_async.inference.generate import SamplingParams

        self.calls.append(dict(sampling_params))
        done = await self.client.generate(
            prompt_ids, SamplingParams(max_tokens=sampling_params["max_tokens"])
        )
        return self.token_output(
            token_ids=list(done.token_ids), log_probs=list(done.logprobs), stop_reason="completed"
        )


async def test_the_agent_loop_flattens_a_multi_turn_rollout_exactly(
    tmp_path: Path, hf: Any
) -> None:
    agent_loop = require("verl.experimental.agent_loop.agent_loop")
    replica = require("verl.workers.rollout.replica")
    from omegaconf import OmegaConf

    from hermes_async.integrations.verl import HermesAgentLoop

    assert agent_loop._agent_loop_registry["hermes_async"] == {
        "_target_": "hermes_async.integrations.verl.HermesAgentLoop"
    }
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"response_length": 2048, "prompt_length": 8192}},
            "data": {},
        }
    )
    factory = RecordingFactory(tmp_path / "sb")
    async with (
        scripted() as (server, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        manager_fake = FakeServerManager(client, replica.TokenOutput)
        loop = HermesAgentLoop(
            trainer_config=agent_loop.DictConfigWrap(config),
            server_manager=manager_fake,
            tokenizer=hf,
            processor=None,
            dataset_cls=None,
            data_config=agent_loop.DictConfigWrap(config.data),
            tasks=make_tasks(manager),
        )
        sampling = {
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "repetition_penalty": 1.0,
            "logprobs": False,
        }
        output = await loop.run(sampling, raw_prompt=[{"role": "user", "content": "x"}], index=0)
        assert manager.task_ids() == []
    assert factory.leftovers() == []
    assert isinstance(output, agent_loop.AgentLoopOutput) and output.reward_score == 1.0
    assert output.extra_fields["hermes_status"] == "completed"
    runs = assert_flat_matches_wire(
        output.prompt_ids,
        output.response_ids,
        output.response_mask,
        output.response_logprobs,
        server.requests,
    )
    assert runs == 3 and len(manager_fake.calls) == 3
    assert all(c["logprobs"] is True and c["repetition_penalty"] == 1.0 for c in manager_fake.calls)
    as_dict = output.as_dict()  # verl's own conversion to tensors
    assert as_dict["responses"].tolist() == output.response_ids


class DyingServerManager(FakeServerManager):
    """A server_manager whose Ray actor dies after its first answer (as a crashed replica)."""

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict
    ) -> Any:
        if self.calls:
            self.calls.append(dict(sampling_params))
            raise RuntimeError("The actor died unexpectedly before finishing this task.")
        return await super().generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params
        )


async def test_failures_are_untrained_outputs_and_bad_input_is_refused(
    tmp_path: Path, hf: Any
) -> None:
    agent_loop = require("verl.experimental.agent_loop.agent_loop")
    replica = require("verl.workers.rollout.replica")
    from omegaconf import OmegaConf

    from hermes_async.errors import ConfigError
    from hermes_async.integrations.verl import HermesAgentLoop

    from ..integrations.helpers import raising_reward

    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"response_length": 2048, "prompt_length": 8192}}}
    )
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": False}
    factory = RecordingFactory(tmp_path / "sb")
    prompt = {"raw_prompt": [{"role": "user", "content": "x"}], "index": 0}

    def loop(server_manager: Any, tasks: Any) -> Any:
        return HermesAgentLoop(
            trainer_config=agent_loop.DictConfigWrap(config),
            server_manager=server_manager,
            tokenizer=hf,
            processor=None,
            dataset_cls=None,
            data_config=agent_loop.DictConfigWrap(OmegaConf.create({})),
            tasks=tasks,
        )

    async with (
        scripted() as (_, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        dying = DyingServerManager(client, replica.TokenOutput)
        dead = await loop(dying, make_tasks(manager)).run(sampling, **prompt)
        healthy = FakeServerManager(client, replica.TokenOutput)
        broken = await loop(healthy, make_tasks(manager, reward=raising_reward)).run(
            sampling, **prompt
        )
        with pytest.raises(ConfigError, match="temperature"):
            await loop(healthy, make_tasks(manager)).run({**sampling, "temperature": -1}, **prompt)
        with pytest.raises(ConfigError, match="no tokenizer"):
            await loop(healthy, make_tasks(manager, tokenizer=None)).run(sampling, **prompt)
        assert manager.task_ids() == []
    assert factory.leftovers() == []
    for output in (dead, broken):
        assert isinstance(output, agent_loop.AgentLoopOutput)
        assert output.extra_fields["hermes_status"] == "failed" and output.reward_score == 0.0
        assert not any(output.response_mask)
        output.as_dict()  # verl still takes it
    assert "actor died" in dead.extra_fields["hermes_failure"]["message"]
    assert "the verifier broke" in broken.extra_fields["hermes_failure"]["message"]


def test_the_verl_example_runs() -> None:
    """examples/trainers/verl_example.py, as docs/trainers/verl.md tells to run it."""
    require("verl.experimental.agent_loop.agent_loop")
    from ..integrations.test_trainer_examples import run_example

    out = run_example("verl_example.py")
    assert out["reward"] == 1.0 and out["status"] == "completed"
    assert 0 < out["sampled_tokens"] < out["response_tokens"]
