"""Trainer adapters end to end against a real CPU vLLM: the NeMo Gym agent and the SkyRL generator.

Each rollout makes two tool calls forced by ``structured_outputs`` (as in
``test_vllm_multiturn``) and a short answer. What vLLM streamed is recorded at the HTTP level and
parsed here, apart from our clients; what the trainer receives must be exactly those ids and
bit-equal logprobs: the Gym response's per-turn items (each prompt extending the last), and
SkyRL's flat rows (mask 1 exactly on sampled ids, 0.0 logprobs elsewhere).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hermes_async.agent import AgentOptions, AgentResult, RolloutSetup, RolloutTask, ToolContext
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.integrations.nemo_gym import GymAgent
from hermes_async.integrations.skyrl import HermesGenerator
from tests.integration.test_vllm_multiturn import (
    OPTIONS,
    TOOL_CALL_REGEX,
    RecordingTransport,
    _per_turn,
    _registry,
    streamed,
)
from tests.integrations.helpers import assert_flat_matches_wire, assert_turns_match_wire
from tests.integrations.test_nemo_gym import nemo_rl_turns

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


async def _two_calls_made(result: AgentResult, ctx: ToolContext) -> float:
    return 1.0 if sum(1 for m in result.messages if m.get("role") == "tool") == 2 else 0.0


def _tasks(tokenizer: Tokenizer) -> Any:
    registry = _registry()

    def task(item: Any) -> RolloutTask:
        return RolloutTask(
            [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "List the files."},
            ],
            registry.definitions(["terminal"]),
            RolloutSetup(reward=_two_calls_made, tokenizer=tokenizer, registry=registry),
            AgentOptions(
                max_turns=3,
                max_tokens=96,
                extra_body={"structured_outputs": {"regex": TOOL_CALL_REGEX}},
                sampling_hook=_per_turn,
            ),
        )

    return task


def _served(transport: RecordingTransport) -> list[SimpleNamespace]:
    """Each request's prompt and what vLLM streamed for it, parsed from the raw bytes."""
    served = []
    for body, raw in transport.exchanges:
        ids, logprobs, _ = streamed(bytes(raw), "vllm")
        served.append(
            SimpleNamespace(prompt_ids=body["token_ids"], completion_ids=ids, logprobs=logprobs)
        )
    return served


async def test_the_gym_agent_returns_what_vllm_streamed(
    vllm_url: str, served_tokenizer: Tokenizer
) -> None:
    transport = RecordingTransport()
    body = {"responses_create_params": {"input": "List the files.", "temperature": 1.0}}
    async with VLLMGenerateClient(vllm_url, options=OPTIONS, transport=transport) as client:
        result = await GymAgent(_tasks(served_tokenizer), client).run(body)
    assert result["reward"] == 1.0 and result["mask_sample"] is False, result.get("failure_reason")
    turns = nemo_rl_turns(result["response"])
    assert len(turns) == 3 == len(transport.exchanges)
    assert_turns_match_wire(turns, _served(transport))
    kinds = [item["type"] for item in result["response"]["output"]]
    assert kinds.count("function_call") == 2 and kinds.count("function_call_output") == 2
    # The request's temperature reached vLLM on every turn.
    assert all(b["sampling_params"]["temperature"] == 1.0 for b, _ in transport.exchanges)


async def test_the_skyrl_generator_rows_are_what_vllm_streamed(
    vllm_url: str, served_tokenizer: Tokenizer
) -> None:
    transport = RecordingTransport()
    ids = [SimpleNamespace(instance_id="a", repetition_id=r) for r in range(2)]
    batch = {
        "prompts": [[{"role": "user", "content": "List the files."}]] * 2,
        "env_classes": ["hermes"] * 2,
        "env_extras": [{}] * 2,
        "sampling_params": {"max_generate_length": 96, "temperature": 1.0, "top_k": 0},
        "trajectory_ids": ids,
        "batch_metadata": None,
    }
    async with VLLMGenerateClient(vllm_url, options=OPTIONS, transport=transport) as client:
        out = await HermesGenerator(_tasks(served_tokenizer), client).generate(batch)
    assert out["stop_reasons"] == ["stop"] * 2 and out["rewards"] == [1.0] * 2
    served = _served(transport)
    assert len(served) == 6
    for i in range(2):
        runs = assert_flat_matches_wire(
            out["prompt_token_ids"][i],
            out["response_ids"][i],
            out["loss_masks"][i],
            out["rollout_logprobs"][i],
            served,
        )
        assert runs == 3
    # SkyRL's top_k 0 ("no cut-off") went out as vLLM's -1.
    assert all(b["sampling_params"]["top_k"] == -1 for b, _ in transport.exchanges)
