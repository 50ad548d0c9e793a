"""verl: the hermes_async agent loop on one sample, built as verl's AgentLoopWorker builds it,
over a ``server_manager`` that answers from the scripted model.

Run in a venv with verl (scripts/trainers/setup_venv.sh verl; then .venv-verl/bin/python
examples/trainers/verl_example.py). In training, verl's own server_manager is the model.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

import anyio
from hermes_tasks import TOKENIZER, scripted_model, task
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

from hermes_async.inference.generate import SamplingParams, VLLMGenerateClient
from hermes_async.inference.hf import qwen_offline_hf_dir
from hermes_async.integrations.verl import HermesAgentLoop


class ScriptedServerManager:
    """verl's ``server_manager.generate`` over a token client (verl's is a Ray actor)."""

    def __init__(self, client: VLLMGenerateClient) -> None:
        self.client = client

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> TokenOutput:
        done = await self.client.generate(
            prompt_ids, SamplingParams(max_tokens=sampling_params["max_tokens"])
        )
        return TokenOutput(
            token_ids=list(done.token_ids), log_probs=list(done.logprobs), stop_reason="completed"
        )


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(qwen_offline_hf_dir(tmp))
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"response_length": 4096, "prompt_length": 8192}}}
    )
    async with (
        scripted_model() as (_, url),
        VLLMGenerateClient(url, vocab_size=len(TOKENIZER)) as client,
    ):
        loop = HermesAgentLoop(  # what AgentLoopWorker passes, plus the entry's `tasks`
            trainer_config=DictConfigWrap(config),
            server_manager=ScriptedServerManager(client),
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(OmegaConf.create({})),
            tasks=task,
        )
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": False}
        prompt = [{"role": "user", "content": "Put 42 in ~/answer.txt"}]
        output = await loop.run(sampling, raw_prompt=prompt, index=0)
    print(
        json.dumps(
            {
                "reward": output.reward_score,
                "status": output.extra_fields["hermes_status"],
                "prompt_tokens": len(output.prompt_ids),
                "response_tokens": len(output.response_ids),
                "sampled_tokens": sum(output.response_mask),
            }
        )
    )


if __name__ == "__main__":
    anyio.run(main)
